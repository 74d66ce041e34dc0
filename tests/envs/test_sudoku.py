"""Sudoku rules, rewards, generator and anchor loader."""

import itertools
import json
from pathlib import Path

import pytest

from agentic_esopt.envs import sudoku
from agentic_esopt.envs.sudoku import SudokuEnv, SudokuTask

ANCHOR_DIR = Path("/work/shared/data/anchors/sudoku")

SOLUTION_4 = ((1, 2, 3, 4), (3, 4, 1, 2), (2, 1, 4, 3), (4, 3, 2, 1))
PUZZLE_4 = ((0, 2, 3, 4), (3, 4, 0, 2), (2, 1, 4, 3), (4, 3, 2, 0))  # blanks (1,1) (2,3) (4,4)
TASK_4 = SudokuTask(id="hand-4", size=4, puzzle=PUZZLE_4, solution=SOLUTION_4, mask_count=3)


def blanks(task):
    return [(r, c) for r, c in itertools.product(range(task.size), repeat=2)
            if task.puzzle[r][c] == 0]


def solve_in_env(env, task):
    results = [env.step(f"set {r + 1} {c + 1} {task.solution[r][c]}") for r, c in blanks(task)]
    return results


def legal_wrong_move(task):
    """A (row, col, value), 0-based, that breaks no rule on the puzzle but is not the answer."""
    for r, c in blanks(task):
        for value in range(1, task.size + 1):
            if value != task.solution[r][c] and not sudoku.conflicts(task.puzzle, r, c, value):
                return r, c, value
    raise AssertionError("no legal wrong move in this puzzle")


@pytest.fixture
def env():
    env = SudokuEnv()
    env.reset(TASK_4)
    return env


def test_reset_shows_board_and_turns_and_the_system_prompt_the_rules():
    observation = SudokuEnv().reset(TASK_4)
    assert "1 | . 2 | 3 4" in observation
    assert "Turns left: 9" in observation
    assert "set <row> <col> <value>" in sudoku.system_prompt(4)


def test_legal_move_fills_the_cell(env):
    observation, reward, done, info = env.step("I'll play set 1 1 1")
    assert env.board[0][0] == 1
    assert info["legal"] and info["error"] is None and info["correct_fills"] == 1
    assert "Placed 1 at row 1, column 1" in observation
    assert "1 | 1 2 | 3 4" in observation
    assert (reward, done) == (0.0, False)


@pytest.mark.parametrize("action, error, phrase", [
    ("set 1 2 2", "given_cell", "given number"),
    ("set 1 1 2", "conflict", "same row"),
    ("set 4 4 4", "conflict", "same row and column and box"),
    ("set 5 1 1", "out_of_range", "row 5, column 1 is out of range"),
    ("set 0 1 1", "out_of_range", "out of range"),
    ("set 1 1 9", "out_of_range", "value 9 is out of range"),
    ("set 1 1 0", "out_of_range", "value 0 is out of range"),
    ("I don't know", "malformed", "no command"),
    ("", "malformed", "no command"),
])
def test_illegal_moves_change_nothing_and_explain(env, action, error, phrase):
    observation, reward, done, info = env.step(action)
    assert env.board == PUZZLE_4
    assert info["error"] == error and not info["legal"]
    assert phrase in observation
    assert "Nothing changed" in observation and "Current board" in observation
    assert (reward, done) == (0.0, False)


def test_filled_cell_cannot_be_overwritten(env):
    env.step("set 1 1 1")
    observation, _, _, info = env.step("set 1 1 1")
    assert info["error"] == "filled_cell" and "already filled" in observation
    assert env.board[0][0] == 1


def test_solving_gives_reward_one_only_at_the_end():
    env = SudokuEnv()
    env.reset(TASK_4)
    results = solve_in_env(env, TASK_4)
    assert [r.reward for r in results] == [0.0, 0.0, 1.0]
    assert [r.done for r in results] == [False, False, True]
    assert results[-1].info["solved"] and "solved" in results[-1].observation
    with pytest.raises(RuntimeError, match="has ended"):
        env.step("set 1 1 1")


def test_turn_limit_is_three_times_mask_count(env):
    results = [env.step("pass") for _ in range(3 * TASK_4.mask_count)]
    assert [r.done for r in results] == [False] * 8 + [True]
    assert results[-1].reward == 0.0 and not results[-1].info["solved"]
    assert "No turns left" in results[-1].observation
    assert "Turns left: 0" in results[-1].observation


