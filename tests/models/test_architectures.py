"""The architecture registry, and the interface every registered family implements."""

import dataclasses

import flax.traverse_util
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentic_esopt import models
from agentic_esopt.models import architectures, decoder, layers, loading

HF_CONFIG = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=4,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                 linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
                 linear_value_head_dim=8)


def small_config(name):
    return architectures.config_from_hf({**HF_CONFIG, "model_type": name})


def test_the_registry_lists_every_family():
    assert architectures.names() == ("llama", "qwen2", "qwen3", "qwen3_5")
    architectures.register("llama", architectures.get(small_config("llama")))  # Idempotent.
    with pytest.raises(ValueError, match="already registered"):
        architectures.register("llama", architectures.get(small_config("qwen3_5")))


def test_unknown_families_and_layer_types_are_clear_errors():
    with pytest.raises(ValueError, match=r"Unsupported model_type 'gpt2'.*'qwen3_5'"):
        architectures.get(models.ModelConfig(
            model_type="gpt2", vocab_size=8, hidden_size=8, intermediate_size=8,
            num_layers=1, num_heads=2, num_kv_heads=2, head_dim=4))
    hybrid = small_config("qwen3_5")
    with pytest.raises(ValueError, match="llama model has no.*linear_attention"):
        architectures.get(dataclasses.replace(hybrid, model_type="llama"))


@pytest.mark.parametrize("name", architectures.names())
def test_every_family_implements_the_interface(name):
    config = small_config(name)
    architecture = architectures.get(config)
    shapes = decoder.param_shapes(config)
    params = jax.eval_shape(lambda: decoder.init_params(config, jax.random.key(0)))
    assert {path: leaf.shape for path, leaf in
            flax.traverse_util.flatten_dict(params).items()} == shapes
    assert all(architecture.init_constant(path) is None for path in shapes
               if path[-1] == "kernel")
    for path in shapes:  # Every leaf has its HF tensors, one per layer of its stack.
        names = loading.hf_names(config, path)
        layers = config.stacked_layers(path[1]) if path[0] == "layers" else (None,)
        assert [loading.route(config, names[slot]) for slot in names] == [
            (path, layer) for layer in layers]
    assert architectures.config_from_hf(architectures.config_to_hf(config)) == config

    batch, slots = 3, 8
    cache = decoder.empty_cache(config, batch, slots, jnp.float32)
    assert all(leaf.shape[architecture.cache_rows_axis(cache)] == batch
               for leaf in jax.tree.leaves(cache))
    tokens = jnp.zeros((batch, 2), jnp.int32)
    h, new_cache = jax.eval_shape(
        lambda p, c: decoder.forward(config, p, decoder.no_deltas(p), tokens,
                                     jnp.zeros_like(tokens), jnp.ones((batch, slots), bool), c,
                                     jnp.int32(0)), params, cache)
    assert h.shape == (batch, 2, config.hidden_size)
    assert jax.tree.map(lambda x: x.shape, new_cache) == jax.tree.map(lambda x: x.shape, cache)


@pytest.mark.parametrize("name", architectures.names())
def test_a_whole_sequence_needs_no_cache(name):
    config = small_config(name)
    params = decoder.init_params(config, jax.random.key(1))
    ids = np.random.RandomState(0).randint(0, config.vocab_size, (2, 5))
    mask = np.ones_like(ids, bool)
    deltas = decoder.no_deltas(params)
    whole = decoder.hidden_states(config, params, deltas, ids, mask)
    cached, _ = decoder.forward(config, params, deltas, ids, decoder.positions_from_mask(mask),
                                mask, decoder.empty_cache(config, 2, 5, jnp.float32),
                                jnp.int32(0))
    np.testing.assert_allclose(whole, cached, atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", architectures.names())
def test_dense_caches_are_per_layer_or_stacked_and_hybrid_ones_stacked(name):
    for cache_layout in ("per_layer", "stacked"):
        config = dataclasses.replace(small_config(name), cache_layout=cache_layout)
        cache = decoder.empty_cache(config, 3, 8, jnp.float32)
        kv = cache.kv if name == "qwen3_5" else cache
        stacked = cache_layout == "stacked" or name == "qwen3_5"
        attention_layers = len(config.stacked_layers("attn"))
        assert layers.is_stacked(kv) == stacked
        keys = kv.k if stacked else jnp.stack(kv.k)
        assert keys.shape == (attention_layers, 3, 2, 8, 8)  # (L, B, K, hd, S).
        assert architectures.get(config).cache_rows_axis(cache) == (1 if stacked else 0)
        params = jax.eval_shape(lambda: decoder.init_params(config, jax.random.key(0)))
        tokens = jnp.zeros((3, 2), jnp.int32)
        _, new_cache = jax.eval_shape(
            lambda p, c: decoder.forward(config, p, decoder.no_deltas(p), tokens,
                                         jnp.zeros_like(tokens), jnp.ones((3, 8), bool), c,
                                         jnp.int32(0)), params, cache)
        assert jax.tree.map(lambda x: x.shape, new_cache) == jax.tree.map(lambda x: x.shape,
                                                                        cache)
