"""Decoder-only transformer (Llama, Qwen2, Qwen3) as pure functions of a params pytree.

Parameters are a plain nested dict (names follow ``es``' scope conventions):

    embed/embedding (V, d)                 lm_head/kernel (d, V)   (untied models only)
    final_norm/scale (d,)
    layers/input_norm/scale (L, d)         layers/post_attn_norm/scale (L, d)
    layers/attn/{q,k,v,o}_proj/kernel (L, in, out)   [+ bias (L, out)]
    layers/attn/{q,k}_norm/scale (L, head_dim)        (Qwen3, Qwen3.5)
    layers/mlp/{gate,up,down}_proj/kernel (L, in, out)

Qwen3.5 (``config.is_hybrid``, run by ``qwen3_5``) stacks ``layers/attn`` over its
full-attention layers only and adds ``layers/linear_attn`` over its Gated DeltaNet layers
(see ``qwen3_5``); ``config.stacked_layers`` names the layers of each stack.

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

import flax.traverse_util
import jax
import jax.numpy as jnp
import numpy as np

from agentic_esopt.es.noise import LowRank
from agentic_esopt.models.config import ModelConfig, RopeConfig

PyTree = Any
F32 = jnp.float32
INIT_STDDEV = 0.02
_MASKED = float(np.finfo(np.float32).min)


class KVCache(NamedTuple):
    """Key/value cache in the params dtype, one buffer per layer: keys[l]
    (B, num_kv_heads, head_dim, S), values[l] (B, num_kv_heads, S, head_dim) (the hybrid
    models' cache stacks its attention layers instead: (L, B, ...), see ``qwen3_5``).

    Heads come before slots and keys keep their slots last, so both attention products
    are plain matmuls over the cache as it lies (contracting the keys' head_dim as their
    minor axis ran ~10x slower on XLA:CPU at 2k slots). A buffer per layer lets the layer
    scan read each in place (``LayerOf``).
    """

    k: tuple[jax.Array, ...] | jax.Array
    v: tuple[jax.Array, ...] | jax.Array


KEY_SLOTS, VALUE_SLOTS = -1, -2  # The slot axis of a KVCache's keys and values.


def slot_axes(cache: KVCache) -> KVCache:
    """The slot axis of each of a cache's buffers (a tree like ``cache``)."""
    return KVCache((KEY_SLOTS,) * len(cache.k), (VALUE_SLOTS,) * len(cache.v))


def param_shapes(config: ModelConfig) -> dict[tuple[str, ...], tuple[int, ...]]:
    """Flat map from parameter path to shape for a config."""
    c = config
    L, d = c.num_layers, c.hidden_size
    L_attn = len(c.stacked_layers("attn"))
    q_out, kv_out = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    q_width = 2 * q_out if c.attn_output_gate else q_out  # Query and gate per head.
    shapes = {
        ("embed", "embedding"): (c.vocab_size, d),
        ("final_norm", "scale"): (d,),
        ("layers", "input_norm", "scale"): (L, d),
        ("layers", "post_attn_norm", "scale"): (L, d),
    }
    projections = {
        ("attn", "q_proj"): (L_attn, d, q_width, c.qkv_bias),
        ("attn", "k_proj"): (L_attn, d, kv_out, c.qkv_bias),
        ("attn", "v_proj"): (L_attn, d, kv_out, c.qkv_bias),
        ("attn", "o_proj"): (L_attn, q_out, d, c.o_bias),
        ("mlp", "gate_proj"): (L, d, c.intermediate_size, c.mlp_bias),
        ("mlp", "up_proj"): (L, d, c.intermediate_size, c.mlp_bias),
        ("mlp", "down_proj"): (L, c.intermediate_size, d, c.mlp_bias),
    }
    if c.is_hybrid:
        la, L_lin = c.linear_attention, len(c.stacked_layers("linear_attn"))
        heads = la.num_value_heads
        projections.update({
            ("linear_attn", "in_proj_qkv"): (L_lin, d, la.conv_dim, False),
            ("linear_attn", "in_proj_z"): (L_lin, d, la.value_dim, False),
            ("linear_attn", "in_proj_b"): (L_lin, d, heads, False),
            ("linear_attn", "in_proj_a"): (L_lin, d, heads, False),
            ("linear_attn", "out_proj"): (L_lin, la.value_dim, d, False),
        })
        # Per-head and per-channel vectors are named "scale"/"bias": es gives them
        # full-rank noise (the depthwise conv keeps torch's (channels, 1, taps) layout).
        shapes.update({
            ("layers", "linear_attn", "conv1d", "scale"): (L_lin, la.conv_dim, 1,
                                                          la.conv_kernel),
            ("layers", "linear_attn", "A_log", "scale"): (L_lin, heads),
            ("layers", "linear_attn", "dt", "bias"): (L_lin, heads),
            ("layers", "linear_attn", "norm", "scale"): (L_lin, la.value_head_dim),
        })
    for (block, name), (layers, n_in, n_out, bias) in projections.items():
        shapes[("layers", block, name, "kernel")] = (layers, n_in, n_out)
        if bias:
            shapes[("layers", block, name, "bias")] = (layers, n_out)
    if c.qk_norm:
        shapes[("layers", "attn", "q_norm", "scale")] = (L_attn, c.head_dim)
        shapes[("layers", "attn", "k_norm", "scale")] = (L_attn, c.head_dim)
    if not c.tie_word_embeddings:
        shapes[("lm_head", "kernel")] = (d, c.vocab_size)
    return shapes


@functools.partial(jax.jit, static_argnames=("config", "dtype"))
def init_params(config: ModelConfig, key: jax.Array, dtype: Any = jnp.float32) -> PyTree:
    """Random parameters: N(0, 0.02²) matrices and conv taps, constants elsewhere.

    Norm scales start at 1 (0 for Qwen3.5's zero-centred x̂·(1 + w) norms), biases and
    A_log at 0.
    """
    shapes = sorted(param_shapes(config).items())
    drawn = [(path, shape) for path, shape in shapes if _init_constant(config, path) is None]
    sizes = [math.prod(shape) for _, shape in drawn]
    draws = INIT_STDDEV * jax.random.normal(key, (sum(sizes),), F32)  # One RNG op compiles fast.
    offsets = np.cumsum([0] + sizes)
    flat = {path: draws[start:start + math.prod(shape)].reshape(shape).astype(dtype)
            for (path, shape), start in zip(drawn, offsets)}
    for path, shape in shapes:
        if path not in flat:
            flat[path] = jnp.full(shape, _init_constant(config, path), dtype)
    return flax.traverse_util.unflatten_dict(flat)


def _init_constant(config: ModelConfig, path: tuple[str, ...]) -> float | None:
    """The constant a leaf starts at, or None for a random draw."""
    if path[-1] not in ("scale", "bias") or path[-2] == "conv1d":
        return None
    if path[-1] == "bias" or path[-2] == "A_log":
        return 0.0
    zero_centred = config.is_hybrid and path[-2] != "norm"  # All but the gated norm.
    return 0.0 if zero_centred else 1.0


class Deltas(NamedTuple):
    """A batch's perturbations: member-level ``factors`` (see the module docstring; all
    None for unperturbed inference) and ``members`` (B,), the member of each row."""

    factors: PyTree
    members: jax.Array | None


def no_deltas(params: PyTree) -> Deltas:
    """Deltas of unperturbed inference: the params' structure with None leaves."""
    return Deltas(jax.tree.map(lambda _: None, params), None)


def population_deltas(factors: PyTree, members: jax.Array) -> Deltas:
    """Deltas of a batch whose row b runs member ``members[b]`` of a population.

    Args:
      factors: ``es.noise.population_factors(population, params)`` (member axis first).
      members: (B,) int member index of each batch row.
    """
    layers = jax.tree.map(lambda x: jnp.moveaxis(x, 0, 1), factors["layers"])
    return Deltas({**factors, "layers": layers}, members)


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
    """A (perturbed) linear layer with optional bias."""
    y = linear(x, params["kernel"], deltas["kernel"])
    if "bias" in params:
        y = y + row_vector(params["bias"], deltas["bias"], y.ndim)
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


def _layer(config: ModelConfig, h: jax.Array, layer: dict, deltas: dict,
           rope: tuple[jax.Array, jax.Array], masks: tuple[jax.Array, jax.Array],
           cache: KVCache | None, index: jax.Array) -> tuple[jax.Array, KVCache]:
    """Decoder layer ``index`` over new tokens attending to its read-only ``cache`` buffers
    (or no cache: None) and to themselves.

    ``masks`` are (prefix mask (B, T, S), new-token mask (B, T, T)). Returns the new hidden
    states and the new tokens' keys/values (``cache_layout``), which the caller writes to
    the cache after the layer scan (so the cache is never copied inside it).
    """
    c = config
    B, T, _ = h.shape
    attn, attn_deltas = layer["attn"], deltas["attn"]
    x = rms_norm(h, layer["input_norm"]["scale"], deltas["input_norm"]["scale"], c.rms_norm_eps)
    q = project(x, attn["q_proj"], attn_deltas["q_proj"]).reshape(B, T, c.num_heads, c.head_dim)
    k = project(x, attn["k_proj"], attn_deltas["k_proj"]).reshape(B, T, c.num_kv_heads, c.head_dim)
    v = project(x, attn["v_proj"], attn_deltas["v_proj"]).reshape(B, T, c.num_kv_heads, c.head_dim)
    if c.qk_norm:
        q = rms_norm(q, attn["q_norm"]["scale"], attn_deltas["q_norm"]["scale"], c.rms_norm_eps)
        k = rms_norm(k, attn["k_norm"]["scale"], attn_deltas["k_norm"]["scale"], c.rms_norm_eps)
    q, k = apply_rope(q, *rope), apply_rope(k, *rope)
    new = cache_layout(k, v)
    if cache is None:
        attended = attention(q, [(*new, masks[1])])
    else:
        prefix = KVCache(LayerOf(cache.k, index), LayerOf(cache.v, index))
        attended = attention(q, [(*prefix, masks[0]), (*new, masks[1])])
    h = h + project(attended, attn["o_proj"], attn_deltas["o_proj"])
    x = rms_norm(h, layer["post_attn_norm"]["scale"], deltas["post_attn_norm"]["scale"],
                 c.rms_norm_eps)
    return h + mlp(x, layer["mlp"], deltas["mlp"]), new


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


def mlp(x: jax.Array, params: dict, deltas: dict) -> jax.Array:
    """SwiGLU MLP: down(silu(gate(x)) * up(x))."""
    gate = jax.nn.silu(project(x, params["gate_proj"], deltas["gate_proj"]))
    return project(gate * project(x, params["up_proj"], deltas["up_proj"]),
                   params["down_proj"], deltas["down_proj"])


def forward(config: ModelConfig, params: PyTree, deltas: Deltas, tokens: jax.Array,
            positions: jax.Array, kv_mask: jax.Array, cache: KVCache | None,
            write_index: jax.Array, remat: bool = False, token_mask: jax.Array | None = None
            ) -> tuple[jax.Array, KVCache | None]:
    """Runs the decoder over new tokens, attending to the cache; returns final hidden states.

    Args:
      config: model config.
      params: parameters.
      deltas: ``Deltas`` (``no_deltas(params)`` for plain inference).
      tokens: (B, T) new token ids, written to cache slots [write_index, write_index + T).
      positions: (B, T) rotary positions of the new tokens.
      kv_mask: (B, S) True for cache slots holding real tokens (including the new ones).
      cache: the KV cache with S slots (a ``qwen3_5.HybridCache`` for hybrid configs,
        which ``qwen3_5.forward`` runs), or None for a whole sequence without a cache
        (then S = T and ``write_index`` is 0).
      write_index: scalar slot of the first new token.
      remat: recompute each layer's activations in the backward pass
        (``jax.checkpoint`` of the layer scan's body) instead of storing them.
      token_mask: (B, T) the real new tokens (default: ``kv_mask``'s slots of them). A
        padded new token's slot may then hold a cached token (``kv_mask`` True there),
        which it keeps and which the new tokens attend to (attention-only models).

    Returns:
      Final-normed hidden states (B, T, d) and the updated cache.
    """
    if config.is_hybrid:
        from agentic_esopt.models import qwen3_5  # pylint: disable=import-outside-toplevel

        return qwen3_5.forward(config, params, deltas, tokens, positions, kv_mask, cache,
                               write_index, remat)
    T = tokens.shape[1]
    if token_mask is None:
        token_mask = jax.lax.dynamic_slice_in_dim(kv_mask, write_index, T, axis=1)
    new_slots = jax.lax.dynamic_update_slice_in_dim(jnp.zeros_like(kv_mask), token_mask,
                                                    write_index, axis=1)
    cached = kv_mask & ~new_slots
    causal = jnp.arange(T)[:, None] >= jnp.arange(T)[None, :]
    masks = (causal_mask(cached, write_index, T), causal[None] & token_mask[:, None, :])
    factors, members = deltas
    h = embed(tokens, params["embed"]["embedding"], factors["embed"]["embedding"], members)
    rope = rope_tables(config, positions, h.dtype)

    def body(h, xs):
        layer, layer_factors, index = xs
        return _layer(config, h, layer, rows(layer_factors, members), rope, masks, cache, index)

    if remat:
        body = jax.checkpoint(body)
    xs = (params["layers"], factors["layers"], jnp.arange(config.num_layers))
    h, new = jax.lax.scan(body, h, xs)
    if cache is not None:
        cache = jax.tree.map(
            lambda full, written, axis: write_slots(full, written, token_mask, write_index, axis),
            cache, KVCache(*(tuple(x) for x in new)), slot_axes(cache))
    h = rms_norm(h, params["final_norm"]["scale"], rows(factors["final_norm"]["scale"], members),
                 config.rms_norm_eps)
    return h, cache


def write_slots(full: jax.Array, new: jax.Array, token_mask: jax.Array,
                write_index: jax.Array, slot_axis: int) -> jax.Array:
    """A layer's new keys or values (laid out like its cache buffer, T slots) written in
    place into the buffer (S slots on ``slot_axis``) from slot ``write_index`` where
    ``token_mask`` (B, T) marks them real (a padded slot keeps what it held: a row's
    cached prefix may sit there)."""
    slot_axis %= full.ndim
    real = jnp.expand_dims(token_mask, [a for a in range(full.ndim) if a not in (0, slot_axis)])
    held = jax.lax.dynamic_slice_in_dim(full, write_index, new.shape[slot_axis], slot_axis)
    return jax.lax.dynamic_update_slice_in_dim(
        full, jnp.where(real, new.astype(full.dtype), held), write_index, slot_axis)


def causal_mask(kv_mask: jax.Array, write_index: jax.Array, length: int) -> jax.Array:
    """(B, T, S) attention mask of T = ``length`` new tokens written from ``write_index``.

    A new token attends to the real slots (``kv_mask`` (B, S)) at or before its own.
    """
    query_slots = write_index + jnp.arange(length)
    causal = jnp.arange(kv_mask.shape[1])[None, :] <= query_slots[:, None]  # (T, S)
    return causal[None] & kv_mask[:, None, :]


def lm_head(config: ModelConfig, params: PyTree, deltas: Deltas, h: jax.Array) -> jax.Array:
    """float32 logits (B, ..., V) from final hidden states (tied or untied head)."""
    factors, members = deltas
    if config.tie_word_embeddings:
        return member_linear(h, params["embed"]["embedding"].T,
                             transposed(factors["embed"]["embedding"]), members, F32)
    return member_linear(h, params["lm_head"]["kernel"], factors["lm_head"]["kernel"], members,
                         F32)


def empty_cache(config: ModelConfig, batch: int, length: int, dtype: Any) -> Any:
    """A zero KV cache with ``length`` slots (``qwen3_5.HybridCache`` for hybrid models)."""
    if config.is_hybrid:
        from agentic_esopt.models import qwen3_5  # pylint: disable=import-outside-toplevel

        return qwen3_5.empty_cache(config, batch, length, dtype)
    return empty_kv_cache(config, config.num_layers, batch, length, dtype)


def empty_kv_cache(config: ModelConfig, layers: int, batch: int, length: int,
                   dtype: Any) -> KVCache:
    """A zero KV cache of ``layers`` attention layers with ``length`` slots."""
    heads = (batch, config.num_kv_heads)
    return KVCache(tuple(jnp.zeros((*heads, config.head_dim, length), dtype)
                         for _ in range(layers)),
                   tuple(jnp.zeros((*heads, length, config.head_dim), dtype)
                         for _ in range(layers)))


def positions_from_mask(attention_mask: jax.Array) -> jax.Array:
    """Rotary positions (B, T) counting only real tokens, so left padding does not shift them."""
    return jnp.maximum(jnp.cumsum(attention_mask.astype(jnp.int32), axis=-1) - 1, 0)


def hidden_states(config: ModelConfig, params: PyTree, deltas: Deltas, input_ids: jax.Array,
                  attention_mask: jax.Array, remat: bool = False) -> jax.Array:
    """Final-normed hidden states (B, T, d) of a (left-)padded batch without a persistent
    cache; ``remat`` recomputes layer activations in the backward pass (see ``forward``)."""
    mask = attention_mask.astype(bool)
    # Hybrid models carry their recurrent states in a cache; attention-only models need none.
    cache = (empty_cache(config, input_ids.shape[0], input_ids.shape[1],
                         params["embed"]["embedding"].dtype) if config.is_hybrid else None)
    h, _ = forward(config, params, deltas, input_ids, positions_from_mask(mask), mask, cache,
                   jnp.int32(0), remat)
    return h


def logits(config: ModelConfig, params: PyTree, deltas: Deltas, input_ids: jax.Array,
           attention_mask: jax.Array) -> jax.Array:
    """float32 logits (B, T, V) of a (left-)padded batch without a persistent cache."""
    return lm_head(config, params, deltas,
                   hidden_states(config, params, deltas, input_ids, attention_mask))
