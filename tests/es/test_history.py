"""Run history: atomic appends, bitwise replay, damaged files."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentic_esopt import es

PARAMS = {"w": jnp.linspace(-1, 1, 30).reshape(5, 6), "b": jnp.zeros(6, jnp.bfloat16)}


def live_run(path, generations=4, noise="lowrank", optimizer="adam"):
    strategy = es.agentic_esopt(6, es.schedules.cosine(0.1, 0.01, generations), 0.05,
                                noise=noise, rank=2 if noise == "lowrank" else 1,
                                antithetic=True, optimizer=optimizer)
    state = strategy.init(11, jax.tree.map(jnp.copy, PARAMS))  # tell consumes it.
    writer = es.history.HistoryWriter.create(path, strategy.spec, state.key)
    rng = np.random.default_rng(0)
    for _ in range(generations):
        population = strategy.ask(state)
        rewards = rng.normal(size=6).astype(np.float32)
        state, metrics = strategy.tell(state, population, rewards)
        writer.append(population, rewards, metrics, wall_time=0.5)
    return state


@pytest.mark.parametrize("noise,optimizer", [("lowrank", "adam"), ("full", "sgd")])
def test_replay_equals_live_run_bitwise(tmp_path, noise, optimizer):
    path = str(tmp_path / "history.jsonl")
    live = live_run(path, noise=noise, optimizer=optimizer)
    replayed = es.history.replay(PARAMS, path)
    for x, y in zip(jax.tree.leaves(live.params), jax.tree.leaves(replayed)):
        assert x.dtype == y.dtype
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_records_hold_what_a_run_needs(tmp_path):
    path = str(tmp_path / "history.jsonl")
    live_run(path)
    header, records = es.history.read(path)
    assert header["strategy"]["population_size"] == 6
    assert [r["generation"] for r in records] == [0, 1, 2, 3]
    first = records[0]
    assert first["sigma"] == pytest.approx(0.1) and first["learning_rate"] == pytest.approx(0.05)
    assert len(first["keys"]) == 6 and len(first["rewards"]) == 6
    assert len(first["weights"]) == 6 and first["update_norm"] > 0 and first["wall_time"] == 0.5


def test_truncated_history_names_the_last_good_generation(tmp_path):
    path = str(tmp_path / "history.jsonl")
    live_run(path)
    with open(path) as f:
        text = f.read()
    with open(path, "w") as f:
        f.write(text[:-40])  # Cut into generation 3.
    with pytest.raises(es.history.HistoryError, match="last good generation is 2") as info:
        es.history.replay(PARAMS, path)
    assert info.value.last_good_generation == 2
    # Replay can continue from there, equal to a live run of 3 generations.
    partial = es.history.replay(PARAMS, path, strict=False)
    three = live_run(str(tmp_path / "three.jsonl"), generations=4)
    assert not np.array_equal(np.asarray(partial["w"]), np.asarray(three.params["w"]))
    header, records, damage = es.history.read_intact(path)
    assert len(records) == 3 and damage.last_good_generation == 2
    es.history.HistoryWriter.resume(path, header, records)
    assert len(es.history.read(path)[1]) == 3  # Rewritten without the damaged tail.
    assert es.history.read_intact(str(tmp_path / "missing.jsonl")) == (None, [], None)


def test_corrupt_line_is_detected(tmp_path):
    path = str(tmp_path / "history.jsonl")
    live_run(path)
    lines = open(path).read().splitlines(keepends=True)
    record = json.loads(lines[2])
    record["record"]["rewards"][0] += 1.0  # Valid JSON, wrong checksum.
    lines[2] = json.dumps(record) + "\n"
    open(path, "w").write("".join(lines))
    with pytest.raises(es.history.HistoryError, match="line 3 is corrupt.*generation is 0"):
        es.history.read(path)


def test_replay_detects_a_different_initial_key(tmp_path):
    path = str(tmp_path / "history.jsonl")
    live_run(path)
    header, records = es.history.read(path)
    header["run_key"] = [0, 1]
    es.history.HistoryWriter(path, header, records)._flush()
    with pytest.raises(ValueError, match="keys differ"):
        es.history.replay(PARAMS, path)
