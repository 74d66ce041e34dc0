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
    state = strategy.init(5, PARAMS)
    state, _ = strategy.tell(state, strategy.ask(state), np.asarray([1.0, 2.0]))
    return strategy, state


def test_round_trip_is_bitwise_in_any_dtype_under_any_step(tmp_path):
    strategy, state = stepped_state()
    checkpointer = Checkpointer(str(tmp_path), max_to_keep=2)
    for step in (4, 9, 17):
        checkpointer.save(state, step=step)
    assert checkpointer.steps() == [9, 17]
    template = strategy.init(5, PARAMS)
    restored = checkpointer.restore(17, template)
    for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(restored)):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes()
    assert int(checkpointer.restore_latest(template).generation) == 1
    with pytest.raises(FileNotFoundError, match="no checkpoint of step 4"):
        checkpointer.restore(4, template)
    checkpointer.discard_after(9)
    assert checkpointer.steps() == [9]
    checkpointer.save(state, step=12)  # A discarded step number can be saved again.
    assert checkpointer.steps() == [9, 12]
    checkpointer.close()


def test_default_step_is_the_generation(tmp_path):
    _, state = stepped_state()
    checkpointer = Checkpointer(str(tmp_path))
    checkpointer.save(state)
    assert checkpointer.steps() == [int(state.generation)] == [1]
    checkpointer.close()
