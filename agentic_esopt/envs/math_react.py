"""A math agent in a ReAct loop with one sandboxed tool (the reference's protocol).

Each turn the agent either calls the tool, writing ``Action:`` and then a JSON object
``{"name": "bash", "arguments": {"command": "..."}}`` (or ``{"name": "python",
"arguments": {"code": "..."}}``), or ends the episode with ``Final answer: \\boxed{...}``.
Generation stops at ``Observation:`` (``TaskSource.stop``), so the agent never writes the
tool's result itself. The command runs in a ``sandbox.Workspace`` (own process group,
resource limits, unprivileged uid, no network, a wall-clock kill of everything it
started), one working directory per episode, removed by ``close``. The observation is
``Observation from bash:`` and the command's stdout, ``[stderr]`` and its stderr (when
there is any), and ``[exit_code] N``, cut to ``observation_chars`` keeping both ends.

Parsing is tolerant of the ways small models mangle JSON (code fences, trailing text,
single quotes, missing closing braces, unescaped quotes); a reply with neither a tool call
nor a final answer gets a format warning, an unknown tool an error, and nothing the agent
writes raises. Reward, on the final step: 1 iff the tool ran at least once and the last
``\\boxed{}`` of the final answer equals the task's answer (``math-verify``, then a
normalised exact match with 1e-8 numeric tolerance); 0 otherwise, also when the turn
limit ends the episode first.

The ``code`` protocol shapes the task for small models (as the Sudoku default lists the
legal moves): a fenced code block is a tool call, each observation ends by asking for the
final answer, and a reply without a tool call is the final answer, read leniently (a box,
else the number after "answer", else the reply's last number). The reward is the same.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import json
import os
import re
import shlex
import threading
from fractions import Fraction
from typing import Any

from agentic_esopt import options as options_lib
from agentic_esopt import sandbox
from agentic_esopt.envs import base, math_data
from agentic_esopt.envs.base import StepResult
from agentic_esopt.envs.math_data import MathTask

TOOLS = ("bash", "python")
# Tool -> the argument that holds its input.
TOOL_ARGUMENT = {"bash": "command", "python": "code"}
STOP = ("Observation:",)
PROTOCOLS = ("react", "code")
# Under the code protocol a reply also ends after its code block's closing fence.
CODE_STOP = (*STOP, "\n```\n")
MAX_ACTION_CHARS = 100_000
NUMERIC_TOLERANCE = 1e-8

SYSTEM_PROMPT = """\
You are a math agent. You solve a math problem step by step in a loop: think, call a \
tool to compute, read the observation it returns, and repeat until you are sure of the \
answer.

You have one tool, bash. It runs a shell command in a sandbox (no network; python3 with \
its standard library is installed) and returns the command's output.
To call it, write a line that starts with "Action:" followed by a JSON object, then stop \
and wait for the observation:
Action: {"name": "bash", "arguments": {"command": "python3 -c \\"print(2**10)\\""}}
You may also run Python code directly:
Action: {"name": "python", "arguments": {"code": "print(2**10)"}}
Call one tool per reply. The result comes back in a message that starts with \
"Observation from bash:".

When you know the answer, reply with your final answer in this form and nothing after it:
Final answer: \\boxed{ANSWER}"""

CODE_SYSTEM_PROMPT = """\
You are a math agent with a Python tool. To compute something, reply with only a Python \
code block, for example:
```python
print(12 * 34)
```
The tool runs it and returns the output. Then reply with the final answer, for example:
Final answer: 408"""
CODE_ANSWER_REQUEST = "\n\nWhat is the final answer? Reply in words, not code."

HINTS = ("none", "format", "command")
FORMAT_HINT = """

Example of a tool call, to compute 12 * 34:
Action: {"name": "bash", "arguments": {"command": "python3 -c \\"print(12 * 34)\\""}}
After the observation, answer like this:
Final answer: \\boxed{408}"""
COMMAND_HINT = """

