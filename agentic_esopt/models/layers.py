"""Building blocks shared by the model families: population-aware linear maps, norms,
rotary embeddings, attention and KV-cache helpers, all pure functions.

Population perturbations arrive as ``Deltas``: member-level factors (a tree with the
params' structure whose leaves are None (unperturbed), ``es.noise.LowRank`` factors
(matrices; a (G, in, r), b (G, out, r)) or dense deltas (G, n) (vectors); layer leaves
carry the stacked axis first: (L, G, ...)) and the member of each of the B batch rows. A
layer's per-row deltas (B, ...) are gathered (``rows``) inside the layer scan, so only one
layer's exist at a time; the vocabulary-wide factors of the embedding and LM head stay
member-level (``embed``, ``member_linear``). Every matrix product goes through ``linear``
or ``member_linear`` (and the embedding lookup through ``embed``), which add row b's
low-rank delta (x a_b) b_bᵀ without materialising per-member weights.
"""

from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from agentic_esopt.es.noise import LowRank
from agentic_esopt.models.config import ModelConfig, RopeConfig

PyTree = Any
F32 = jnp.float32
_MASKED = float(np.finfo(np.float32).min)


class KVCache(NamedTuple):
    """Key/value cache in the params dtype, in one of two layouts
    (``ModelConfig.cache_layout``):

    * per layer (tuples): keys[l] (B, num_kv_heads, head_dim, S), values[l]
      (B, num_kv_heads, S, head_dim). The layer scan reads buffer l in place through a
      switch over the layers (``LayerOf``); the default on CPU.
    * stacked (arrays): keys (L, B, num_kv_heads, head_dim, S), values
      (L, B, num_kv_heads, S, head_dim), carried through the layer scan and written in
      place (``stacked_attention``); no conditional inside the scan, the default on
      GPU/TPU. The hybrid models' cache is always stacked (``architectures.qwen3_5``).

    Heads come before slots and keys keep their slots last, so both attention products
    are plain matmuls over the cache as it lies (contracting the keys' head_dim as their
    minor axis ran ~10x slower on XLA:CPU at 2k slots).
    """

    k: tuple[jax.Array, ...] | jax.Array
    v: tuple[jax.Array, ...] | jax.Array


KEY_SLOTS, VALUE_SLOTS = -1, -2  # The slot axis of a KVCache's keys and values.


def stacks_cache(config: ModelConfig) -> bool:
    """Whether a dense model's cache is stacked: ``config.cache_layout``, "auto" meaning
    per-layer buffers on CPU (XLA:CPU copies a scan's dynamic slice of a stacked cache,
    see ``LayerOf``) and a stacked one on GPU/TPU (no conditional inside the scan)."""
    if config.cache_layout == "auto":
        return jax.default_backend() != "cpu"
    return config.cache_layout == "stacked"


def is_stacked(cache: KVCache) -> bool:
    """Whether ``cache`` is in the stacked layout (arrays, not per-layer tuples)."""
    return not isinstance(cache.k, tuple)


def rows_axis(cache: KVCache) -> int:
    """The batch-row axis of a cache's buffers: 1 when stacked (L, B, ...), else 0."""
    return int(is_stacked(cache))


def slot_axes(cache: KVCache) -> KVCache:
    """The slot axis of each of a cache's buffers (a tree like ``cache``)."""
    if is_stacked(cache):
        return KVCache(KEY_SLOTS, VALUE_SLOTS)
    return KVCache((KEY_SLOTS,) * len(cache.k), (VALUE_SLOTS,) * len(cache.v))


class Deltas(NamedTuple):
    """A batch's perturbations: member-level ``factors`` (see the module docstring; all
    None for unperturbed inference) and ``members`` (B,), the member of each row."""

    factors: PyTree
    members: jax.Array | None


def rows(factors: PyTree, members: jax.Array | None) -> PyTree:
    """Each row's deltas (B, ...) from member-level ``factors`` (G, ...) (a subtree of
    ``Deltas.factors``, a layer's slice for stacked leaves)."""
    return jax.tree.map(lambda x: jnp.take(x, members, axis=0), factors)


def linear(x: jax.Array, kernel: jax.Array, delta: LowRank | None = None,
           out_dtype: Any = None) -> jax.Array:
    """y = x @ (kernel + a_b b_bᵀ) for each batch row b, without forming a_b b_bᵀ.

    Args:
      x: (B, ..., in) activations.
      kernel: (in, out).
      delta: None, or ``LowRank`` with a (B, in, r) and b (B, out, r) (float32).
      out_dtype: result dtype (default ``x.dtype``); accumulation is float32.
    """
    y = jnp.einsum("...i,io->...o", x, kernel, preferred_element_type=F32)
    if delta is not None:
        xa = jnp.einsum("b...i,bir->b...r", x.astype(F32), delta.a)
        y = y + jnp.einsum("b...r,bor->b...o", xa, delta.b)
    return y.astype(out_dtype or x.dtype)


