"""Prompt–parameter co-evolution: reward flow, ES updates, files, resume, comparisons."""

import dataclasses
import json
import math
import os
import shutil
import zlib
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentic_esopt import es
from agentic_esopt.agents import coevolution
from agentic_esopt.agents import eoh

GRID = np.linspace(0.0, 1.0, 11)
PARAMS = {"w": jnp.zeros((3,), jnp.float32)}
BAD_MEMBER = 2


@dataclasses.dataclass(frozen=True)
class ScaledSquareTask:
    """Approximate x**2 on [0, 1]; objective = 100 * mean squared error (minimise)."""

    description: str = "Approximate the square function on the unit interval."
    function_name: str = "priority"
    minimise: bool = True

    def interface(self):
        return 'def priority(x: float) -> float:\n    """Estimates x squared."""\n'


TASK = ScaledSquareTask()


class Scored(NamedTuple):
    valid: bool
    objective: float | None
    error: str | None


def objective_of(coefficient):
    return float(100 * np.mean((coefficient * GRID ** 2 - GRID ** 2) ** 2))


def evaluate(codes):
    results = []
    for code in codes:
        namespace = {}
        exec(code, namespace)  # pylint: disable=exec-used
        results.append(Scored(True, float(100 * np.mean(
            [(namespace["priority"](x) - x * x) ** 2 for x in GRID])), None))
    return results


def reply(coefficient):
    return f"{{scale}}\n```python\ndef priority(x):\n    return {float(coefficient)!r} * x * x\n```"


def member_generate(calls):
    """Member m answers coefficient 1 + m / 2; member `BAD_MEMBER` answers no code."""

    def generate(params, prompts, population, members, key):
        del params, key
        calls.append((population, list(members)))
        return ["no code today" if m == BAD_MEMBER else reply(1 + m / 2) for m in members]

    return generate


def params_generate(calls, crash_at=None, on_call=None):
    """Replies depend on the member's perturbed parameters, the prompt and the key."""

    def generate(params, prompts, population, members, key):
        if on_call is not None:
            on_call()
        if crash_at is not None and len(calls) == crash_at:
            raise RuntimeError("simulated crash")
        calls.append((population, list(members)))
        replies = []
        for j, (prompt, member) in enumerate(zip(prompts, members)):
            theta = (params if population is None
                     else es.noise.perturb(params, population, int(member)))
            noise = float(jax.random.uniform(jax.random.fold_in(key, j)))
            coefficient = (1 + float(jnp.sum(theta["w"])) + 0.2 * noise
                           + 0.1 * (zlib.crc32(prompt.encode()) % 5))
            replies.append(reply(round(coefficient, 6)))
        return replies

    return generate


def config(**overrides):
    fields = dict(method="sample_es", budget=8, population_size=4, noise="full",
                  sigma_start=0.1, sigma_end=0.0, learning_rate=0.05, model="tiny",
                  eoh_population=3, seed=3)
    return coevolution.AHDConfig(**{**fields, **overrides})


def read_jsonl(path):
    with open(path, encoding="utf-8") as file:
        return [json.loads(line) for line in file]


def batches(run_dir):
    """Programs of each batch, split at the call counts in metrics.jsonl."""
    programs = read_jsonl(os.path.join(run_dir, eoh.PROGRAMS_FILE))
    ends = [r["calls"] for r in read_jsonl(os.path.join(run_dir, coevolution.METRICS_FILE))]
    starts = [0] + ends[:-1]
    return [[p for p in programs if lo <= p["call_index"] < hi] for lo, hi in zip(starts, ends)]


# ---------------------------------------------------------------- reward flow


