"""Generation on (data, model) meshes of 8 fake CPU devices equals single-device generation."""

import dataclasses

import jax
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from agentic_esopt import es, models, sharding

PROMPTS = [[5, 6, 7], [8, 9, 10, 11, 12], [13], [14, 15], [16, 17, 18, 19], [20, 21, 22]]
MESHES = [(8, 1), (4, 2), (2, 4)]


@pytest.fixture(scope="module")
def model():
    return models.load("tiny")


def population(model):
    strategy = es.agentic_esopt(population_size=3, sigma=0.05, learning_rate=1e-3,
                                noise="lowrank", rank=2)
    return strategy.ask(strategy.init(jax.random.key(1), model.params))


def two_turns(model, cache=None, **kwargs):
    """Two turns of PROMPTS (the second extends the first by its reply), kept or not."""
    rows = ({} if cache is None
            else dict(conversation=models.Conversation(cache, range(len(PROMPTS)))))
    first = models.generate(model, PROMPTS, max_new_tokens=6, **rows, **kwargs)
    second = [p + ids + [30, 31] for p, ids in zip(PROMPTS, first.token_ids)]
    return first.token_ids, models.generate(model, second, max_new_tokens=6, **rows,
                                            **kwargs).token_ids


@pytest.mark.parametrize("preset", ["fsdp", "tp"])
@pytest.mark.parametrize("data, model_axis", MESHES)
def test_sharded_generation_equals_unsharded(model, data, model_axis, preset):
    layout = sharding.Layout(sharding.make_mesh({"data": data, "model": model_axis}),
                             sharding.PRESETS[preset])
    sharded = dataclasses.replace(model, params=layout.place(model.params))
    members = dict(population=population(model), members=[0, 1, 2, 0, 1, 2])
    cache = models.ConversationCache()
    assert two_turns(sharded, cache, **members) == two_turns(model, **members)
    assert two_turns(sharded, temperature=1.0, key=jax.random.key(2)) == two_turns(
        model, temperature=1.0, key=jax.random.key(2))
    kv, = [rows.kv for rows in cache._parts.values()]  # pylint: disable=protected-access
    heads = "model" if model.config.num_kv_heads % model_axis == 0 else None
    expected = NamedSharding(layout.mesh, P("data", heads, None, None))
    for buffer in (*kv.k, *kv.v):  # One per layer.
        assert buffer.sharding.is_equivalent_to(expected, buffer.ndim)
    assert kv.k[0].shape[0] % data == 0  # Batch rows padded to split evenly over data.
