"""Multi-turn Sudoku, as the Agentic ESOpt paper defines it.

A task is a puzzle with a unique solution and H* blanks (its mask count). The agent fills
one cell per turn with ``set r c v`` (1-based). Any move consistent with the rules is
allowed, as in the paper, even if it differs from the stored solution; such a move can
dead-end the board, which then simply cannot be completed. Illegal or malformed moves
change nothing and come back as feedback. The episode ends when the board is full or after
3·H* turns (every reply counts as a turn). Reward, given on the final step: 1.0 iff the
board is a complete valid grid, else 0.0, or with ``partial_credit`` the fraction of the
originally blank cells that match the solution.

With ``list_legal_moves`` every observation lists the moves that break no rule right now
(one ``set r c v`` per candidate value of each empty cell), as text-game environments list
admissible commands; the agent still has to pick moves that lead to the solution.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import os
import re
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from agentic_esopt import options as options_lib
from agentic_esopt.envs import base
from agentic_esopt.envs.base import StepResult

BOX_SHAPES = {4: (2, 2), 6: (2, 3), 9: (3, 3)}
# Fewest givens known to admit a unique solution, per board size.
MIN_GIVENS = {4: 4, 6: 8, 9: 17}
TURNS_PER_BLANK = 3
SPLITS = ("train", "eval", "test")

MAX_NUMBER_DIGITS = 9

_SEPARATORS = r"[\s,;:()\[\]{}]"
_NUMBER = r"([+-]?[0-9]+)"
# "set" not preceded by a letter (so "reset" is no command), then three integers separated
# by whitespace, commas, semicolons, colons or brackets: "set 3 4 5", "SET(3, 4, 5)",
# "set: [3,4,5]". ASCII-only so that unicode look-alikes of digits and letters never match.
_SET_COMMAND = re.compile(
    rf"(?<![a-z])set{_SEPARATORS}*{_NUMBER}{_SEPARATORS}+{_NUMBER}{_SEPARATORS}+{_NUMBER}"
    r"(?![0-9])",
    re.IGNORECASE | re.ASCII,
)


@dataclasses.dataclass(frozen=True)
class SetAction:
    """``set row col value``, 1-based as the model writes it (range is the env's check)."""

    row: int
    col: int
    value: int


@dataclasses.dataclass(frozen=True)
class ParseError:
    """Why no action could be read from the text; meant to be shown to the model."""

    reason: str


def parse_set_action(text: str) -> SetAction | ParseError:
    """Reads the LAST well-formed ``set r c v`` command anywhere in ``text``.

    Lenient about case, separators and surrounding text ("I'll play set 3 4 5",
    "<answer>set(3, 4, 5)</answer>"). A command with a number longer than
    ``MAX_NUMBER_DIGITS`` digits is malformed and skipped.

    Args:
      text: the model's reply; any string (non-strings are a ParseError too).

    Returns:
      The parsed ``SetAction`` or a ``ParseError`` with a human-readable reason.
    """
    if not isinstance(text, str):
        return ParseError(f"expected text, got {type(text).__name__}")
    found_overlong = False
    for match in reversed(list(_SET_COMMAND.finditer(text))):
        numbers = match.groups()
        if any(len(number.lstrip("+-")) > MAX_NUMBER_DIGITS for number in numbers):
            found_overlong = True
            continue
        row, col, value = (int(number) for number in numbers)
        return SetAction(row=row, col=col, value=value)
    if found_overlong:
        return ParseError("the numbers in your command are far too large")
    return ParseError("no command of the form 'set <row> <col> <value>' was found")


Grid = tuple[tuple[int, ...], ...]


def box_shape(size: int) -> tuple[int, int]:
    """(rows, cols) of a box on a ``size``×``size`` board."""
    if size not in BOX_SHAPES:
        raise ValueError(f"unsupported Sudoku size {size}; choose one of {sorted(BOX_SHAPES)}")
    return BOX_SHAPES[size]


@dataclasses.dataclass(frozen=True)
class SudokuTask:
    """One puzzle. ``puzzle`` has 0 for blanks; ``mask_count`` = number of blanks = H*."""

    id: str
    size: int
    puzzle: Grid
    solution: Grid
    mask_count: int

    def __post_init__(self):
        box_shape(self.size)
        for name in ("puzzle", "solution"):
            grid = getattr(self, name)
            if len(grid) != self.size or any(len(row) != self.size for row in grid):
                raise ValueError(f"task {self.id}: {name} is not {self.size}×{self.size}")
        if not is_complete_solution(self.solution):
            raise ValueError(f"task {self.id}: solution is not a valid complete grid")
        blanks = 0
        for r, c in itertools.product(range(self.size), repeat=2):
            given = self.puzzle[r][c]
            if given == 0:
                blanks += 1
            elif given != self.solution[r][c]:
                raise ValueError(f"task {self.id}: given {given} at row {r + 1}, column "
                                 f"{c + 1} disagrees with the solution")
        if blanks != self.mask_count:
            raise ValueError(f"task {self.id}: mask_count {self.mask_count} but the puzzle "
                             f"has {blanks} blanks")


def _as_grid(rows) -> Grid:
    return tuple(tuple(int(v) for v in row) for row in rows)


# ----------------------------------------------------------------------------- rules


def _box_index(size: int, r: int, c: int) -> int:
    box_rows, box_cols = box_shape(size)
    return (r // box_rows) * (size // box_cols) + c // box_cols


def conflicts(board: Sequence[Sequence[int]], r: int, c: int, value: int) -> list[str]:
    """The units ("row", "column", "box") where ``value`` already appears, ignoring (r, c)."""
    size = len(board)
    box_rows, box_cols = box_shape(size)
    top, left = r - r % box_rows, c - c % box_cols
    units = {
        "row": [(r, j) for j in range(size)],
        "column": [(i, c) for i in range(size)],
        "box": [(top + i, left + j) for i in range(box_rows) for j in range(box_cols)],
    }
    return [name for name, cells in units.items()
            if any(board[i][j] == value for i, j in cells if (i, j) != (r, c))]


def is_complete_solution(board: Sequence[Sequence[int]]) -> bool:
    """True iff every cell holds 1..size and no row, column or box repeats a value."""
    size = len(board)
    return all(1 <= board[r][c] <= size and not conflicts(board, r, c, board[r][c])
               for r, c in itertools.product(range(size), repeat=2))


# ----------------------------------------------------------------------------- solver


def _solutions(board: Sequence[Sequence[int]], rng: np.random.Generator | None = None
               ) -> Iterator[Grid]:
    """Yields every completion of ``board`` (bitmask backtracking, fewest candidates first).

    With ``rng`` the candidate values are tried in random order (random full grids).
    """
    size = len(board)
    cells = [int(v) for row in board for v in row]
    rows, cols, boxes = [0] * size, [0] * size, [0] * size
    for index, value in enumerate(cells):
        if value:
            r, c = divmod(index, size)
            bit = 1 << (value - 1)
            b = _box_index(size, r, c)
            if rows[r] & bit or cols[c] & bit or boxes[b] & bit:
                return  # the givens already conflict: no solutions
            rows[r] |= bit
            cols[c] |= bit
            boxes[b] |= bit
    blanks = [i for i, v in enumerate(cells) if v == 0]
    box_of = [_box_index(size, *divmod(i, size)) for i in range(size * size)]
    full = (1 << size) - 1

    def search() -> Iterator[Grid]:
        best, best_candidates, best_count = -1, 0, size + 1
        for index in blanks:
            if cells[index]:
                continue
            r, c = divmod(index, size)
            candidates = full & ~(rows[r] | cols[c] | boxes[box_of[index]])
            count = candidates.bit_count()
            if count < best_count:
                best, best_candidates, best_count = index, candidates, count
                if count <= 1:
                    break
        if best < 0:
            yield tuple(tuple(cells[r * size:(r + 1) * size]) for r in range(size))
            return
        values = [v for v in range(1, size + 1) if best_candidates >> (v - 1) & 1]
        if rng is not None:
            rng.shuffle(values)
        r, c = divmod(best, size)
        b = box_of[best]
        for value in values:
            bit = 1 << (value - 1)
            cells[best] = value
            rows[r] |= bit
            cols[c] |= bit
            boxes[b] |= bit
            yield from search()
            rows[r] &= ~bit
            cols[c] &= ~bit
            boxes[b] &= ~bit
        cells[best] = 0

    yield from search()


def count_solutions(board: Sequence[Sequence[int]], limit: int = 2) -> int:
    """Number of completions of ``board`` (0 = blank), counting at most ``limit``."""
    box_shape(len(board))
    return sum(1 for _ in itertools.islice(_solutions(board), limit))


def random_full_grid(size: int, rng: np.random.Generator) -> Grid:
    """A random valid complete grid (backtracking with shuffled candidate order)."""
    return next(_solutions([[0] * size for _ in range(size)], rng))


# ----------------------------------------------------------------------------- generator


def grid_split(solution: Grid) -> str:
    """The split a solution grid belongs to: a hash partition, so splits never share a grid."""
    compact = "".join(str(v) for row in solution for v in row)
    return SPLITS[base.stable_int(compact) % len(SPLITS)]


def _mask_uniquely(solution: Grid, mask_count: int, rng: np.random.Generator) -> Grid | None:
    """Blanks cells in random order while the solution stays unique; None if it stalls."""
    size = len(solution)
    board = [list(row) for row in solution]
    blanks = 0
    for index in rng.permutation(size * size):
        if blanks == mask_count:
            break
        r, c = divmod(int(index), size)
        board[r][c] = 0
        if count_solutions(board, limit=2) == 1:
            blanks += 1
        else:
            board[r][c] = solution[r][c]
    return _as_grid(board) if blanks == mask_count else None


def generate_tasks(n: int, size: int, mask_count: int, seed: int, split: str,
                   *, max_attempts: int | None = None) -> list[SudokuTask]:
    """``n`` distinct puzzles with unique solutions and exactly ``mask_count`` blanks.

    Deterministic given the arguments. The random stream is seeded from (seed, split,
    size, mask_count), and solution grids are hash-partitioned between ``SPLITS`` (see
    ``grid_split``), so train, eval and test never share a puzzle or even a solution grid,
    whatever ``n`` and ``seed`` are.

    Args:
      n: number of tasks.
      size: 4, 6 or 9.
      mask_count: blanks per puzzle (H*), 1 ≤ H* ≤ size² − MIN_GIVENS[size].
      seed: integer seed.
      split: one of ``SPLITS``.
      max_attempts: grids to try before giving up (default 50·n + 100).

    Returns:
      A list of ``n`` ``SudokuTask``s with ids ``{split}-{size}x{size}-m{H*}-s{seed}-{i}``.
    """
    box_shape(size)
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose one of {SPLITS}")
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if not 1 <= mask_count <= size * size - MIN_GIVENS[size]:
        raise ValueError(f"mask_count must be in [1, {size * size - MIN_GIVENS[size]}] for "
                         f"a {size}×{size} board with a unique solution, got {mask_count}")
    rng = np.random.default_rng([seed, base.stable_int(split), size, mask_count])
    max_attempts = 50 * n + 100 if max_attempts is None else max_attempts
    tasks, seen = [], set()
    for _ in range(max_attempts):
        if len(tasks) == n:
            return tasks
        solution = random_full_grid(size, rng)
        if grid_split(solution) != split:
            continue
        puzzle = _mask_uniquely(solution, mask_count, rng)
        if puzzle is None or puzzle in seen:
            continue
        seen.add(puzzle)
        task_id = f"{split}-{size}x{size}-m{mask_count}-s{seed}-{len(tasks):05d}"
        tasks.append(SudokuTask(id=task_id, size=size, puzzle=puzzle, solution=solution,
                                mask_count=mask_count))
    if len(tasks) == n:
        return tasks
    raise ValueError(f"generated only {len(tasks)} of {n} distinct {size}×{size} puzzles with "
                     f"{mask_count} blanks in {max_attempts} attempts; lower n or mask_count")


def load_anchor_tasks(path: str | Path, mask_count: int | None = None) -> list[SudokuTask]:
    """Reads tasks from the anchor JSONL format (id, mask_count, puzzle, solution, ...).

    Args:
      path: a .jsonl file, one JSON object per line (blank lines ignored).
      mask_count: keep only tasks with this many blanks (None keeps all).

    Returns:
      The tasks in file order.
    """
    def parse(row: dict) -> SudokuTask:
        return SudokuTask(id=str(row["id"]), size=len(row["puzzle"]),
                          puzzle=_as_grid(row["puzzle"]), solution=_as_grid(row["solution"]),
                          mask_count=int(row["mask_count"]))

    tasks = base.read_task_rows(path, parse, "a valid Sudoku task")
    return [t for t in tasks if mask_count is None or t.mask_count == mask_count]


# ----------------------------------------------------------------------------- environment


def render_board(board: Sequence[Sequence[int]]) -> str:
    """The board as text: 1-based row/column labels, '.' for blanks, box separators."""
    size = len(board)
    box_rows, box_cols = box_shape(size)

    def with_bars(cells: Sequence[str]) -> str:
        groups = [" ".join(cells[i:i + box_cols]) for i in range(0, size, box_cols)]
        return " | ".join(groups)

    header = "    " + with_bars([str(c + 1) for c in range(size)])
    rule = "   " + "-" * (len(header) - 3)
    lines = [header, rule]
    for r, row in enumerate(board):
        if r and r % box_rows == 0:
            lines.append(rule)
        lines.append(f"{r + 1} | " + with_bars([str(v) if v else "." for v in row]))
    return "\n".join(lines)


def system_prompt(size: int) -> str:
    """The agent's instructions for a ``size``×``size`` board: rules and action format."""
    box_rows, box_cols = box_shape(size)
    return (
        f"You are an expert Sudoku player. Sudoku {size}×{size}: fill every empty cell ('.') "
        f"with a number from 1 to {size} so that each row, each column and each "
        f"{box_rows}×{box_cols} box contains every number exactly once; given numbers cannot "
        f"change. Each turn you see the board and fill one cell. End your reply with: "
        f"set <row> <col> <value> (rows and columns are numbered 1 to {size})."
    )


class SudokuEnv:
    """One Sudoku episode (see the module docstring for the rules and rewards)."""

    def __init__(self, partial_credit: bool = False, list_legal_moves: bool = False):
        self.partial_credit = partial_credit
        self.list_legal_moves = list_legal_moves
        self._task: SudokuTask | None = None
        self._board: list[list[int]] = []
        self._turn = 0
        self._turn_limit = 0
        self._done = False

    def reset(self, task: SudokuTask, *, max_turns: int | None = None) -> str:
        """Starts ``task``; returns the board (the rules are in ``system_prompt``).

        The episode lasts min(3·H*, ``max_turns``) turns.
        """
        if not isinstance(task, SudokuTask):
            raise TypeError(f"SudokuEnv needs a SudokuTask, got {type(task).__name__}")
        if max_turns is not None and max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        self._task = task
        self._board = [list(row) for row in task.puzzle]
        self._turn = 0
        self._turn_limit = TURNS_PER_BLANK * task.mask_count
        if max_turns is not None:
            self._turn_limit = min(self._turn_limit, max_turns)
        self._done = False
        return self._status()

    def step(self, action_text: str) -> StepResult:
        """Applies one ``set r c v`` reply; returns feedback, the board and turns left."""
        if self._task is None or self._done:
            raise RuntimeError("step() called on an episode that was not reset or has ended")
        self._turn += 1
        error, feedback = self._apply(action_text)
        # Only legal moves fill cells, so a full board is always a solved one.
        solved = all(all(row) for row in self._board) and is_complete_solution(self._board)
        self._done = solved or self._turn >= self._turn_limit
        reward = self._reward(solved) if self._done else 0.0
        if self._done:
            feedback += " The puzzle is solved!" if solved else " No turns left."
        info = {"legal": error is None, "error": error, "turn": self._turn,
                "correct_fills": self.correct_fills(), "solved": solved}
        return StepResult(f"{feedback}\n\n{self._status()}", reward, self._done, info)

    @property
    def board(self) -> Grid:
        """The current board (0 = blank)."""
        return _as_grid(self._board)

    def correct_fills(self) -> int:
        """Originally blank cells that now hold the solution's value."""
        task = self._task
        return sum(1 for r, c in itertools.product(range(task.size), repeat=2)
                   if task.puzzle[r][c] == 0 and self._board[r][c] == task.solution[r][c])

    def _reward(self, solved: bool) -> float:
        if solved:
            return 1.0
        if self.partial_credit:
            return self.correct_fills() / self._task.mask_count
        return 0.0

    def _apply(self, action_text: str) -> tuple[str | None, str]:
        """Plays the action if legal; returns (error code or None, feedback sentence)."""
        size = self._task.size
        action = parse_set_action(action_text)
        if isinstance(action, ParseError):
            return "malformed", f"Invalid reply: {action.reason}. Nothing changed."
        r, c, v = action.row, action.col, action.value
        where = f"row {r}, column {c}"
        if not (1 <= r <= size and 1 <= c <= size):
            return "out_of_range", (f"Illegal move: {where} is out of range (rows and columns "
                                    f"go from 1 to {size}). Nothing changed.")
        if not 1 <= v <= size:
            return "out_of_range", (f"Illegal move: value {v} is out of range (values go from "
                                    f"1 to {size}). Nothing changed.")
        if self._task.puzzle[r - 1][c - 1]:
            return "given_cell", (f"Illegal move: {where} is a given number and cannot be "
                                  "changed. Nothing changed.")
        if self._board[r - 1][c - 1]:
            return "filled_cell", f"Illegal move: {where} is already filled. Nothing changed."
        clashes = conflicts(self._board, r - 1, c - 1, v)
        if clashes:
            return "conflict", (f"Illegal move: {v} already appears in the same "
                                f"{' and '.join(clashes)} as {where}. Nothing changed.")
        self._board[r - 1][c - 1] = v
        return None, f"Placed {v} at {where}."

    def legal_moves(self) -> list[str]:
        """Every move that breaks no rule on the current board, as ``set r c v``."""
        size = len(self._board)
        return [f"set {r + 1} {c + 1} {v}"
                for r, c in itertools.product(range(size), repeat=2) if not self._board[r][c]
                for v in range(1, size + 1) if not conflicts(self._board, r, c, v)]

    def _status(self) -> str:
        if self.list_legal_moves:
            options = f"Legal moves: {', '.join(self.legal_moves()) or 'none'}."
        else:
            blanks = [f"{r + 1} {c + 1}" for r, row in enumerate(self._board)
                      for c, value in enumerate(row) if not value]
            options = f"Empty cells (row col): {', '.join(blanks)}."
        return (f"Current board:\n{render_board(self._board)}\n\n"
                f"{options} Turns left: {self._turn_limit - self._turn}.")


@dataclasses.dataclass(frozen=True)
class Options:
    """Sudoku settings (``envs.make("sudoku", **options)``)."""

    board_size: int = options_lib.field(4, "Board size: 4, 6 or 9.")
    mask_count: int = options_lib.field(2, "Blank cells per puzzle (H*, the horizon).")
    partial_credit: bool = options_lib.field(False, "Reward the fraction of blanks filled "
                                                    "correctly instead of 1/0 for solved.")
    list_legal_moves: bool = options_lib.field(False, "Observations list every move that "
                                                      "breaks no rule (admissible commands).")
    anchor_path: str | None = options_lib.field(None, "Folder with train.jsonl and "
                                                      "<eval split>.jsonl puzzles to play "
                                                      "instead of generated ones.")

    def problems(self) -> list[str]:
        size = self.board_size
        if size not in BOX_SHAPES:
            return [f"board_size must be one of {sorted(BOX_SHAPES)}, got {size}"]
        most_blanks = size ** 2 - MIN_GIVENS[size]
        problems = []
        options_lib.checker(problems)(
            1 <= self.mask_count <= most_blanks,
            f"mask_count must be in [1, {most_blanks}] on a {size}×{size} board (a unique "
            f"solution needs {MIN_GIVENS[size]} givens), got {self.mask_count}")
        if self.anchor_path is not None and not os.path.isfile(
                os.path.join(self.anchor_path, "train.jsonl")):
            problems.append(f"anchor_path {self.anchor_path!r} has no train.jsonl")
        return problems


def _anchor_tasks(options: Options, split: str, needed: int) -> list[SudokuTask]:
    path = os.path.join(options.anchor_path, f"{split}.jsonl")
    if not os.path.isfile(path):
        raise ValueError(f"anchor_path {options.anchor_path!r} has no {split}.jsonl")
    loaded = load_anchor_tasks(path, mask_count=options.mask_count)
    wrong_size = [t.id for t in loaded if t.size != options.board_size]
    if wrong_size:
        raise ValueError(f"{path}: tasks {wrong_size[:3]} are not {options.board_size}×"
                         f"{options.board_size}; set board_size to match the anchor file")
    if len(loaded) < needed:
        raise ValueError(f"{path} has {len(loaded)} tasks with mask_count="
                         f"{options.mask_count}, fewer than the {needed} needed")
    return loaded


def make_source(options: Options, splits: base.Splits) -> base.TaskSource:
    """Sudoku tasks: generated (train / held-out splits never share a grid) or anchors."""
    if options.anchor_path is not None:
        pool = _anchor_tasks(options, "train", splits.tasks_per_generation)
        eval_tasks = _anchor_tasks(options, splits.eval_split, splits.eval_size)
        eval_tasks = eval_tasks[:splits.eval_size]

        def train_tasks(generation: int) -> list[SudokuTask]:
            return base.sample_generation_tasks(pool, splits.tasks_per_generation,
                                                splits.seed, generation)
    else:
        eval_tasks = generate_tasks(splits.eval_size, options.board_size, options.mask_count,
                                    seed=splits.seed, split=splits.eval_split)

        def train_tasks(generation: int) -> list[SudokuTask]:
            return generate_tasks(splits.tasks_per_generation, options.board_size,
                                  options.mask_count,
                                  seed=base.generation_seed(splits.seed, generation),
                                  split="train")

    train_tasks(0)  # Fails now, before any compute, if the setting cannot make tasks.
    return base.TaskSource(
        env_factory=functools.partial(SudokuEnv, partial_credit=options.partial_credit,
                                      list_legal_moves=options.list_legal_moves),
        system_prompt=system_prompt(options.board_size), train_tasks=train_tasks,
        eval_tasks=eval_tasks)