def member_linear(x: jax.Array, kernel: jax.Array, delta: LowRank | None,
                  members: jax.Array | None, out_dtype: Any = None) -> jax.Array:
    """``linear`` with member-level factors (a (G, in, r), b (G, out, r)), row b using
    member ``members[b]``'s; for vocabulary-wide out sides (the LM head).

    x a is gathered per row, but (x a) bᵀ is one product with every member's b, each row
    selecting its own by a one-hot, so no per-row (B, out, r) factor is formed (at G·r
    extra multiply-adds per output).
    """
    y = linear(x, kernel, out_dtype=F32)
    if delta is not None:
        xa = jnp.einsum("b...i,bir->b...r", x.astype(F32), jnp.take(delta.a, members, axis=0))
        own = jax.nn.one_hot(members, delta.b.shape[0], dtype=F32)  # (B, G)
        xa = jnp.einsum("b...r,bg->b...gr", xa, own)
        y = y + jnp.einsum("b...gr,gor->b...o", xa, delta.b)
    return y.astype(out_dtype or x.dtype)


def embed(tokens: jax.Array, table: jax.Array, delta: LowRank | None = None,
          members: jax.Array | None = None) -> jax.Array:
    """Rows of (table + a_m b_mᵀ) for tokens (B, T) -> (B, T, d), row b using member
    m = ``members[b]``'s factors (a (G, V, r), b (G, d, r)), without forming the table or
    gathering a per row."""
    h = jnp.take(table, tokens, axis=0)
    if delta is None:
        return h
    a_rows = delta.a[members[:, None], tokens]  # (B, T, r)
    shift = jnp.einsum("btr,bdr->btd", a_rows, jnp.take(delta.b, members, axis=0))
    return (h.astype(F32) + shift).astype(h.dtype)


def transposed(delta: LowRank | None) -> LowRank | None:
    """The factors of the transposed delta: (a bᵀ)ᵀ = b aᵀ."""
    return None if delta is None else LowRank(delta.b, delta.a)


def row_vector(vector: jax.Array, delta: jax.Array | None, ndim: int) -> jax.Array:
    """vector (n,) plus row b's delta (B, n), shaped to broadcast against (B, ..., n)."""
    if delta is None:
        return vector
    perturbed = (vector.astype(F32) + delta).astype(vector.dtype)
    return perturbed.reshape(perturbed.shape[0], *(1,) * (ndim - 2), perturbed.shape[-1])


def project(x: jax.Array, params: dict, deltas: dict) -> jax.Array:
    """A (perturbed) linear layer with optional bias, and a LoRA adapter if the params
    have one: + lora_scale · (x lora_a) lora_b, each factor with its own deltas
    (``models.lora``)."""
    y = linear(x, params["kernel"], deltas["kernel"])
    if "bias" in params:
        y = y + row_vector(params["bias"], deltas["bias"], y.ndim)
    if "lora_a" in params:
        hidden = linear(x, params["lora_a"], deltas["lora_a"])
        update = linear(hidden, params["lora_b"], deltas["lora_b"], out_dtype=F32)
        y = (y.astype(F32) + params["lora_scale"] * update).astype(y.dtype)
    return y


def rms_norm(x: jax.Array, scale: jax.Array, delta: jax.Array | None, eps: float) -> jax.Array:
    """RMSNorm normalising in float32, scaled in x's dtype (as transformers does)."""
    xf = x.astype(F32)
    normed = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
    return row_vector(scale, delta, x.ndim) * normed.astype(x.dtype)


def rope_inverse_frequencies(head_dim: int, rope: RopeConfig) -> np.ndarray:
    """(head_dim/2,) float32 inverse frequencies, with linear or Llama-3 scaling."""
    inv_freq = 1.0 / rope.theta ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim)
    inv_freq = inv_freq.astype(np.float32)
    if rope.kind == "linear":
        return inv_freq / np.float32(rope.factor)
    if rope.kind != "llama3":
        return inv_freq
    old_len = rope.original_max_position_embeddings
    low_freq_wavelen = old_len / rope.low_freq_factor
    high_freq_wavelen = old_len / rope.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = np.where(wavelen > low_freq_wavelen, inv_freq / rope.factor, inv_freq)
    smooth = (old_len / wavelen - rope.low_freq_factor) / (
        rope.high_freq_factor - rope.low_freq_factor)
    smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
    is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return np.where(is_medium, smoothed, scaled).astype(np.float32)


