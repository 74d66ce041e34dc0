"""Prompts for LLM heuristic search (EoH / Sample) and extraction of the code they yield.

Five operators, each asking for one new heuristic:

* ``i1`` — invent a heuristic from the task description alone;
* ``e1`` — explore: an idea unlike any of k parent heuristics;
* ``e2`` — recombine: keep the backbone the k parents share, vary the rest;
* ``m1`` — mutate one heuristic into a different variant;
* ``m2`` — retune one heuristic: same structure, new parameters in its scoring.

Every prompt shows the task interface (the function stub from the task registry), the
parents' ideas, code and objectives, and asks for a one-sentence idea in braces
followed by one Python code block defining the function.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from typing import Protocol, Sequence

OPERATORS = ("i1", "e1", "e2", "m1", "m2")
MAX_DESCRIPTION_CHARS = 500

_INSTRUCTIONS = {
    "i1": "Design a new heuristic for this problem.",
    "e1": ("Design a new heuristic whose idea is clearly different from every heuristic "
           "above: explore an approach none of them takes."),
    "e2": ("First find the idea these heuristics have in common. Then design a new "
           "heuristic that keeps that common backbone but differs from each of them."),
    "m1": ("Design a modified version of this heuristic: a new variant that changes how it "
           "decides, not a copy of it."),
    "m2": ("Find the parameters of this heuristic's scoring (constants, weights, "
           "thresholds, exponents) and change them to get a better variant; keep the "
           "structure of the code."),
}
_FENCED_BLOCK = re.compile(r"```[^\n`]*\n(.*?)(?:```|\Z)", re.DOTALL)
_BRACED_IDEA = re.compile(r"\{([^{}]+)\}")
_CODE_START = re.compile(r"^(?:import |from \S+ import |def |@)", re.MULTILINE)
_MAX_TRIMMED_LINES = 200


class HeuristicTask(Protocol):
    """What a prompt needs from an AHD task record (`envs.ahd.tasks.AHDTask` is one)."""

    description: str
    function_name: str
    minimise: bool

    def interface(self) -> str:
        """The function stub: signature and docstring."""


class Scored(Protocol):
    """What a prompt needs from a parent heuristic."""

    description: str
    code: str
    objective: float | None


@dataclasses.dataclass(frozen=True)
class Candidate:
    """A heuristic read from a model reply."""

    description: str
    code: str


@dataclasses.dataclass(frozen=True)
class ExtractionFailure:
    """Why no usable heuristic could be read from a model reply."""

    reason: str


def _interface(task: HeuristicTask) -> str:
    direction = "lower" if task.minimise else "higher"
    return (f"{task.description.strip()}\n\n"
            f"The heuristic is the Python function `{task.function_name}`:\n"
            f"```python\n{task.interface().rstrip()}\n```\n"
            f"Its objective is measured on a set of instances; {direction} is better.")


def _show_parent(index: int, parent: Scored) -> str:
    objective = "invalid" if parent.objective is None else f"{parent.objective:.6g}"
    return (f"Heuristic {index}\nIdea: {parent.description or '(not stated)'}\n"
            f"Code:\n```python\n{parent.code.strip()}\n```\nObjective: {objective}")


def _output_format(function_name: str) -> str:
    return (f"Answer with exactly two parts. First, one sentence describing the idea of "
            f"your heuristic, inside curly braces: {{...}}. Then one Python code block "
            f"(```python ... ```) that defines `{function_name}` with exactly the "
            f"interface above; `numpy` (as `np`) and `math` are already imported, and it "
            f"may import other standard-library modules. "
            f"Write nothing after the code block.")


def _check_operator(operator: str) -> None:
    if operator not in OPERATORS:
        raise ValueError(f"unknown operator {operator!r}; expected one of {OPERATORS}")


def parent_count(operator: str, num_parents: int) -> int:
    """How many parents `operator` takes when ``e1``/``e2`` take `num_parents`."""
    _check_operator(operator)
    return {"i1": 0, "m1": 1, "m2": 1}.get(operator, num_parents)


def build_prompt(operator: str, task: HeuristicTask, parents: Sequence[Scored]) -> str:
    """The prompt asking for one heuristic with `operator` applied to `parents`.

    Args:
      operator: one of `OPERATORS`.
      task: the task record (interface and direction of the objective).
      parents: none for ``i1``, exactly one for ``m1``/``m2``, at least one for
        ``e1``/``e2``.

    Returns:
      The prompt text.
    """
    count = parent_count(operator, max(len(parents), 1))
    if len(parents) != count:
        raise ValueError(f"operator {operator} takes {count} parent(s), got {len(parents)}")
    sections = [f"You are designing a heuristic for the following problem.\n\n"
                f"{_interface(task)}"]
    if parents:
        intro = ("Here is an existing heuristic:" if len(parents) == 1 else
                 f"Here are {len(parents)} existing heuristics:")
        sections.append("\n\n".join([intro] + [_show_parent(i + 1, parent)
                                               for i, parent in enumerate(parents)]))
    sections.append(_INSTRUCTIONS[operator])
    sections.append(_output_format(task.function_name))
    return "\n\n".join(sections)


def _parse(code: str) -> ast.Module | str:
    """The module AST, or the reason it does not parse."""
    try:
        return ast.parse(code)
    except SyntaxError as error:
        return f"{error.msg} (line {error.lineno})"
    except (ValueError, RecursionError, MemoryError) as error:
        return f"{type(error).__name__}: {error}"


def _functions(module: ast.Module) -> list[str]:
    return [node.name for node in module.body
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]


def _unfenced_code(text: str) -> str:
    """Unfenced code without the prose after it.

    Drops trailing lines until the rest parses, then any trailing top-level bare
    expressions (a closing word such as ``Done`` parses as one).
    """
    lines = text.rstrip().splitlines()
    for end in range(len(lines), max(len(lines) - _MAX_TRIMMED_LINES, 0), -1):
        module = _parse("\n".join(lines[:end]))
        if isinstance(module, str):
            continue
        statements = [node for node in module.body if not isinstance(node, ast.Expr)]
        return "\n".join(lines[:statements[-1].end_lineno]) if statements else ""
    return text


def _code_blocks(text: str) -> tuple[list[str], str]:
    """(candidate code blocks, remaining prose); unfenced code is found by its start."""
    blocks = _FENCED_BLOCK.findall(text)
    if blocks:
        return blocks, _FENCED_BLOCK.sub(" ", text)
    start = _CODE_START.search(text)
    if start is None:
        return [], text
    return [_unfenced_code(text[start.start():])], text[:start.start()]


def _description(prose: str) -> str:
    braced = _BRACED_IDEA.search(prose)
    idea = braced.group(1) if braced else prose
    return " ".join(idea.split())[:MAX_DESCRIPTION_CHARS]


def extract_candidate(text: object, function_name: str) -> Candidate | ExtractionFailure:
    """Reads the idea and the code of `function_name` from a model reply. Never raises.

    Takes fenced code blocks (an unterminated last fence runs to the end) or, without
    fences, the code from its first ``import``/``from``/``def``/decorator line, with
    trailing prose dropped. Of the blocks that parse, the last one defining
    `function_name` wins. Renaming rule: if no block defines `function_name` but one
    defines exactly one top-level function, that function is kept and aliased
    (``function_name = other``), since models often drift the name; with several
    functions and none of the right name, extraction fails.

    The idea is the first ``{...}`` outside the code, else the prose before it
    (whitespace collapsed, possibly empty).

    Args:
      text: the model reply (anything; non-strings fail).
      function_name: the function the task interface requires.

    Returns:
      A `Candidate` or an `ExtractionFailure` with a reason.
    """
    if not isinstance(text, str):
        return ExtractionFailure(f"the reply is not text but {type(text).__name__}")
    blocks, prose = _code_blocks(text)
    if not blocks:
        return ExtractionFailure("the reply contains no code")
    parse_errors, parsed = [], []
    for block in blocks:
        module = _parse(block)
        if isinstance(module, str):
            parse_errors.append(module)
        else:
            parsed.append((block, _functions(module)))
    description = _description(prose)
    for block, functions in reversed(parsed):
        if function_name in functions:
            return Candidate(description, block.strip() + "\n")
    for block, functions in reversed(parsed):
        if len(functions) == 1:
            alias = f"\n\n{function_name} = {functions[0]}\n"
            return Candidate(description, block.strip() + alias)
    if parse_errors and not parsed:
        return ExtractionFailure(f"the code does not parse: {parse_errors[-1]}")
    found = sorted({name for _, functions in parsed for name in functions})
    return ExtractionFailure(f"no function named {function_name!r} (found: {found})")