def test_sample_es_rewards_reach_the_members_that_earned_them(tmp_path):
    calls = []
    run_dir = str(tmp_path)
    cfg = config(budget=16, samples_per_member=2)
    outcome = coevolution.coevolve(member_generate(calls), PARAMS, evaluate, TASK, cfg,
                                   run_dir)
    header, records = es.history.read(os.path.join(run_dir, coevolution.HISTORY_FILE))
    assert len(calls) == len(records) == 2  # 16 calls / (4 members x 2 samples); one tell each
    assert all(population is not None for population, _ in calls)
    valid = [-objective_of(1 + m / 2) for m in range(4) if m != BAD_MEMBER]
    penalty = min(valid) - np.std(valid)
    expected = [penalty if m == BAD_MEMBER else -objective_of(1 + m / 2) for m in range(4)]
    for record in records:
        np.testing.assert_allclose(record["rewards"], expected, rtol=1e-6)
    assert records[-1]["sigma"] == 0.0 and records[0]["sigma"] == pytest.approx(0.1)
    assert header["strategy"]["population_size"] == 4
    np.testing.assert_array_equal(
        es.history.replay(PARAMS, os.path.join(run_dir, coevolution.HISTORY_FILE))["w"],
        outcome.params["w"])
    assert outcome.search.population[0].objective == 0.0  # member 0 writes x * x


def test_eoh_es_member_rewards_are_clipped_means_of_their_offspring(tmp_path):
    calls = []
    run_dir = str(tmp_path)
    cfg = config(method="eoh_es", budget=19)
    coevolution.coevolve(member_generate(calls), PARAMS, evaluate, TASK, cfg, run_dir)
    _, records = es.history.read(os.path.join(run_dir, coevolution.HISTORY_FILE))
    split = batches(run_dir)
    assert len(calls) == len(records) == len(split) == 2  # init (4 calls) + 15 of 16
    bad_rewards = []
    for record, batch in zip(records, split):
        for member in range(4):
            mine = [p["reward"] for p in batch if p["member"] == member]
            assert mine, "every member answers in these batches"
            assert record["rewards"][member] == pytest.approx(np.mean(mine), rel=1e-6)
        bad_rewards += [p["reward"] for p in batch
                        if p["member"] == BAD_MEMBER and p["operator"] != "i1"]
    # Invalid offspring get max(P - W, -1): clipped into [-1, 0] although the gaps are large.
    assert bad_rewards and all(-1.0 <= r <= 0.0 for r in bad_rewards)
    assert -1.0 in bad_rewards


def test_member_without_offspring_gets_the_batch_mean():
    def child(member):
        return eoh.Individual("", "", None, False, "i1", (), member, 1, 0)

    batch = eoh.Batch((child(0), child(0), child(2)), (1.0, 3.0, 8.0))
    np.testing.assert_allclose(coevolution.member_rewards(batch, 4), [2.0, 4.0, 8.0, 4.0])
    with pytest.raises(ValueError, match="outside"):
        coevolution.member_rewards(batch, 2)


def test_plain_methods_use_the_unperturbed_model_and_write_no_es_files(tmp_path):
    calls = []
    run_dir = str(tmp_path)
    outcome = coevolution.coevolve(params_generate(calls), PARAMS, evaluate, TASK,
                                   config(method="sample", budget=6), run_dir)
    assert [population for population, _ in calls] == [None, None]
    assert [members for _, members in calls] == [[0] * 4, [0] * 2]
    assert outcome.es_state is None and outcome.params is PARAMS
    assert not os.path.exists(os.path.join(run_dir, coevolution.HISTORY_FILE))
    assert not os.path.exists(os.path.join(run_dir, coevolution.CHECKPOINT_DIR))
    assert [r["calls"] for r in read_jsonl(os.path.join(run_dir,
                                                        coevolution.METRICS_FILE))] == [4, 6]