def rope_tables(config: ModelConfig, positions: jax.Array, dtype: Any
                ) -> tuple[jax.Array, jax.Array]:
    """cos and sin (B, T, 1, rotary_dim) for integer positions (B, T)."""
    inv_freq = jnp.asarray(rope_inverse_frequencies(config.rotary_dim, config.rope))
    angles = positions.astype(F32)[..., None] * inv_freq
    angles = jnp.concatenate([angles, angles], axis=-1)[:, :, None, :]
    return jnp.cos(angles).astype(dtype), jnp.sin(angles).astype(dtype)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """Rotates the first rotary_dim dims of (B, T, heads, head_dim) (rotate-half)."""
    rotary_dim = cos.shape[-1]
    x, rest = x[..., :rotary_dim], x[..., rotary_dim:]
    half = rotary_dim // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return jnp.concatenate([x * cos + rotated * sin, rest], axis=-1)


class LayerOf(NamedTuple):
    """Buffer ``index`` of a per-layer cache's ``buffers``, which attention reads where it
    lies: each product with it is a switch over the layers whose branch l is one matmul
    with buffer l (XLA:CPU copies a layer scan's dynamic slice of a stacked cache before
    the matmuls read it, which made a batch-64 decode step at 2,048 slots take 2x as
    long)."""

    buffers: tuple[jax.Array, ...]
    index: jax.Array

    @property
    def shape(self) -> tuple[int, ...]:
        return self.buffers[0].shape

    @property
    def dtype(self) -> Any:
        return self.buffers[0].dtype


def contract(spec: str, x: jax.Array, y: jax.Array | LayerOf) -> jax.Array:
    """``einsum(spec, x, y)`` accumulated in float32; ``y`` may be a ``LayerOf``."""
    if isinstance(y, LayerOf):
        branches = [functools.partial(lambda layer, x, ys: contract(spec, x, ys[layer]), layer)
                    for layer in range(len(y.buffers))]
        return jax.lax.switch(y.index, branches, x, y.buffers)
    return jnp.einsum(spec, x, y, preferred_element_type=F32)


def attention(q: jax.Array, blocks: list[tuple[Any, Any, jax.Array]]) -> jax.Array:
    """Grouped-query attention over one or more blocks of keys/values.

    Keys stay in blocks (e.g. a read-only cache and the new tokens' own keys) so that no
    block is copied to join them, nor their scores: each block's scores are exponentiated
    against the maximum over all blocks, and the blocks' weighted values are summed and
    normalised once.

    Args:
      q: (B, T, H, hd) queries.
      blocks: (k, v, mask) triples: keys (B, K, hd, S_i) and values (B, K, S_i, hd) (the
        ``KVCache`` layout; arrays or ``LayerOf``), with H a multiple of K, and a
        (B, T, S_i) bool mask, True where a query may attend to a key.

    Returns:
      (B, T, H * hd).
    """
    B, T, H, hd = q.shape
    K = blocks[0][0].shape[1]
    q = jnp.moveaxis(q.reshape(B, T, K, H // K, hd), 1, 3)  # (B, K, G, T, hd)
    scores = [jnp.where(mask[:, None, None],
                        contract("bkgth,bkhs->bkgts", q, k) / math.sqrt(hd), _MASKED)
              for k, _, mask in blocks]
    peak = functools.reduce(jnp.maximum, [s.max(axis=-1, keepdims=True) for s in scores])
    weights = [jnp.exp(s - peak) for s in scores]
    total = sum(w.sum(axis=-1, keepdims=True) for w in weights)
    out = sum(contract("bkgts,bksh->bkgth", w.astype(v.dtype), v)
              for w, (_, v, _) in zip(weights, blocks))
    return jnp.moveaxis((out / total).astype(blocks[0][1].dtype), 3, 1).reshape(B, T, H * hd)


def cache_layout(k: jax.Array, v: jax.Array) -> KVCache:
    """New keys and values (B, T, K, hd) in the cache's layout (see ``KVCache``)."""
    return KVCache(jnp.moveaxis(k, 1, -1), jnp.swapaxes(v, 1, 2))


def cached_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array,
                     cache: KVCache, index: jax.Array, write_index: jax.Array
                     ) -> tuple[jax.Array, KVCache]:
    """Writes new keys/values (B, T, K, hd) into layer ``index`` of the cache, then attends
    (B, T, H*hd) with ``mask`` (B, T, S) (the hybrid models' path: their stacked cache
    (L, B, ...) rides in the layer scan's carry with the recurrent states)."""
    new = cache_layout(k, v)
    cache = KVCache(jax.lax.dynamic_update_slice(cache.k, new.k[None].astype(cache.k.dtype),
                                                 (index, 0, 0, 0, write_index)),
                    jax.lax.dynamic_update_slice(cache.v, new.v[None].astype(cache.v.dtype),
                                                 (index, 0, 0, write_index, 0)))
    return attention(q, [(cache.k[index], cache.v[index], mask)]), cache


def fused_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array) -> jax.Array:
    """Grouped-query attention (B, T, H * hd) of queries (B, T, H, hd) over one block of
    keys (B, K, hd, S) and values (B, K, S, hd) (the ``KVCache`` layout) with a
    (B, T, S) mask, through ``jax.nn.dot_product_attention`` (its default implementation,
    XLA's; the transposes to its (B, S, K, hd) layout are left for XLA to fold into the
    products)."""
    B, T, H, hd = q.shape
    out = jax.nn.dot_product_attention(q.astype(v.dtype), jnp.moveaxis(k, -1, 1),
                                       jnp.swapaxes(v, 1, 2), mask=mask[:, None])
    return out.reshape(B, T, H * hd)