Hint: first call the tool exactly like this:
Action: {action}
Then read the number in the observation and reply with:
Final answer: \\boxed{{NUMBER}}"""


def user_message(task: MathTask, hint: str = "none", protocol: str = "react") -> str:
    """The first observation: the problem and the rule that the tool must be used.

    ``hint``: "format" adds a worked example of the action and answer format; "command"
    adds the exact tool call that computes an easy problem's expression (the "format"
    example for problems without one). Under the ``code`` protocol the system prompt holds
    the example, and "command" gives the code block.
    """
    if protocol == "code":
        if hint == "command" and task.expression:
            return (f"Problem: {task.question}\nReply with this code block to compute it:\n"
                    f"```python\nprint({task.expression})\n```")
        return f"Problem: {task.question}\nUse the Python tool first."
    message = (f"Problem: {task.question}\n\nYou must use the bash tool at least once "
               "before you give the final answer.")
    if hint == "command" and task.expression:
        command = f'python3 -c "print({task.expression})"'
        call = json.dumps({"name": "bash", "arguments": {"command": command}})
        return message + COMMAND_HINT.format(action=call)
    return message + (FORMAT_HINT if hint in ("format", "command") else "")


# ----------------------------------------------------------------------------- parsing


@dataclasses.dataclass(frozen=True)
class ToolCall:
    """A tool call: ``name`` (lower-cased) and its ``arguments`` object."""

    name: str
    arguments: dict


@dataclasses.dataclass(frozen=True)
class FinalAnswer:
    """A final answer: the content of its last ``\\boxed{}``."""

    boxed: str


@dataclasses.dataclass(frozen=True)
class FormatError:
    """Why nothing could be read from a reply; shown to the agent."""

    reason: str


_ACTION = re.compile(r"\baction\s*(?:\*\*)?\s*:", re.IGNORECASE)
_FINAL = re.compile(r"final\s+answer", re.IGNORECASE)
_FENCE = re.compile(r"```[a-zA-Z]*")
_NAME = re.compile(r"""["']?name["']?\s*[:=]\s*["']([A-Za-z_][\w.-]*)["']""")
_STRING_FIELD = r"""["']?{key}["']?\s*:\s*(?:"((?:[^"\\]|\\.)*)"?|'((?:[^'\\]|\\.)*)'?)"""


def _close_json(text: str) -> str:
    """``text`` with an open string and unclosed brackets closed (a truncated object)."""
    stack, in_string, escaped = [], False, False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "{[":
            stack.append("}" if char == "{" else "]")
        elif char in "}]" and stack and stack[-1] == char:
            stack.pop()
    return text + ('"' if in_string else "") + "".join(reversed(stack))


def _loads_object(text: str) -> Any:
    """The first JSON/Python object literal at the start of ``text``, or None."""
    decoder = json.JSONDecoder(strict=False)
    attempts = (
        lambda: decoder.raw_decode(text)[0],
        lambda: json.loads(_close_json(text), strict=False),
        lambda: ast.literal_eval(text),
        lambda: ast.literal_eval(_close_json(text)),
    )
    for attempt in attempts:
        try:
            value = attempt()
        except (ValueError, SyntaxError, TypeError, RecursionError, MemoryError):
            continue
        if isinstance(value, dict):
            return value
    # Trailing text after a Python literal: cut at each closing brace from the end.
    for end in [m.end() for m in re.finditer(r"\}", text)][::-1][:20]:
        try:
            value = ast.literal_eval(text[:end])
        except (ValueError, SyntaxError, TypeError, RecursionError, MemoryError):
            continue
        if isinstance(value, dict):
            return value
    return None


def _unescape(raw: str) -> str:
    try:
        return json.loads(f'"{raw}"', strict=False)
    except ValueError:
        return raw


def _regex_call(text: str) -> dict | None:
    """A call read field by field, for JSON too broken to decode (unescaped quotes...)."""
    name = _NAME.search(text)
    if not name:
        return None
    arguments = {}
    for key in ("command", "code", "cmd"):
        match = re.search(_STRING_FIELD.format(key=key), text, re.DOTALL)
        if match:
            raw = match.group(1) if match.group(1) is not None else match.group(2)
            # A greedy read up to the last quote before the closing braces, when the model
            # left inner double quotes unescaped: "command": "python3 -c "print(1)""
            greedy = re.compile(rf"""["']?{key}["']?\s*:\s*"(.*)"\s*\}}""",
                                re.DOTALL).match(text, match.start())  # one anchored try
            if greedy and len(greedy.group(1)) > len(raw):
                raw = greedy.group(1)
            arguments[key] = _unescape(raw)
    return {"name": name.group(1), "arguments": arguments}


