"""The dense models' two KV cache layouts: per-layer buffers (the CPU default) and one
stacked buffer carried through the layer scan (the GPU/TPU default) compute the same
logits and tokens; "auto" picks by backend; bad names are clear errors.

Multi-turn kept caches, finished rows, pieces and populations in the stacked layout:
``test_kv_cache.py``; meshes: ``test_sharded_generation.py``.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentic_esopt import es, models
from agentic_esopt.models import decoder, layers, loading, sampling

STEPS = 5


def decode(model, layout, deltas, tokens, mask, mode, key):
    """The prefilled state and the state after ``STEPS`` decoded tokens."""
    config = dataclasses.replace(model.config, cache_layout=layout)
    state = sampling._prefill(  # pylint: disable=protected-access
        config, model.params, deltas, tokens, mask, new_tokens=16)
    prefilled = jax.tree.map(np.asarray, state)
    state = sampling._decode(  # pylint: disable=protected-access
        config, mode, model.params, deltas, state,
        jax.random.split(key, tokens.shape[0]), jnp.asarray([2], jnp.int32), jnp.float32(1.0),
        jnp.float32(1.0), jnp.zeros(2, jnp.float32), jnp.int32(STEPS))
    return prefilled, jax.tree.map(np.asarray, state)


def test_layouts_give_the_same_logits_and_tokens(hf_checkpoint):
    """Left-padded prompts of a low-rank population, prefilled then sampled: the stacked
    cache's logits match the per-layer buffers' within 1e-5 at every step's end, and the
    tokens (sampled with the same keys) are the same. (The layout only changes how the
    cache is held and attended: a qwen3 with every bias, q/k norms and a head_dim of its
    own has every part the dense families differ in; qwen2's q/k/v biases are among
    qwen3's, and llama has none of them.)"""
    model = models.load(hf_checkpoint("qwen3", seed=4, attention_bias=True, head_dim=16)[1])
    c = model.config
    rng = np.random.RandomState(0)
    tokens = jnp.asarray(rng.randint(3, 250, (4, 12)), jnp.int32)
    mask = jnp.asarray(np.arange(12)[None] >= np.array([[0], [5], [2], [9]]), jnp.int32)
    strategy = es.agentic_esopt(population_size=3, sigma=0.05, learning_rate=1e-3,
                                noise="lowrank", rank=2)
    population = strategy.ask(strategy.init(jax.random.key(1), model.params))
    deltas = sampling._population_deltas(  # pylint: disable=protected-access
        model.params, population, jnp.asarray([0, 1, 2, 0], jnp.int32))
    mode = sampling.SamplingMode(greedy=False, top_k=None, top_p=False)
    runs = {layout: decode(model, layout, deltas, tokens, mask, mode, jax.random.key(5))
            for layout in ("per_layer", "stacked")}
    assert isinstance(runs["per_layer"][1].cache.k, tuple)
    assert runs["stacked"][1].cache.k.shape == (c.num_layers, 4, c.num_kv_heads, c.head_dim,
                                                28)  # (L, B, K, hd, S): 12 + 16 slots.
    for per_layer, stacked in zip(runs["per_layer"], runs["stacked"]):
        np.testing.assert_allclose(stacked.logits, per_layer.logits, atol=1e-5, rtol=0)
        np.testing.assert_array_equal(stacked.tokens, per_layer.tokens)
        np.testing.assert_allclose(stacked.logprobs, per_layer.logprobs, atol=1e-5, rtol=0)
    assert int(runs["stacked"][1].step) == STEPS


def test_auto_is_per_layer_on_cpu_and_stacked_on_accelerators(monkeypatch):
    config = models.load("tiny").config
    assert config.cache_layout == "auto" and not layers.stacks_cache(config)
    assert isinstance(decoder.empty_cache(config, 2, 8, jnp.float32).k, tuple)
    for backend in ("gpu", "tpu"):
        monkeypatch.setattr(jax, "default_backend", lambda backend=backend: backend)
        assert layers.stacks_cache(config)
        assert layers.stacks_cache(dataclasses.replace(config, cache_layout="stacked"))
        assert not layers.stacks_cache(dataclasses.replace(config, cache_layout="per_layer"))


def test_a_model_and_its_options_choose_the_layout():
    model = models.load("tiny", cache_layout="stacked")
    assert model.config.cache_layout == "stacked"
    assert model.with_cache_layout("per_layer").config == dataclasses.replace(
        model.config, cache_layout="per_layer")
    assert loading.Options(cache_layout="per_layer").problems() == []


def test_unknown_layouts_are_clear_errors():
    message = r"cache_layout must be one of \('auto', 'per_layer', 'stacked'\), got 'flat'"
    with pytest.raises(ValueError, match=message):
        models.load("tiny", cache_layout="flat")
    with pytest.raises(ValueError, match=message):
        models.load("tiny").with_cache_layout("flat")
    assert loading.Options(cache_layout="flat").problems() == [
        "cache_layout: unknown 'flat'; choose one of ('auto', 'per_layer', 'stacked')"]
