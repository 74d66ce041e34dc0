"""The environment registry and the Sudoku task source it makes."""

import json

import pytest

from agentic_esopt import envs
from agentic_esopt.envs import sudoku

SPLITS = dict(tasks_per_generation=3, eval_size=4, seed=7)


def make(**options):
    return envs.make("sudoku", **{**SPLITS, "board_size": 4, "mask_count": 2, **options})


def test_names_and_default_options():
    assert {"sudoku", "ahd"} <= set(envs.names())
    assert envs.default_options("sudoku") == dict(board_size=4, mask_count=2,
                                                  partial_credit=False,
                                                  list_legal_moves=False, anchor_path=None)


def test_contract_sudoku_source_plays_set_actions():
    source = envs.make("sudoku", board_size=4, mask_count=2)
    env = source.env_factory()
    observation = env.reset(source.eval_tasks[0])
    assert "Current board" in observation
    _, reward, done, info = env.step("set 1 2 3")
    assert isinstance(reward, float) and "legal" in info


@pytest.mark.parametrize("name", ["sudoku", "ahd", "math_react"])
def test_sources_close_idempotently_and_as_context_managers(name):
    with envs.make(name) as source:
        assert isinstance(source, envs.base.Closeable)
    source.close()
    source.close()


@pytest.mark.parametrize("name, options, message", [
    ("chess", {}, "unknown environment 'chess'"),
    ("sudoku", dict(board_size=5), "board_size must be one of [4, 6, 9]"),
    ("sudoku", dict(mask_count=13), "mask_count must be in [1, 12] on a 4×4 board"),
    ("sudoku", dict(colour="red"), "unknown option 'colour'"),
    ("sudoku", dict(board_size="4"), "board_size must be int, got '4'"),
    ("sudoku", dict(anchor_path="/no/such/anchors"), "has no train.jsonl"),
])
def test_bad_options_are_named(name, options, message):
    with pytest.raises(ValueError) as error:
        envs.make(name, **options)
    assert message in str(error.value)


def test_bad_splits_are_named():
    with pytest.raises(ValueError, match="eval split must be one of"):
        envs.make("sudoku", eval_split="train")
    with pytest.raises(ValueError, match="tasks_per_generation must be >= 1"):
        envs.make("sudoku", tasks_per_generation=0)


def test_generation_tasks_are_a_function_of_seed_and_generation():
    source, again = make(), make()
    puzzles = [t.puzzle for t in source.train_tasks(5)]
    assert puzzles == [t.puzzle for t in again.train_tasks(5)]
    assert puzzles != [t.puzzle for t in source.train_tasks(6)]
    other_seed = envs.make("sudoku", **{**SPLITS, "seed": 8})
    assert puzzles != [t.puzzle for t in other_seed.train_tasks(5)]
    assert len(puzzles) == 3 and all(t.mask_count == 2 for t in source.train_tasks(5))


def test_held_out_tasks_never_share_a_grid_with_training_tasks():
    source = make()
    held_out = {t.solution for t in source.eval_tasks}
    trained = {t.solution for g in range(10) for t in source.train_tasks(g)}
    assert len(source.eval_tasks) == 4 and not held_out & trained
    assert all(sudoku.grid_split(t.solution) == "eval" for t in source.eval_tasks)


def test_environment_follows_its_options():
    assert make(partial_credit=True).env_factory().partial_credit
    assert not make().env_factory().partial_credit
    assert "set <row> <col> <value>" in make().system_prompt


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
    source = make(anchor_path=str(anchor_dir), eval_size=2)
    pool = sudoku.load_anchor_tasks(anchor_dir / "train.jsonl")
    chosen = source.train_tasks(4)
    assert len(chosen) == 3 and len({t.id for t in chosen}) == 3
    assert all(t in pool for t in chosen)
    assert [t.id for t in chosen] == [
        t.id for t in make(anchor_path=str(anchor_dir), eval_size=2).train_tasks(4)]
    assert {tuple(t.id for t in source.train_tasks(g)) for g in range(6)} != {
        tuple(t.id for t in chosen)}
    assert [t.id for t in source.eval_tasks] == [
        t.id for t in sudoku.load_anchor_tasks(anchor_dir / "eval.jsonl")][:2]


def test_anchor_errors_are_clear(anchor_dir):
    with pytest.raises(ValueError, match="has 3 tasks with mask_count=2, fewer than the 5"):
        make(anchor_path=str(anchor_dir), eval_size=5)
    with pytest.raises(ValueError, match="are not 9×9"):
        make(anchor_path=str(anchor_dir), board_size=9, eval_size=2)
    with pytest.raises(ValueError, match="has no test.jsonl"):
        make(anchor_path=str(anchor_dir), eval_split="test", eval_size=2)