def _as_call(value: dict) -> ToolCall | FormatError:
    """A ``ToolCall`` from a decoded object (tolerating a few common shapes)."""
    name = value.get("name", value.get("tool"))
    if not isinstance(name, str) or not name.strip():
        return FormatError('the action has no "name" (it must be "bash" or "python")')
    arguments = value.get("arguments", value.get("args", value.get("parameters")))
    if isinstance(arguments, str):
        decoded = _loads_object(arguments.strip())
        arguments = decoded if decoded is not None else {TOOL_ARGUMENT.get(
            name.strip().lower(), "command"): arguments}
    if arguments is None:  # flattened: {"name": "bash", "command": "..."}
        arguments = {k: v for k, v in value.items() if k not in ("name", "tool")}
    if not isinstance(arguments, dict):
        return FormatError('"arguments" must be a JSON object')
    return ToolCall(name.strip().lower(), arguments)


def _parse_action(text: str) -> ToolCall | FormatError:
    """The tool call written after an ``Action:`` marker (``text`` starts after it)."""
    text = _FENCE.sub("", text[:MAX_ACTION_CHARS]).strip()
    brace = text.find("{")
    if brace < 0:
        return FormatError('"Action:" must be followed by a JSON object such as '
                           '{"name": "bash", "arguments": {"command": "..."}}')
    value = _loads_object(text[brace:])
    if value is None:
        value = _regex_call(text[brace:])
    if value is None:
        return FormatError("the JSON object after \"Action:\" could not be read")
    return _as_call(value)


def last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` (or ``\\fbox{...}``) in ``text``, or None.

    Braces are matched, so ``\\boxed{\\frac{1}{2}}`` gives ``\\frac{1}{2}``; an unclosed
    box takes the rest of the text.
    """
    starts = [m.end() for m in re.finditer(r"\\(?:boxed|fbox)\s*\{", text)]
    if not starts:
        return None
    start, depth = starts[-1], 1
    for i in range(start, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[start:i].strip()
    return text[start:].strip()


def parse_reply(text: str) -> ToolCall | FinalAnswer | FormatError:
    """Reads one reply: a tool call, a final answer, or why it is neither.

    A tool call is read from the first ``Action:`` marker that precedes any "Final answer"
    (the agent has not seen the result yet); otherwise a reply with a ``\\boxed{}`` is a
    final answer, its last box being the answer. Never raises.
    """
    if not isinstance(text, str):
        return FormatError(f"expected text, got {type(text).__name__}")
    final = _FINAL.search(text)
    actions = [m for m in _ACTION.finditer(text) if final is None or m.start() < final.start()]
    error = None
    for marker in actions[:5]:
        call = _parse_action(text[marker.end():])
        if isinstance(call, ToolCall):
            return call
        error = error or call
    boxed = last_boxed(text[final.start():] if final else text)
    if boxed is None and final:
        boxed = last_boxed(text)
    if boxed is not None:
        return FinalAnswer(boxed)
    if error is not None:
        return error
    if final:
        return FormatError("the final answer must be written as Final answer: \\boxed{...}")
    return FormatError('no tool call and no final answer; call the tool with Action: '
                       '{"name": "bash", "arguments": {"command": "..."}} or answer with '
                       'Final answer: \\boxed{...}')


_CODE_BLOCK = re.compile(r"```[ \t]*(python3?|py|bash|sh|shell)?[ \t]*\n(.*?)(?:```|$)",
                         re.DOTALL | re.IGNORECASE)
_NUMBER = r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?"
_ANSWER_NUMBER = re.compile(rf"answer\b\D{{0,20}}?({_NUMBER})", re.IGNORECASE)


def parse_code_reply(text: str) -> ToolCall | FinalAnswer | FormatError:
    """Reads one reply under the ``code`` protocol; never raises.

    The first fenced code block is a tool call (``bash``/``sh`` fences run in bash, any
    other in Python); then whatever ``parse_reply`` reads; otherwise the reply is a final
    answer: the number after "answer", else the reply's last number.
    """
    if not isinstance(text, str):
        return FormatError(f"expected text, got {type(text).__name__}")
    block = _CODE_BLOCK.search(text[:MAX_ACTION_CHARS])
    if block and block.group(2).strip():
        tool = "bash" if (block.group(1) or "").lower() in ("bash", "sh", "shell") else "python"
        return ToolCall(tool, {TOOL_ARGUMENT[tool]: block.group(2).strip()})
    parsed = parse_reply(text)
    if not isinstance(parsed, FormatError):
        return parsed
    answer = _ANSWER_NUMBER.search(text)
    numbers = re.findall(_NUMBER, text[-MAX_ACTION_CHARS:])
    if answer or numbers:
        return FinalAnswer(answer.group(1) if answer else numbers[-1])
    return FormatError("no code block and no final answer; compute with a ```python code "
                       "block, or answer with Final answer: NUMBER")