def stacked_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array,
                      token_mask: jax.Array, cache: KVCache, index: jax.Array,
                      write_index: jax.Array) -> tuple[jax.Array, KVCache]:
    """Writes new keys/values (B, T, K, hd) in place into layer ``index`` of a stacked
    cache (L, B, ...) from slot ``write_index`` where ``token_mask`` (B, T) marks them
    real, then attends (``fused_attention``) over the layer's slots with ``mask``
    (B, T, S); returns the attended (B, T, H * hd) and the cache (the dense models'
    stacked layout: the cache rides in the layer scan's carry)."""
    cache = jax.tree.map(
        lambda full, new, axis: write_slots(full, new, token_mask, write_index, axis, index),
        cache, cache_layout(k, v), slot_axes(cache))
    return fused_attention(q, cache.k[index], cache.v[index], mask), cache


def mlp(x: jax.Array, params: dict, deltas: dict) -> jax.Array:
    """SwiGLU MLP: down(silu(gate(x)) * up(x))."""
    gate = jax.nn.silu(project(x, params["gate_proj"], deltas["gate_proj"]))
    return project(gate * project(x, params["up_proj"], deltas["up_proj"]),
                   params["down_proj"], deltas["down_proj"])


def write_slots(full: jax.Array, new: jax.Array, token_mask: jax.Array,
                write_index: jax.Array, slot_axis: int, layer: jax.Array | None = None
                ) -> jax.Array:
    """A layer's new keys or values (laid out like its cache buffer (B, ...), T slots)
    written in place into the buffer (S slots on ``slot_axis``), or with ``layer`` into
    that layer of a stacked buffer (L, B, ...), from slot ``write_index`` where
    ``token_mask`` (B, T) marks them real (a padded slot keeps what it held: a row's
    cached prefix may sit there)."""
    slot_axis %= full.ndim
    rows = 0 if layer is None else 1
    new = new if layer is None else new[None]
    real = jnp.expand_dims(token_mask, [a for a in range(full.ndim) if a not in (rows, slot_axis)])
    starts = [write_index if a == slot_axis else layer if a < rows else 0
              for a in range(full.ndim)]
    held = jax.lax.dynamic_slice(full, starts, new.shape)
    return jax.lax.dynamic_update_slice(
        full, jnp.where(real, new.astype(full.dtype), held), starts)


def causal_mask(kv_mask: jax.Array, write_index: jax.Array, length: int) -> jax.Array:
    """(B, T, S) attention mask of T = ``length`` new tokens written from ``write_index``.

    A new token attends to the real slots (``kv_mask`` (B, S)) at or before its own.
    """
    query_slots = write_index + jnp.arange(length)
    causal = jnp.arange(kv_mask.shape[1])[None, :] <= query_slots[:, None]  # (T, S)
    return causal[None] & kv_mask[:, None, :]


def empty_kv_cache(config: ModelConfig, layers: int, batch: int, length: int,
                   dtype: Any, stacked: bool = False) -> KVCache:
    """A zero KV cache of ``layers`` attention layers with ``length`` slots, per layer or
    ``stacked``."""
    heads = (batch, config.num_kv_heads)
    shapes = ((*heads, config.head_dim, length), (*heads, length, config.head_dim))
    if stacked:
        return KVCache(*(jnp.zeros((layers, *shape), dtype) for shape in shapes))
    return KVCache(*(tuple(jnp.zeros(shape, dtype) for _ in range(layers))
                     for shape in shapes))
