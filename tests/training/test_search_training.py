"""Heuristic search as a reward source of the trainer: reward flow, updates, resume."""

import os
import shutil
import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentic_esopt import es, fileio, models, training
from agentic_esopt.agents import eoh, sources
from agentic_esopt.training import metrics

import toy_search_env

BAD_MEMBER = 2
MODEL = models.load("tiny")


def config(search="sample", rule="es", generations=2, **run):
    return training.TrainConfig.from_dict(dict(
        env=dict(name="toy_search", search=search), model=dict(name="tiny"),
        es=dict(population_size=4, noise="full", sigma_start=0.1, sigma_end=0.0,
                learning_rate=0.05),
        rollout=dict(max_new_tokens=8), rule=dict(name=rule),
        run=dict(generations=generations, eval_every=generations, checkpoint_every=1,
                 seed=3, **run)))


class Output:
    def __init__(self, texts):
        self.texts = texts


def reply(coefficient):
    return f"{{scale}}\n```python\ndef priority(x):\n    return {float(coefficient)!r} * x * x\n```"


def member_generate(calls):
    """Member m answers coefficient 1 + m / 2; member ``BAD_MEMBER`` answers no code."""

    def generate(model, prompts, *, population, members, **_):
        calls.append((population, None if members is None else list(members)))
        members = [0] * len(prompts) if members is None else members
        return Output(["no code today" if m == BAD_MEMBER else reply(1 + m / 2)
                       for m in members])

    return generate


def params_generate(calls, crash_at=None):
    """Replies depend on the member's perturbed parameters, the prompt and the key."""

    def generate(model, prompts, *, population, members, key, **_):
        if crash_at is not None and len(calls) == crash_at:
            raise RuntimeError("simulated crash")
        calls.append((population, None if members is None else list(members)))
        replies = []
        for j, prompt in enumerate(prompts):
            theta = (model.params if population is None
                     else es.noise.perturb(model.params, population, int(members[j])))
            shift = float(jnp.sum(theta["final_norm"]["scale"])
                          - jnp.sum(MODEL.params["final_norm"]["scale"]))
            noise = float(jax.random.uniform(jax.random.fold_in(key, j)))
            coefficient = 1 + shift + 0.2 * noise + 0.1 * (zlib.crc32(prompt.encode()) % 5)
            replies.append(reply(round(coefficient, 6)))
        return Output(replies)

    return generate


def train(cfg, workdir, generate):
    return training.train(cfg, str(workdir), generate=generate, model=MODEL)


def test_sample_es_rewards_reach_the_members_that_earned_them(tmp_path):
    calls = []
    result = train(config(), tmp_path, member_generate(calls))
    header, records = es.history.read(tmp_path / "history.jsonl")
    assert len(calls) == len(records) == 2
    assert all(population is not None and members == [0, 1, 2, 3]
               for population, members in calls)
    valid = [-toy_search_env.objective_of(1 + m / 2) for m in range(4) if m != BAD_MEMBER]
    penalty = min(valid) - np.std(valid)
    expected = [penalty if m == BAD_MEMBER else -toy_search_env.objective_of(1 + m / 2)
                for m in range(4)]
    for record in records:
        np.testing.assert_allclose(record["rewards"], expected, rtol=1e-6)
    assert records[-1]["sigma"] == 0.0 and records[0]["sigma"] == pytest.approx(0.1)
    assert header["strategy"]["population_size"] == 4
    replayed = es.history.replay(MODEL.params, str(tmp_path / "history.jsonl"))
    for a, b in zip(jax.tree.leaves(replayed), jax.tree.leaves(result.state.params)):
        np.testing.assert_array_equal(a, b)
    final = result.summary["final_eval"]
    assert final["best_train_objective"] == 0.0 and final["best_eval_objective"] == 0.0
    assert final["baseline_eval_objective"] == pytest.approx(
        toy_search_env.evaluate([toy_search_env.ScaledSquareTask.seed_heuristic_source])[0]
        .objective)