# ----------------------------------------------------------------------------- reward

_TEXT_WRAPPERS = re.compile(r"\\(?:text|textbf|mathrm|mbox|operatorname)\s*\{([^{}]*)\}")
_FRAC = re.compile(r"^(-?)\\[dt]?frac\{(-?\d+)\}\{(-?\d+)\}$")


def normalize_answer(text: str) -> str:
    """A canonical form for exact matching: no spaces, $, \\left/\\right, thousands
    commas, units wrappers or trailing period; ``\\dfrac`` is ``\\frac``."""
    text = str(text).strip()
    inner = last_boxed(text)
    text = inner if inner is not None else text
    text = _TEXT_WRAPPERS.sub(r"\1", text)
    for old, new in (("{,}", ","), ("\\left", ""), ("\\right", ""), ("\\!", ""),
                     ("\\,", ""), ("\\ ", ""), ("\\dfrac", "\\frac"),
                     ("\\tfrac", "\\frac"), ("$", ""), ("^{\\circ}", ""), ("^\\circ", "")):
        text = text.replace(old, new)
    text = re.sub(r"\s+", "", text)
    text = re.sub(r"(?<=\d),(?=\d{3}(?!\d))", "", text)
    return text.rstrip(".").lower()


def _as_number(text: str) -> Fraction | float | None:
    """An integer, decimal, ``p/q`` or ``\\frac{p}{q}`` as an exact number when possible."""
    match = _FRAC.match(text)
    if match:
        sign, p, q = match.groups()
        text = f"{sign}{p}/{q}"
    if len(text) > 1000:
        return None
    try:
        if re.fullmatch(r"[-+]?\d+/[-+]?\d+", text):
            return Fraction(text) if int(text.split("/")[1]) else None
        if re.fullmatch(r"[-+]?(\d+\.?\d*|\.\d+)", text):
            return Fraction(text)
        if re.fullmatch(r"[-+]?(\d+\.?\d*|\.\d+)e[-+]?\d{1,3}", text):
            return float(text)
    except (ValueError, ZeroDivisionError, OverflowError):
        return None
    return None


def exact_match(predicted: str, expected: str) -> bool:
    """Normalised exact match; numbers (exact when rational) within 1e-8 of each other."""
    a, b = normalize_answer(predicted), normalize_answer(expected)
    if a == b:
        return bool(a)
    x, y = _as_number(a), _as_number(b)
    if x is None or y is None:
        return False
    try:
        return abs(x - y) <= NUMERIC_TOLERANCE
    except (OverflowError, TypeError):
        return x == y


@functools.lru_cache(maxsize=1)
def _math_verify():
    try:
        import math_verify  # pylint: disable=import-outside-toplevel
    except ImportError:
        return None
    return math_verify


def math_verify_match(predicted: str, expected: str) -> bool:
    """``math_verify.verify(expected, predicted)`` on boxed forms; False on any failure.

    Its timeouts use SIGALRM, which only the main thread may set: elsewhere they are off.
    """
    module = _math_verify()
    if module is None or len(predicted) > 1000:
        return False
    timeout = 5 if threading.current_thread() is threading.main_thread() else None
    try:
        gold = module.parse(f"\\boxed{{{expected}}}", parsing_timeout=timeout)
        guess = module.parse(f"\\boxed{{{predicted}}}", parsing_timeout=timeout)
        return bool(gold and guess and module.verify(gold, guess, timeout_seconds=timeout))
    except Exception:  # pylint: disable=broad-except  # sympy can fail in many ways.
        return False


def answers_match(predicted: str, expected: str) -> bool:
    """Whether ``predicted`` (a box's content) is ``expected``: math-verify, then exact."""
    if not isinstance(predicted, str) or not predicted.strip():
        return False
    return math_verify_match(predicted, expected) or exact_match(predicted, expected)


# ----------------------------------------------------------------------------- environment


