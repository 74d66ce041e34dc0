"""The orbax Checkpointer on its own: bitwise round trips, caller-numbered steps, errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentic_esopt import es
from agentic_esopt.training.checkpoint import Checkpointer

PARAMS = {"a": jnp.asarray([1.5, -2.25, 3e-3], jnp.bfloat16),
          "b": {"kernel": jnp.arange(6, dtype=jnp.float32).reshape(2, 3) / 7}}


def stepped_state():
    strategy = es.agentic_esopt(2, sigma=0.1, learning_rate=0.1, optimizer="adam")
    state = strategy.init(5, jax.tree.map(jnp.copy, PARAMS))  # tell consumes it.
    state, _ = strategy.tell(state, strategy.ask(state), np.asarray([1.0, 2.0]))
    return strategy, state


def test_round_trip_is_bitwise_in_any_dtype_with_the_source_state(tmp_path):
    strategy, state = stepped_state()
    checkpointer = Checkpointer(str(tmp_path), max_to_keep=2)
    checkpointer.save(state, {"call_count": 4, "population": [{"code": "x"}]})
    assert checkpointer.steps() == [int(state.generation)] == [1]
    template = strategy.init(5, PARAMS)
    restored, source_state = checkpointer.restore(1, template)
    for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(restored)):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes()
    assert source_state == {"call_count": 4, "population": [{"code": "x"}]}
    with pytest.raises(FileNotFoundError, match="no checkpoint of step 4"):
        checkpointer.restore(4, template)
    checkpointer.close()


def test_opening_removes_a_save_cut_short_and_keeps_the_finished_steps(tmp_path):
    strategy, state = stepped_state()
    checkpointer = Checkpointer(str(tmp_path), max_to_keep=2)
    checkpointer.save(state)
    checkpointer.close()
    unfinished = tmp_path / "2.orbax-checkpoint-tmp-1733400000"
    (unfinished / "state").mkdir(parents=True)
    checkpointer = Checkpointer(str(tmp_path), max_to_keep=2)
    assert not unfinished.exists()
    assert checkpointer.steps() == [1]
    restored, _ = checkpointer.restore_latest(strategy.init(5, PARAMS))
    assert int(restored.generation) == 1
    checkpointer.close()


def test_restore_latest_sets_aside_steps_after_max_step(tmp_path):
    strategy, state = stepped_state()
    checkpointer = Checkpointer(str(tmp_path / "checkpoints"))
    checkpointer.save(state)
    later, _ = strategy.tell(state, strategy.ask(state), np.asarray([3.0, 1.0]))
    checkpointer.save(later)
    template = strategy.init(5, PARAMS)
    assert int(checkpointer.restore_latest(template)[0].generation) == 2
    restored, _ = checkpointer.restore_latest(template, str(tmp_path / "aside"), max_step=1)
    assert int(restored.generation) == 1 and checkpointer.steps() == [1]
    assert [p.name.split("-")[0] for p in (tmp_path / "aside").iterdir()] == ["2"]
    assert checkpointer.restore_latest(template, max_step=0) is None
    checkpointer.close()