def test_eoh_es_member_rewards_are_clipped_means_of_their_offspring(tmp_path):
    calls = []
    train(config(search="eoh"), tmp_path, member_generate(calls))
    _, records = es.history.read(tmp_path / "history.jsonl")
    programs = [r for r in fileio.read_jsonl(tmp_path / eoh.PROGRAMS_FILE)]
    ends = np.cumsum([r["batch_size"] for r in metrics.read_metrics(tmp_path / "metrics.jsonl")
                      if r["kind"] == "train"]).tolist()
    batches = [[p for p in programs if lo <= p["call_index"] < hi]
               for lo, hi in zip([0] + ends[:-1], ends)]
    assert len(calls) == len(records) == len(batches) == 2
    bad_rewards = []
    for record, batch in zip(records, batches):
        for member in range(4):
            mine = [p["reward"] for p in batch if p["member"] == member]
            assert mine, "every member answers in these batches"
            assert record["rewards"][member] == pytest.approx(np.mean(mine), rel=1e-6)
        bad_rewards += [p["reward"] for p in batch
                        if p["member"] == BAD_MEMBER and p["operator"] != "i1"]
    assert bad_rewards and all(-1.0 <= r <= 0.0 for r in bad_rewards)
    assert -1.0 in bad_rewards


def test_member_without_offspring_gets_the_batch_mean():
    def child(member):
        return eoh.Individual("", "", None, False, "i1", (), member, 1, 0)

    batch = eoh.Batch((child(0), child(0), child(2)), (1.0, 3.0, 8.0))
    np.testing.assert_allclose(sources.member_rewards(batch, 4), [2.0, 4.0, 8.0, 4.0])
    with pytest.raises(ValueError, match="outside"):
        sources.member_rewards(batch, 2)


def test_the_search_alone_uses_the_unperturbed_model_and_learns_nothing(tmp_path):
    calls = []
    result = train(config(rule="none"), tmp_path, params_generate(calls))
    assert [population for population, _ in calls] == [None, None]
    assert not os.path.exists(tmp_path / "history.jsonl")
    for a, b in zip(jax.tree.leaves(result.state.params), jax.tree.leaves(MODEL.params)):
        np.testing.assert_array_equal(a, b)
    train_records = [r for r in metrics.read_metrics(tmp_path / "metrics.jsonl")
                     if r["kind"] == "train"]
    assert [r["calls"] for r in train_records] == [4, 8]


def test_es_moves_the_parameters(tmp_path):
    result = train(config(search="eoh", generations=3), tmp_path, params_generate([]))
    records = [r for r in metrics.read_metrics(tmp_path / "metrics.jsonl")
               if r["kind"] == "train"]
    assert all(r["update_norm"] > 0 for r in records[:-1])
    assert int(result.state.generation) == 3
    assert not np.array_equal(result.state.params["final_norm"]["scale"],
                              MODEL.params["final_norm"]["scale"])


def assert_same_run(reference_dir, reference, run_dir, resumed):
    for a, b in zip(jax.tree.leaves(reference.state), jax.tree.leaves(resumed.state)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    with open(reference_dir / eoh.PROGRAMS_FILE) as want, open(run_dir / eoh.PROGRAMS_FILE) as got:
        assert want.read() == got.read()
    _, want = es.history.read(reference_dir / "history.jsonl")
    _, got = es.history.read(run_dir / "history.jsonl")
    assert [r["rewards"] for r in want] == [r["rewards"] for r in got]
    without_time = lambda summary: {k: v for k, v in summary["final_eval"].items()
                                    if k != "wall_time_s"}
    assert without_time(reference.summary) == without_time(resumed.summary)


@pytest.mark.parametrize("search", ["eoh", "sample"])
def test_resume_after_a_crash_is_bitwise_identical(tmp_path, search):
    cfg = config(search=search, generations=3)
    reference = train(cfg, tmp_path / "reference", params_generate([]))
    with pytest.raises(RuntimeError, match="simulated crash"):
        train(cfg, tmp_path / "crashed", params_generate([], crash_at=2))
    resumed = train(cfg, tmp_path / "crashed", params_generate([]))
    assert_same_run(tmp_path / "reference", reference, tmp_path / "crashed", resumed)


def test_copy_of_a_finished_run_resumes_without_calls(tmp_path):
    reference = train(config(), tmp_path / "run", params_generate([]))
    shutil.copytree(tmp_path / "run", tmp_path / "copy")
    calls = []
    again = train(config(), tmp_path / "copy", params_generate(calls))
    assert calls == []
    assert_same_run(tmp_path / "run", reference, tmp_path / "copy", again)
