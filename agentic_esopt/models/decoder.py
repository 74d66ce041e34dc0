"""Decoder-only LLMs as pure functions of a params pytree, for every registered family.

Each entry point asks the config's architecture (``architectures.get``) for what differs
between families (parameter shapes, the forward pass, the cache) and shares the rest:
initialisation, the LM head and whole-sequence logits. Parameter names and the layout of
population perturbations (``layers.Deltas``) are described in ``architectures.dense``
and ``layers``.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import flax.traverse_util
import jax
import jax.numpy as jnp
import numpy as np

from agentic_esopt.models import architectures
from agentic_esopt.models.config import ModelConfig
from agentic_esopt.models.layers import F32, Deltas, member_linear, transposed

PyTree = Any
INIT_STDDEV = 0.02


def param_shapes(config: ModelConfig) -> dict[tuple[str, ...], tuple[int, ...]]:
    """Flat map from parameter path to shape for a config."""
    return architectures.get(config).param_shapes(config)


@functools.partial(jax.jit, static_argnames=("config", "dtype"))
def init_params(config: ModelConfig, key: jax.Array, dtype: Any = jnp.float32) -> PyTree:
    """Random parameters: N(0, 0.02²) matrices, and the constants the architecture starts
    its norms, biases and other vectors at (``Architecture.init_constant``)."""
    constant = architectures.get(config).init_constant
    shapes = sorted(param_shapes(config).items())
    drawn = [(path, shape) for path, shape in shapes if constant(path) is None]
    sizes = [math.prod(shape) for _, shape in drawn]
    draws = INIT_STDDEV * jax.random.normal(key, (sum(sizes),), F32)  # One RNG op compiles fast.
    offsets = np.cumsum([0] + sizes)
    flat = {path: draws[start:start + math.prod(shape)].reshape(shape).astype(dtype)
            for (path, shape), start in zip(drawn, offsets)}
    for path, shape in shapes:
        if path not in flat:
            flat[path] = jnp.full(shape, constant(path), dtype)
    return flax.traverse_util.unflatten_dict(flat)


def no_deltas(params: PyTree) -> Deltas:
    """Deltas of unperturbed inference: the params' structure with None leaves."""
    return Deltas(jax.tree.map(lambda _: None, params), None)


def population_deltas(factors: PyTree, members: jax.Array) -> Deltas:
    """Deltas of a batch whose row b runs member ``members[b]`` of a population.

    Args:
      factors: ``es.noise.population_factors(population, params)`` (member axis first).
      members: (B,) int member index of each batch row.
    """
    stacked = jax.tree.map(lambda x: jnp.moveaxis(x, 0, 1), factors["layers"])
    return Deltas({**factors, "layers": stacked}, members)


def forward(config: ModelConfig, params: PyTree, deltas: Deltas, tokens: jax.Array,
            positions: jax.Array, kv_mask: jax.Array, cache: Any,
            write_index: jax.Array, remat: bool = False, token_mask: jax.Array | None = None
            ) -> tuple[jax.Array, Any]:
    """Runs the decoder over new tokens, attending to the cache; returns final hidden states.

    Args:
      config: model config.
      params: parameters.
      deltas: ``Deltas`` (``no_deltas(params)`` for plain inference).
      tokens: (B, T) new token ids, written to cache slots [write_index, write_index + T).
      positions: (B, T) rotary positions of the new tokens.
      kv_mask: (B, S) True for cache slots holding real tokens (including the new ones).
      cache: the architecture's cache with S slots (``empty_cache``), or None for a whole
        sequence without a persistent cache (then S = T and ``write_index`` is 0).
      write_index: scalar slot of the first new token.
      remat: recompute each layer's activations in the backward pass
        (``jax.checkpoint`` of the layer scan's body) instead of storing them.
      token_mask: (B, T) the real new tokens (default: ``kv_mask``'s slots of them).

    Returns:
      Final-normed hidden states (B, T, d) and the updated cache (None without one).
    """
    return architectures.get(config).forward(config, params, deltas, tokens, positions,
                                             kv_mask, cache, write_index, remat, token_mask)


def empty_cache(config: ModelConfig, batch: int, length: int, dtype: Any) -> Any:
    """The architecture's zero cache with ``length`` attention slots."""
    return architectures.get(config).empty_cache(config, batch, length, dtype)


def lm_head(config: ModelConfig, params: PyTree, deltas: Deltas, h: jax.Array) -> jax.Array:
    """float32 logits (B, ..., V) from final hidden states (tied or untied head)."""
    factors, members = deltas
    if config.tie_word_embeddings:
        return member_linear(h, params["embed"]["embedding"].T,
                             transposed(factors["embed"]["embedding"]), members, F32)
    return member_linear(h, params["lm_head"]["kernel"], factors["lm_head"]["kernel"], members,
                         F32)


def positions_from_mask(attention_mask: jax.Array) -> jax.Array:
    """Rotary positions (B, T) counting only real tokens, so left padding does not shift them."""
    return jnp.maximum(jnp.cumsum(attention_mask.astype(jnp.int32), axis=-1) - 1, 0)


def hidden_states(config: ModelConfig, params: PyTree, deltas: Deltas, input_ids: jax.Array,
                  attention_mask: jax.Array, remat: bool = False) -> jax.Array:
    """Final-normed hidden states (B, T, d) of a (left-)padded batch without a persistent
    cache; ``remat`` recomputes layer activations in the backward pass (see ``forward``)."""
    mask = attention_mask.astype(bool)
    h, _ = forward(config, params, deltas, input_ids, positions_from_mask(mask), mask, None,
                   jnp.int32(0), remat)
    return h


def logits(config: ModelConfig, params: PyTree, deltas: Deltas, input_ids: jax.Array,
           attention_mask: jax.Array) -> jax.Array:
    """float32 logits (B, T, V) of a (left-)padded batch without a persistent cache."""
    return lm_head(config, params, deltas,
                   hidden_states(config, params, deltas, input_ids, attention_mask))
