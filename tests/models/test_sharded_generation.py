"""Generation on (data, model) meshes of 8 fake CPU devices equals single-device generation."""

import dataclasses

import jax
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from agentic_esopt import es, models, sharding

PROMPTS = [[5, 6, 7], [8, 9, 10, 11, 12], [13], [14, 15], [16, 17, 18, 19], [20, 21, 22]]
# (data, model, preset): rows only (the presets differ only on a model axis > 1), then each
# preset once with the KV heads split over the model axis and once with them not dividing
# it (tp then also splits the k/v projections' columns inside a head).
# Then the stacked KV cache (the accelerators' default) once, its heads split.
LAYOUTS = [(8, 1, "fsdp", "per_layer"), (4, 2, "fsdp", "per_layer"), (2, 4, "tp", "per_layer"),
           (4, 2, "fsdp", "stacked")]


@pytest.fixture(scope="module")
def model():
    return models.load("tiny")


def sampled():
    return dict(temperature=1.0, key=jax.random.key(2))


def two_turns(model, cache=None, **kwargs):
    """Two turns of PROMPTS (the second extends the first by its reply), kept or not."""
    rows = ({} if cache is None
            else dict(conversation=models.Conversation(cache, range(len(PROMPTS)))))
    first = models.generate(model, PROMPTS, max_new_tokens=6, **rows, **kwargs)
    second = [p + ids + [30, 31] for p, ids in zip(PROMPTS, first.token_ids)]
    return first.token_ids, models.generate(model, second, max_new_tokens=6, **rows,
                                            **kwargs).token_ids


@pytest.fixture(scope="module")
def members(model):
    """A low-rank population, each member on two of the rows."""
    strategy = es.agentic_esopt(population_size=3, sigma=0.05, learning_rate=1e-3,
                                noise="lowrank", rank=2)
    population = strategy.ask(strategy.init(jax.random.key(1), model.params))
    return dict(population=population, members=[0, 1, 2, 0, 1, 2])


@pytest.fixture(scope="module")
def unsharded(model, members):
    """Single-device turns: the population's re-prefilled, then sampled ones."""
    return two_turns(model, **members), two_turns(model, **sampled())


@pytest.mark.parametrize("data, model_axis, preset, cache_layout", LAYOUTS)
def test_sharded_generation_equals_unsharded(model, members, unsharded, data, model_axis,
                                             preset, cache_layout):
    layout = sharding.Layout(sharding.make_mesh({"data": data, "model": model_axis}),
                             sharding.PRESETS[preset])
    sharded = dataclasses.replace(model, params=layout.place(model.params)).with_cache_layout(
        cache_layout)
    cache = models.ConversationCache()
    assert two_turns(sharded, cache, **members) == unsharded[0]
    assert two_turns(sharded, **sampled()) == unsharded[1]
    kv, = [rows.kv for rows in cache._parts.values()]  # pylint: disable=protected-access
    heads = "model" if model.config.num_kv_heads % model_axis == 0 else None
    stacked = cache_layout == "stacked"
    buffers = (kv.k, kv.v) if stacked else (*kv.k, *kv.v)  # Stacked, or one per layer.
    expected = NamedSharding(layout.mesh, P(*(None,) * stacked, "data", heads, None, None))
    for buffer in buffers:
        assert buffer.ndim == 4 + stacked
        assert buffer.sharding.is_equivalent_to(expected, buffer.ndim)
    assert buffers[0].shape[stacked] % data == 0  # Batch rows padded to split evenly over data.