def cut_middle(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` characters, keeping its start and its end."""
    if len(text) <= limit:
        return text
    marker = "\n[... {} characters cut ...]\n"
    keep = max(0, limit - len(marker.format(len(text))))
    head, tail = keep - keep // 2, keep // 2
    cut = marker.format(len(text) - head - tail)
    return (text[:head] + cut + (text[-tail:] if tail else ""))[:limit]


def format_observation(tool: str, result: sandbox.CommandResult, limit: int,
                       timeout_s: float) -> str:
    """``Observation from TOOL:`` + stdout, ``[stderr]`` + stderr, ``[exit_code] N``."""
    parts = [result.stdout.rstrip("\n")]
    if result.stderr.strip():
        parts += ["[stderr]", result.stderr.rstrip("\n")]
    if result.error:
        parts.append(f"[error] {result.error}")
    if result.timed_out:
        parts.append(f"[timeout] killed after {timeout_s:g} s")
    if result.output_exceeded:
        parts.append("[output] too much output; the command was killed")
    if result.disk_exceeded:
        parts.append("[disk] the working directory grew too large; the command was killed "
                     "and its files deleted")
    parts.append(f"[exit_code] {result.exit_code}")
    body = "\n".join(p for p in parts if p)
    header = f"Observation from {tool}:\n"
    return header + cut_middle(body, max(0, limit - len(header)))


@dataclasses.dataclass(frozen=True)
class ToolLimits:
    """Sandbox limits of one tool call (see ``sandbox.Workspace.run``)."""

    timeout_s: float = 20.0
    memory_mb: int = 1024
    max_output_bytes: int = 1 << 20
    max_processes: int = 32
    max_disk_mb: int = 256


class MathReactEnv:
    """One episode of ``math_react`` (see the module docstring)."""

    def __init__(self, max_turns: int = 50, observation_chars: int = 6000,
                 limits: ToolLimits = ToolLimits(), hint: str = "none",
                 protocol: str = "react"):
        self.turn_limit_default = max_turns
        self.observation_chars = observation_chars
        self.limits = limits
        self.hint = hint
        self.protocol = protocol
        self._task: MathTask | None = None
        self._workspace: sandbox.Workspace | None = None
        self._turn = 0
        self._turn_limit = max_turns
        self._tool_calls = 0
        self._done = False

    def reset(self, task: MathTask, *, max_turns: int | None = None) -> str:
        """Starts ``task``; returns the user message (the problem and the tool rule)."""
        if not isinstance(task, MathTask):
            raise TypeError(f"MathReactEnv needs a MathTask, got {type(task).__name__}")
        if max_turns is not None and max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        self.close()
        self._task = task
        self._turn = 0
        self._turn_limit = self.turn_limit_default if max_turns is None else min(
            self.turn_limit_default, max_turns)
        self._tool_calls = 0
        self._done = False
        return user_message(task, self.hint, self.protocol)

    @property
    def tool_calls(self) -> int:
        """Tool calls that ran in this episode."""
        return self._tool_calls

    def step(self, action_text: str) -> StepResult:
        """Runs the tool call, or scores the final answer, or returns a format warning."""
        if self._task is None or self._done:
            raise RuntimeError("step() called on an episode that was not reset or has ended")
        self._turn += 1
        parsed = (parse_code_reply if self.protocol == "code" else parse_reply)(action_text)
        info: dict[str, Any] = {"turn": self._turn, "tool_calls": self._tool_calls}
        if isinstance(parsed, FinalAnswer):
            return self._finish(parsed.boxed, info)
        if isinstance(parsed, ToolCall):
            observation, info["event"] = self._run_tool(parsed)
        else:
            observation, info["event"] = f"Format warning: {parsed.reason}.", "format_error"
        info["tool_calls"] = self._tool_calls
        if self._turn >= self._turn_limit:
            self._done = True
            self.close()
            info.update(solved=False, reason="turn limit")
            return StepResult(observation + "\n\nNo turns left.", 0.0, True, info)
        return StepResult(observation, 0.0, False, info)

    def _finish(self, boxed: str, info: dict[str, Any]) -> StepResult:
        self._done = True
        self.close()
        if not self._tool_calls:
            solved, reason = False, "the tool was never used"
        else:
            solved = answers_match(boxed, self._task.answer)
            reason = "correct" if solved else "wrong answer"
        info.update(event="final_answer", answer=boxed[:1000], solved=solved, reason=reason)
        message = ("Correct." if solved else
                   "The tool was never used, so the answer does not count."
                   if not self._tool_calls else "The answer is wrong.")
        return StepResult(f"Final answer received. {message}", float(solved), True, info)

    def _run_tool(self, call: ToolCall) -> tuple[str, str]:
        """(observation, event) of one tool call."""
        if call.name not in TOOLS:
            return (f"Error: unknown tool {call.name[:100]!r}; the tools are "
                    f"{', '.join(TOOLS)}.", "unknown_tool")
        key = TOOL_ARGUMENT[call.name]
        value = call.arguments.get(key)
        if value is None and call.name == "bash":
            value = call.arguments.get("cmd", call.arguments.get("code"))
        if value is None and call.name == "python":
            value = call.arguments.get("command")
        if not isinstance(value, str) or not value.strip():
            return (f'Error: {call.name} needs "arguments": {{"{key}": "..."}} with a '
                    "non-empty string.", "bad_arguments")
        if len(value) > MAX_ACTION_CHARS:
            return f"Error: the {key} is longer than {MAX_ACTION_CHARS} characters.", \
                "bad_arguments"
        command = value if call.name == "bash" else f"python3 -c {shlex.quote(value)}"
        if "\0" in command:
            return f"Error: the {key} contains a NUL character.", "bad_arguments"
        if self._workspace is None:
            self._workspace = sandbox.Workspace(prefix="math_react_")
        limits = self.limits
        result = self._workspace.run(command, timeout_s=limits.timeout_s,
                                     memory_mb=limits.memory_mb,
                                     max_output_bytes=limits.max_output_bytes,
                                     max_processes=limits.max_processes,
                                     max_disk_mb=limits.max_disk_mb)
        self._tool_calls += 1
        request = CODE_ANSWER_REQUEST if self.protocol == "code" else ""
        observation = format_observation(call.name, result,
                                         self.observation_chars - len(request),
                                         limits.timeout_s)
        return observation + request, "tool"

    def close(self) -> None:
        """Removes the episode's working directory and whatever the tool left running."""
        if self._workspace is not None:
            self._workspace.close()
            self._workspace = None


# ----------------------------------------------------------------------------- task source


@dataclasses.dataclass(frozen=True)
class Options:
    """``math_react`` settings (``envs.make("math_react", **options)``)."""

    difficulty: str = options_lib.field("standard", "Generated problems: 'standard' "
                                                    "(answers need computation) or 'easy' "
                                                    "(one-line arithmetic, for tiny models).")
    families: tuple[str, ...] = options_lib.field((), "Generated families to draw from "
                                                      "(empty: all of the difficulty's).")
    data: str | None = options_lib.field(None, "A JSONL file of {id, question, answer} to "
                                               "play instead of generated problems; split "
                                               "into train / eval / test by a hash of the id.")
    eval_data: str | None = options_lib.field(None, "A JSONL file of held-out problems (with "
                                                    "data: all of data trains; eval and "
                                                    "test both come from this file).")
    heldout_fraction: float = options_lib.field(0.2, "With data alone: the fraction of it "
                                                     "held out for each of eval and test.")
    strip_answer_instructions: bool = options_lib.field(True, "Remove DAPO's 'Answer: "
                                                              "$Answer' instructions from "
                                                              "loaded questions.")
    hint: str = options_lib.field("none", "'format': the user message shows a worked "
                                          "example of the action and answer format; "
                                          "'command': the exact tool call for an easy "
                                          "problem (the format example otherwise).")
    protocol: str = options_lib.field("react", "'react': the reference's JSON actions and "
                                               "boxed answers; 'code': shaped for small "
                                               "models (code blocks are tool calls, "
                                               "answers are read leniently).")
    max_turns: int = options_lib.field(50, "Turns per episode (every reply counts).")
    observation_chars: int = options_lib.field(6000, "Longest observation; longer ones keep "
                                                     "their start and end.")
    tool_timeout_s: float = options_lib.field(20.0, "Wall-clock limit of one tool call; then "
                                                    "everything it started is killed.")
    tool_memory_mb: int = options_lib.field(1024, "Address-space limit per tool process.")
    tool_max_processes: int = options_lib.field(32, "Processes (and threads) one episode's "
                                                    "tool may run at once.")
    tool_max_disk_mb: int = options_lib.field(256, "Size cap of an episode's working "
                                                   "directory (beyond it the command is "
                                                   "killed and the directory emptied).")

    def problems(self) -> list[str]:
        problems = []
        check = options_lib.checker(problems)
        check(self.difficulty in math_data.DIFFICULTIES, f"difficulty must be one of "
              f"{math_data.DIFFICULTIES}, got {self.difficulty!r}")
        if self.difficulty in math_data.FAMILIES:
            unknown = sorted(set(self.families) - set(math_data.FAMILIES[self.difficulty]))
            check(not unknown, f"families {unknown} are not {self.difficulty} families; "
                               f"choose from {sorted(math_data.FAMILIES[self.difficulty])}")
        check(self.hint in HINTS, f"hint must be one of {HINTS}, got {self.hint!r}")
        check(self.protocol in PROTOCOLS,
              f"protocol must be one of {PROTOCOLS}, got {self.protocol!r}")
        check(self.max_turns >= 1, f"max_turns must be >= 1, got {self.max_turns}")
        check(self.observation_chars >= 200,
              f"observation_chars must be >= 200, got {self.observation_chars}")
        check(self.tool_timeout_s > 0, f"tool_timeout_s must be > 0, got {self.tool_timeout_s}")
        check(self.tool_memory_mb >= 64,
              f"tool_memory_mb must be >= 64, got {self.tool_memory_mb}")
        check(self.tool_max_processes >= 1,
              f"tool_max_processes must be >= 1, got {self.tool_max_processes}")
        check(self.tool_max_disk_mb >= 1,
              f"tool_max_disk_mb must be >= 1, got {self.tool_max_disk_mb}")
        check(0 < self.heldout_fraction < 0.5,
              f"heldout_fraction must be in (0, 0.5), got {self.heldout_fraction}")
        for name in ("data", "eval_data"):
            path = getattr(self, name)
            check(path is None or os.path.isfile(path), f"{name} {path!r} is not a file")
        check(self.eval_data is None or self.data is not None,
              "eval_data needs data (the training problems)")
        return problems


def _file_splits(options: Options) -> dict[str, list[MathTask]]:
    strip = options.strip_answer_instructions
    loaded = math_data.load_jsonl(options.data, strip)
    if options.eval_data is None:
        return math_data.split_rows(loaded, options.heldout_fraction)
    held = math_data.load_jsonl(options.eval_data, strip)
    held_questions = {t.question.strip() for t in held}
    held_ids = {t.id for t in held}
    train = [t for t in loaded if t.question.strip() not in held_questions
             and t.id not in held_ids]
    return {"train": train, "eval": held, "test": held}


def make_source(options: Options, splits: base.Splits) -> base.TaskSource:
    """The task source: generated problems (hash-split) or a JSONL file's."""
    if options.data is not None:
        by_split = _file_splits(options)
        pool, eval_tasks = by_split["train"], by_split[splits.eval_split][:splits.eval_size]
        if len(pool) < splits.tasks_per_generation:
            raise ValueError(f"{options.data}: {len(pool)} training problems, fewer than "
                             f"tasks_per_generation={splits.tasks_per_generation}")
        if not eval_tasks:
            raise ValueError(f"{options.data}: no problems in the {splits.eval_split} split")

        def train_tasks(generation: int) -> list[MathTask]:
            return base.sample_generation_tasks(pool, splits.tasks_per_generation,
                                                splits.seed, generation)
    else:
        eval_tasks = math_data.generate_problems(splits.eval_size, splits.seed,
                                                 splits.eval_split, options.difficulty,
                                                 options.families)

        def train_tasks(generation: int) -> list[MathTask]:
            return math_data.generate_problems(
                splits.tasks_per_generation, base.generation_seed(splits.seed, generation),
                "train", options.difficulty, options.families)

    train_tasks(0)  # Fails now, before any compute, if the setting cannot make tasks.
    code = options.protocol == "code"
    limits = ToolLimits(timeout_s=options.tool_timeout_s, memory_mb=options.tool_memory_mb,
                        max_processes=options.tool_max_processes,
                        max_disk_mb=options.tool_max_disk_mb)
    return base.TaskSource(
        env_factory=functools.partial(MathReactEnv, max_turns=options.max_turns,
                                      observation_chars=options.observation_chars,
                                      limits=limits, hint=options.hint,
                                      protocol=options.protocol),
        system_prompt=CODE_SYSTEM_PROMPT if code else SYSTEM_PROMPT,
        train_tasks=train_tasks, eval_tasks=eval_tasks, stop=CODE_STOP if code else STOP)