def test_es_moves_the_parameters_and_records_every_batch(tmp_path):
    run_dir = str(tmp_path)
    outcome = coevolution.coevolve(params_generate([]), PARAMS, evaluate, TASK,
                                   config(method="eoh_es", budget=20), run_dir)
    metrics = read_jsonl(os.path.join(run_dir, coevolution.METRICS_FILE))
    assert [m["es_generation"] for m in metrics] == list(range(1, len(metrics) + 1))
    assert all(m["update_norm"] > 0 for m in metrics[:-1])
    assert not np.array_equal(outcome.params["w"], PARAMS["w"])
    assert int(outcome.es_state.generation) == len(metrics)
    checkpointer = coevolution.es_checkpointer(run_dir)
    steps = checkpointer.steps()
    assert steps[-1] == outcome.search.call_count and len(steps) == 2
    restored = checkpointer.restore(steps[-1], outcome.es_state)
    checkpointer.close()
    for a, b in zip(jax.tree.leaves(outcome.es_state), jax.tree.leaves(restored)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


# ---------------------------------------------------------------- resume


def uninterrupted(tmp_path, cfg):
    run_dir = str(tmp_path / "reference")
    outcome = coevolution.coevolve(params_generate([]), PARAMS, evaluate, TASK, cfg, run_dir)
    return run_dir, outcome


@pytest.mark.parametrize("method", ["eoh_es", "sample_es"])
def test_resume_after_a_crash_is_bitwise_identical(tmp_path, method):
    cfg = config(method=method, budget=22 if method == "eoh_es" else 14)
    reference_dir, reference = uninterrupted(tmp_path, cfg)
    run_dir = str(tmp_path / "crashed")
    with pytest.raises(RuntimeError, match="simulated crash"):
        coevolution.coevolve(params_generate([], crash_at=2), PARAMS, evaluate, TASK, cfg,
                             run_dir)
    resumed = coevolution.coevolve(params_generate([]), PARAMS, evaluate, TASK, cfg, run_dir)
    assert_same_run(reference_dir, reference, run_dir, resumed)


def test_resume_between_the_es_checkpoint_and_the_search_checkpoint(tmp_path):
    """The search state lags the ES state by a batch (crash inside the batch's callback)."""
    cfg = config(method="eoh_es", budget=22)
    reference_dir, reference = uninterrupted(tmp_path, cfg)
    run_dir = str(tmp_path / "crashed")
    snapshots = []
    state_path = os.path.join(run_dir, eoh.STATE_FILE)

    def snapshot():
        if os.path.exists(state_path):
            with open(state_path, encoding="utf-8") as file:
                snapshots.append(file.read())

    with pytest.raises(RuntimeError):
        coevolution.coevolve(params_generate([], crash_at=2, on_call=snapshot), PARAMS,
                             evaluate, TASK, cfg, run_dir)
    with open(state_path, "w", encoding="utf-8") as file:
        file.write(snapshots[-2])  # the search state one batch before the ES state
    lagging_calls = json.loads(snapshots[-2])["call_count"]
    checkpointer = coevolution.es_checkpointer(run_dir)
    assert checkpointer.steps()[-1] > lagging_calls
    checkpointer.close()
    resumed = coevolution.coevolve(params_generate([]), PARAMS, evaluate, TASK, cfg, run_dir)
    assert_same_run(reference_dir, reference, run_dir, resumed)


def assert_same_run(reference_dir, reference, run_dir, resumed):
    assert reference.search == resumed.search
    for a, b in zip(jax.tree.leaves(reference.es_state), jax.tree.leaves(resumed.es_state)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        assert a.dtype == b.dtype
    for name in (eoh.PROGRAMS_FILE, eoh.STATE_FILE):
        with open(os.path.join(reference_dir, name), encoding="utf-8") as want, \
                open(os.path.join(run_dir, name), encoding="utf-8") as got:
            assert want.read() == got.read(), name
    _, want = es.history.read(os.path.join(reference_dir, coevolution.HISTORY_FILE))
    _, got = es.history.read(os.path.join(run_dir, coevolution.HISTORY_FILE))
    assert [r["rewards"] for r in want] == [r["rewards"] for r in got]
    assert ([r["calls"] for r in read_jsonl(os.path.join(reference_dir, "metrics.jsonl"))]
            == [r["calls"] for r in read_jsonl(os.path.join(run_dir, "metrics.jsonl"))])


def test_resume_refuses_other_settings_and_a_missing_checkpoint(tmp_path):
    run_dir = str(tmp_path)
    cfg = config(budget=8)
    coevolution.coevolve(params_generate([]), PARAMS, evaluate, TASK, cfg, run_dir)
    with pytest.raises(ValueError, match="learning_rate: 0.05 in the run, 0.1 now"):
        coevolution.coevolve(params_generate([]), PARAMS, evaluate, TASK,
                             dataclasses.replace(cfg, learning_rate=0.1), run_dir)
    shutil.rmtree(os.path.join(run_dir, coevolution.CHECKPOINT_DIR))
    with pytest.raises(FileNotFoundError, match="ES checkpoint of step 8 is missing"):
        coevolution.coevolve(params_generate([]), PARAMS, evaluate, TASK,
                             dataclasses.replace(cfg, eval_size=3), run_dir)


# ---------------------------------------------------------------- config


def test_bad_settings_are_listed_together():
    with pytest.raises(ValueError) as error:
        coevolution.check(coevolution.AHDConfig(task="tsp", method="eoh_es",
                                                population_size=1, top_p=0.0, budget=0))
    message = str(error.value)
    for text in ("unknown task 'tsp'", "population_size must be >= 2", "top_p",
                 "budget must be >= 1"):
        assert text in message
    assert coevolution.problems(coevolution.AHDConfig(budget=2.5)) == [
        "budget must be int, got 2.5"]
    assert "no published anchor" in coevolution.problems(coevolution.AHDConfig(
        task="online_bpp", anchor_data="/nowhere"))[0]
    assert "anchor_data has no" in coevolution.problems(coevolution.AHDConfig(
        anchor_data="/nowhere"))[0]


@pytest.mark.parametrize("overrides, generations", [
    (dict(method="sample_es", budget=10, population_size=4), 3),
    (dict(method="sample_es", budget=8, population_size=2, samples_per_member=2), 2),
    (dict(method="eoh_es", budget=4, population_size=4, eoh_population=4), 1),
    (dict(method="eoh_es", budget=21, population_size=4, eoh_population=4), 3),
    (dict(method="eoh", budget=12, population_size=2, eoh_population=3), 3)])
def test_planned_generations(overrides, generations):
    assert coevolution.planned_generations(coevolution.AHDConfig(**overrides)) == generations


# ---------------------------------------------------------------- comparison table


def summary(method, seed, best, task="kp_constructive", minimise=False):
    return dict(task=task, size=50, method=method, seed=seed, minimise=minimise,
                best_eval_objective=best, baseline_eval_objective=20.0)


def test_matched_table_counts_wins_in_the_task_direction():
    runs = [summary("sample", 0, 20.0), summary("sample_es", 0, 21.0),
            summary("sample", 1, 22.0), summary("sample_es", 1, 21.0),
            summary("sample", 2, None), summary("sample_es", 2, 19.0),
            summary("eoh", 0, 5.0, "tsp_constructive", True),
            summary("eoh_es", 0, 4.0, "tsp_constructive", True),
            summary("eoh", 1, 5.0, "tsp_constructive", True),
            summary("eoh_es", 1, 5.0, "tsp_constructive", True)]
    rows = coevolution.matched_table(runs)
    kp, tsp = rows
    assert (kp["method"], kp["wins"], kp["ties"], kp["losses"]) == ("sample", 2, 0, 1)
    assert kp["without_es"]["mean"] == 21.0 and kp["without_es"]["found"] == 2
    assert math.isclose(kp["with_es"]["std"], np.std([21.0, 21.0, 19.0]))
    assert (tsp["method"], tsp["wins"], tsp["ties"], tsp["losses"]) == ("eoh", 1, 1, 0)
    table = coevolution.table_markdown(rows)
    assert "| kp_constructive | 50 | max | 20.0000 | sample | 21.0000 ± 1.0000 (2/3) |" in table
    assert table.count("\n") == 4


def test_matched_table_skips_methods_without_their_partner():
    assert coevolution.matched_table([summary("sample", 0, 1.0), summary("eoh_es", 0, 2.0)]) == []


def test_copy_of_a_finished_run_resumes_without_calls(tmp_path):
    run_dir, reference = uninterrupted(tmp_path, config(budget=8))
    copy = str(tmp_path / "copy")
    shutil.copytree(run_dir, copy)
    calls = []
    again = coevolution.coevolve(params_generate(calls), PARAMS, evaluate, TASK,
                                 config(budget=8), copy)
    assert calls == [] and again.search == reference.search
    np.testing.assert_array_equal(again.params["w"], reference.params["w"])
