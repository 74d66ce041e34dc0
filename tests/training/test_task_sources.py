"""Per-generation training tasks and held-out tasks of the Sudoku task source."""

import dataclasses
import json

import pytest

from agentic_esopt import training
from agentic_esopt.envs import sudoku
from agentic_esopt.training import tasks

CONFIG = training.TrainConfig(board_size=4, mask_count=2, tasks_per_generation=3,
                              eval_size=4, seed=7)


def test_generation_tasks_are_a_function_of_seed_and_generation():
    source = tasks.sudoku_source(CONFIG)
    again = tasks.sudoku_source(CONFIG)
    ids = [t.puzzle for t in source.train_tasks(5)]
    assert ids == [t.puzzle for t in again.train_tasks(5)]
    assert ids != [t.puzzle for t in source.train_tasks(6)]
    other_seed = tasks.sudoku_source(dataclasses.replace(CONFIG, seed=8))
    assert ids != [t.puzzle for t in other_seed.train_tasks(5)]
    assert len(ids) == 3 and all(t.mask_count == 2 for t in source.train_tasks(5))


def test_held_out_tasks_never_share_a_grid_with_training_tasks():
    source = tasks.sudoku_source(CONFIG)
    held_out = {t.solution for t in source.eval_tasks}
    trained = {t.solution for g in range(10) for t in source.train_tasks(g)}
    assert len(source.eval_tasks) == 4 and not held_out & trained
    assert all(sudoku.grid_split(t.solution) == "eval" for t in source.eval_tasks)


def test_environment_follows_partial_credit():
    source = tasks.sudoku_source(dataclasses.replace(CONFIG, partial_credit=True))
    assert source.env_factory().partial_credit
    assert not tasks.sudoku_source(CONFIG).env_factory().partial_credit


def _write_anchor(path, split, task_list):
    rows = [dict(id=t.id, source="test", split=split, mask_count=t.mask_count,
                 puzzle=t.puzzle, solution=t.solution) for t in task_list]
    path.joinpath(f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.fixture
def anchor_dir(tmp_path):
    _write_anchor(tmp_path, "train", sudoku.generate_tasks(6, 4, 2, seed=1, split="train"))
    _write_anchor(tmp_path, "eval", sudoku.generate_tasks(3, 4, 2, seed=1, split="eval"))
    return tmp_path


def test_anchor_tasks_sample_the_training_file_per_generation(anchor_dir):
    config = dataclasses.replace(CONFIG, anchor_path=str(anchor_dir), eval_size=2)
    source = tasks.sudoku_source(config)
    pool = sudoku.load_anchor_tasks(anchor_dir / "train.jsonl")
    chosen = source.train_tasks(4)
    assert len(chosen) == 3 and len({t.id for t in chosen}) == 3
    assert all(t in pool for t in chosen)
    assert [t.id for t in chosen] == [t.id for t in tasks.sudoku_source(config).train_tasks(4)]
    assert {tuple(t.id for t in source.train_tasks(g)) for g in range(6)} != {
        tuple(t.id for t in chosen)}
    assert [t.id for t in source.eval_tasks] == [
        t.id for t in sudoku.load_anchor_tasks(anchor_dir / "eval.jsonl")][:2]


def test_anchor_errors_are_clear(anchor_dir):
    too_many = dataclasses.replace(CONFIG, anchor_path=str(anchor_dir), eval_size=5)
    with pytest.raises(ValueError, match="has 3 tasks with mask_count=2, fewer than the 5"):
        tasks.sudoku_source(too_many)
    wrong_board = dataclasses.replace(CONFIG, anchor_path=str(anchor_dir), board_size=9,
                                      eval_size=2)
    with pytest.raises(ValueError, match="are not 9×9"):
        tasks.sudoku_source(wrong_board)