def test_max_turns_caps_the_episode():
    env = SudokuEnv()
    assert "Turns left: 2" in env.reset(TASK_4, max_turns=2)
    assert [env.step("pass").done for _ in range(2)] == [False, True]
    with pytest.raises(ValueError, match="max_turns"):
        env.reset(TASK_4, max_turns=0)


@pytest.mark.parametrize("partial_credit, expected", [(True, 1 / 3), (False, 0.0)])
def test_unsolved_reward_is_partial_credit_or_zero(partial_credit, expected):
    env = SudokuEnv(partial_credit=partial_credit)
    env.reset(TASK_4)
    env.step("set 1 1 1")
    results = [env.step("nothing") for _ in range(8)]
    assert results[-1].done and results[-1].reward == pytest.approx(expected)
    env.reset(TASK_4)
    assert solve_in_env(env, TASK_4)[-1].reward == 1.0


def test_legal_move_that_differs_from_the_solution_is_allowed_but_earns_nothing():
    task = sudoku.generate_tasks(1, 4, 10, seed=3, split="train")[0]
    r, c, value = legal_wrong_move(task)
    env = SudokuEnv(partial_credit=True)
    env.reset(task)
    _, _, _, info = env.step(f"set {r + 1} {c + 1} {value}")
    assert info["legal"] and env.board[r][c] == value and info["correct_fills"] == 0
    results = [env.step("x") for _ in range(3 * task.mask_count - 1)]
    assert results[-1].done and results[-1].reward == 0.0


@pytest.mark.parametrize("size, mask_count, box",
                         [(4, 6, "2×2"), (6, 12, "2×3"), (9, 20, "3×3")])
def test_every_board_size_plays_to_a_solution(size, mask_count, box):
    task = sudoku.generate_tasks(1, size, mask_count, seed=0, split="train")[0]
    env = SudokuEnv()
    env.reset(task)
    rules = sudoku.system_prompt(size)
    assert f"{box} box" in rules and f"numbered 1 to {size}" in rules
    results = solve_in_env(env, task)
    assert results[-1].reward == 1.0 and results[-1].done
    assert not any(r.done for r in results[:-1])
    assert env.board == task.solution


def test_render_board_separates_boxes():
    lines = sudoku.render_board([[0] * 6 for _ in range(6)]).splitlines()
    assert lines[0].split() == ["1", "2", "3", "|", "4", "5", "6"]
    assert len([line for line in lines if set(line.strip()) == {"-"}]) == 3
    assert lines[2] == "1 | . . . | . . ."


def test_count_solutions_of_empty_4x4_is_288():
    assert sudoku.count_solutions([[0] * 4 for _ in range(4)], limit=1000) == 288
    assert sudoku.count_solutions(PUZZLE_4) == 1
    conflicting = [list(row) for row in PUZZLE_4]
    conflicting[0][0] = 2
    assert sudoku.count_solutions(conflicting) == 0


@pytest.mark.parametrize("size, mask_count", [(4, 8), (6, 15), (9, 30)])
def test_generator_is_deterministic_with_unique_solutions(size, mask_count):
    tasks = sudoku.generate_tasks(4, size, mask_count, seed=7, split="train")
    assert tasks == sudoku.generate_tasks(4, size, mask_count, seed=7, split="train")
    assert tasks != sudoku.generate_tasks(4, size, mask_count, seed=8, split="train")
    assert len({t.puzzle for t in tasks}) == 4 and len({t.id for t in tasks}) == 4
    for task in tasks:
        assert task.mask_count == mask_count == len(blanks(task))
        assert sudoku.count_solutions(task.puzzle, limit=2) == 1
        assert sudoku.is_complete_solution(task.solution)


def test_splits_never_share_a_solution_grid():
    train = sudoku.generate_tasks(30, 4, 6, seed=0, split="train")
    evaluation = sudoku.generate_tasks(30, 4, 6, seed=0, split="eval")
    assert not {t.solution for t in train} & {t.solution for t in evaluation}
    assert {sudoku.grid_split(t.solution) for t in train} == {"train"}
    assert {sudoku.grid_split(t.solution) for t in evaluation} == {"eval"}


