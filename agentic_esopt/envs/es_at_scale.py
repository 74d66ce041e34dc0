"""ES at Scale's Countdown prompt and reward (Qiu et al. 2025, "Evolution Strategies at
Scale: LLM Fine-Tuning Beyond Reinforcement Learning", github.com/VsonicV/es-fine-tuning-paper).

Their prompt is plain text, no chat template: ``SYSTEM + user_text(numbers, target) +
REPLY_PREFIX`` is each entry's ``context`` in their ``countdown/data/countdown.json``, and
their trainer (``es_at_scale/train.py``: ``countdown_template`` passes it through) feeds it
to the model as is. The prompt ends in ``<think>``, so the model's completion continues
the thought.

Their reward (``countdown/countdown_task.py``, ``es_at_scale/reward_function/
countdown_grader.py``): ``0.1 * format + answer``, in [0, 1.1], where

* format is scored on ``"<think>" + completion``: 1.0 when the whole text is
  ``<think>...</think>\\n<answer>...</answer>`` (an optional final newline allowed, as
  Python's ``$``), else 0.1 if a ``<think>...</think>`` occurs plus 0.5 if an
  ``<answer>...</answer>`` occurs;
* answer is 1.0 iff the completion's last ``<answer>...</answer>``, stripped, consists of
  digits, ``+ - * / ( )`` and spaces, its integers are the puzzle's numbers (each used
  exactly once) and its value is within 1e-5 of the target; else 0.

They evaluate the answer with Python's ``eval``; here a small arithmetic evaluator does:
the same values for ``+ - * / //``, unary signs and brackets, but ``**`` scores 0 (their
``eval`` would compute it, and ``9**9**9`` never finishes), so no answer can stall it.
"""

from __future__ import annotations

import ast
import operator
import re
from collections.abc import Sequence

SYSTEM = ("You are a helpful assistant. You first think about the reasoning process in "
          "your mind and then provide the user with the answer.")
USER = ("Using the numbers [{numbers}], create an equation that equals {target}. You can "
        "use basic arithmetic operations (+, -, *, /) and each number can only be used "
        "once. Show your work in <think> </think> tags. And return the final answer in "
        "<answer> </answer> tags, for example <answer> (1 + 2) / 3 </answer>.")
REPLY_PREFIX = "Let me solve this step by step.\n<think>"
FORMAT_WEIGHT = 0.1
TOLERANCE = 1e-5

_THINK = "<think>"
_FULL_FORMAT = re.compile(r"<think>.*?</think>\n<answer>.*?</answer>\n?\Z", re.DOTALL)
_THOUGHT = re.compile(r"<think>.*?</think>", re.DOTALL)
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_ALLOWED = re.compile(r"[0-9+\-*/() ]+")
_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
           ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}


def user_text(numbers: Sequence[int], target: int | float) -> str:
    """The puzzle as their user text (numbers space-separated, as numpy prints them)."""
    return USER.format(numbers=" ".join(str(n) for n in numbers), target=target)


def thought_text(reply: str) -> str:
    """What the format is scored on: the reply from its first ``<think>`` (the prompt's,
    when the reply opens with ``REPLY_PREFIX``), else ``"<think>" + reply``, as they
    score a completion of a prompt ending in ``<think>``."""
    start = reply.find(_THINK)
    return reply[start:] if start >= 0 else _THINK + reply


def format_reward(text: str) -> float:
    """1.0 for the full ``<think>...</think>\\n<answer>...</answer>`` format, else 0.1 for
    a thought plus 0.5 for an answer (``text`` as ``thought_text`` gives it)."""
    if _FULL_FORMAT.match(text):
        return 1.0
    return 0.1 * bool(_THOUGHT.search(text)) + 0.5 * bool(_ANSWER.search(text))


def last_answer(reply: str) -> str | None:
    """The stripped text of the reply's last ``<answer>...</answer>``, or None."""
    answers = _ANSWER.findall(reply)
    return answers[-1].strip() if answers else None


def _value(node: ast.AST) -> int | float:
    if isinstance(node, ast.Expression):
        return _value(node.body)
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        return _BINARY[type(node.op)](_value(node.left), _value(node.right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_value(node.operand))
    raise ValueError(f"not an arithmetic expression: {ast.dump(node)[:80]}")


def answer_reward(answer: str | None, numbers: Sequence[int], target: int | float) -> float:
    """1.0 iff ``answer`` uses each of ``numbers`` once and equals ``target``, else 0."""
    answer = (answer or "").strip()
    if not answer or not _ALLOWED.fullmatch(answer):
        return 0.0
    if sorted(int(n) for n in re.findall(r"\d+", answer)) != sorted(numbers):
        return 0.0
    try:
        value = _value(ast.parse(answer, mode="eval"))
        return float(abs(float(value) - float(target)) < TOLERANCE)
    except (SyntaxError, ValueError, ArithmeticError):
        return 0.0


def reward(reply: str, numbers: Sequence[int], target: int | float
           ) -> tuple[float, float, float]:
    """(``0.1 * format + answer``, format, answer) of a reply to the puzzle."""
    fmt = format_reward(thought_text(reply))
    correct = answer_reward(last_answer(reply), numbers, target)
    return FORMAT_WEIGHT * fmt + correct, fmt, correct