@pytest.mark.parametrize("kwargs, message", [
    (dict(size=5, mask_count=3, split="train"), "unsupported Sudoku size"),
    (dict(size=4, mask_count=13, split="train"), "mask_count must be in"),
    (dict(size=4, mask_count=0, split="train"), "mask_count must be in"),
    (dict(size=4, mask_count=3, split="validation"), "unknown split"),
])
def test_generator_rejects_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        sudoku.generate_tasks(1, seed=0, **kwargs)


def test_generator_reports_exhaustion():
    with pytest.raises(ValueError, match="generated only"):
        sudoku.generate_tasks(5, 4, 12, seed=0, split="train", max_attempts=3)


def test_task_validation():
    with pytest.raises(ValueError, match="mask_count 2 but the puzzle has 3 blanks"):
        SudokuTask(id="t", size=4, puzzle=PUZZLE_4, solution=SOLUTION_4, mask_count=2)
    wrong_given = ((3,) + PUZZLE_4[0][1:],) + PUZZLE_4[1:]
    with pytest.raises(ValueError, match="disagrees with the solution"):
        SudokuTask(id="t", size=4, puzzle=wrong_given, solution=SOLUTION_4, mask_count=2)
    with pytest.raises(ValueError, match="not a valid complete grid"):
        SudokuTask(id="t", size=4, puzzle=PUZZLE_4, solution=PUZZLE_4, mask_count=3)
    with pytest.raises(TypeError, match="SudokuTask"):
        SudokuEnv().reset("not a task")


def anchor_row(task, split="train"):
    return {"id": task.id, "source": "generated", "split": split,
            "mask_count": task.mask_count, "puzzle": [list(r) for r in task.puzzle],
            "solution": [list(r) for r in task.solution],
            "puzzle_compact": "".join(str(v or ".") for r in task.puzzle for v in r),
            "solution_compact": "".join(str(v) for r in task.solution for v in r)}


def test_load_anchor_tasks_from_a_small_file(tmp_path):
    tasks = (sudoku.generate_tasks(2, 9, 5, seed=0, split="train")
             + sudoku.generate_tasks(1, 9, 10, seed=0, split="train"))
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(anchor_row(t)) + "\n" for t in tasks) + "\n")
    assert sudoku.load_anchor_tasks(path) == tasks
    assert sudoku.load_anchor_tasks(path, mask_count=10) == tasks[2:]
    bad = anchor_row(tasks[0])
    bad["solution"][0][0] = 0
    path.write_text(json.dumps(anchor_row(tasks[1])) + "\n" + json.dumps(bad) + "\n")
    with pytest.raises(ValueError, match=r"train.jsonl:2: not a valid Sudoku task"):
        sudoku.load_anchor_tasks(path)


@pytest.mark.skipif(not ANCHOR_DIR.exists(), reason=f"anchor data not at {ANCHOR_DIR}")
def test_anchor_files_load_as_unique_disjoint_puzzles():
    train = sudoku.load_anchor_tasks(ANCHOR_DIR / "train.jsonl", mask_count=20)
    evaluation = sudoku.load_anchor_tasks(ANCHOR_DIR / "eval.jsonl", mask_count=20)
    assert len(train) == len(evaluation) == 32
    assert not {t.puzzle for t in train} & {t.puzzle for t in evaluation}
    assert all(sudoku.count_solutions(t.puzzle) == 1 for t in train + evaluation)
    env = SudokuEnv()
    env.reset(train[0])
    assert solve_in_env(env, train[0])[-1].reward == 1.0


def test_legal_moves_listing_follows_the_board():
    task = SudokuTask(id="t", size=4, puzzle=((0, 0, 3, 4), (3, 4, 1, 2), (2, 1, 4, 3),
                                              (4, 3, 2, 1)),
                      solution=((1, 2, 3, 4), (3, 4, 1, 2), (2, 1, 4, 3), (4, 3, 2, 1)),
                      mask_count=2)
    env = SudokuEnv(list_legal_moves=True)
    observation = env.reset(task)
    assert env.legal_moves() == ["set 1 1 1", "set 1 2 2"]
    assert "Legal moves: set 1 1 1, set 1 2 2. Turns left: 6." in observation
    assert "Legal moves: set 1 2 2." in env.step("set 1 1 1").observation
    assert env.legal_moves() == ["set 1 2 2"]
    assert "Legal moves" not in SudokuEnv().reset(task)
