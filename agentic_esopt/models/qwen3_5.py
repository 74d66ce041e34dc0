"""Qwen3.5: a hybrid of Gated DeltaNet linear-attention and gated full-attention layers.

Same contract as ``decoder`` (pure functions of config, params, deltas, tokens and a
cache; every projection through ``decoder.project``). Differences from Qwen3:

* RMSNorms are zero-centred, x̂·(1 + w) in float32, except the DeltaNet output norm,
  which is a plain RMSNorm gated by silu(z);
* full attention: q_proj emits a query and an output gate per head, RoPE rotates only the
  first ``rotary_dim`` dims of each head, and the output is multiplied by σ(gate);
* Gated DeltaNet layers (``layers/linear_attn``, stacked over the linear layers):
  in_proj_qkv → depthwise causal conv1d (``conv1d/scale``, torch's (C, 1, taps) layout)
  → SiLU → L2-normed q, k; β = σ(in_proj_b x), g = −exp(A_log)·softplus(in_proj_a x +
  dt/bias); key heads are repeated to the value heads; the delta rule
  S ← exp(g)·S + k (β (v − Sᵀk))ᵀ runs chunked over prompts (``chunked_delta_rule``)
  and one token at a time when decoding (``recurrent_delta_rule``).

The layer stack runs as a ``lax.scan`` over groups of layers that repeat the same pattern
of layer types (e.g. three linear then one full attention). Padded (masked) positions
are identities on the conv input and the recurrent state.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from agentic_esopt.models import decoder
from agentic_esopt.models.config import ModelConfig

PyTree = Any
F32 = jnp.float32
CHUNK_SIZE = 64
L2_EPS = 1e-6


class HybridCache(NamedTuple):
    """Generation state of a hybrid model.

    Attributes:
      kv: keys (L_attn, B, K, head_dim, S) and values (L_attn, B, K, S, head_dim) of the
        full-attention layers, stacked (they ride in the layer scan's carry).
      conv: (L_lin, B, conv_kernel - 1, conv_dim) last inputs of each depthwise conv.
      recurrent: (L_lin, B, value_heads, key_head_dim, value_head_dim) float32 states.
    """

    kv: decoder.KVCache
    conv: jax.Array
    recurrent: jax.Array


def empty_cache(config: ModelConfig, batch: int, length: int, dtype: Any) -> HybridCache:
    """A zero cache with ``length`` attention slots."""
    la, n_lin = config.linear_attention, len(config.stacked_layers("linear_attn"))
    kv = decoder.KVCache(*(jnp.stack(buffers) for buffers in decoder.empty_kv_cache(
        config, len(config.stacked_layers("attn")), batch, length, dtype)))
    conv = jnp.zeros((n_lin, batch, la.conv_kernel - 1, la.conv_dim), dtype)
    recurrent = jnp.zeros((n_lin, batch, la.num_value_heads, la.key_head_dim,
                           la.value_head_dim), F32)
    return HybridCache(kv, conv, recurrent)


def layer_pattern(config: ModelConfig) -> tuple[str, ...]:
    """The shortest prefix of the layer types that the whole stack repeats."""
    kinds = config.kinds
    return next(kinds[:period] for period in range(1, len(kinds) + 1)
                if kinds == kinds[:period] * (len(kinds) // period))


def zero_centred_rms_norm(x: jax.Array, weight: jax.Array, delta: jax.Array | None,
                          eps: float) -> jax.Array:
    """x̂·(1 + w), computed in float32 and cast back to x's dtype."""
    xf = x.astype(F32)
    normed = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
    return (normed * (1.0 + decoder.row_vector(weight, delta, x.ndim).astype(F32))
            ).astype(x.dtype)


def gated_rms_norm(x: jax.Array, gate: jax.Array, weight: jax.Array,
                   delta: jax.Array | None, eps: float) -> jax.Array:
    """RMSNorm(x)·w·silu(gate), the gate applied in float32."""
    normed = decoder.rms_norm(x, weight, delta, eps).astype(F32)
    return (normed * jax.nn.silu(gate.astype(F32))).astype(x.dtype)


def l2_normalize(x: jax.Array) -> jax.Array:
    """x / sqrt(|x|² + 1e-6) along the last axis (float32)."""
    x = x.astype(F32)
    return x * jax.lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + L2_EPS)


def causal_conv(x: jax.Array, weight: jax.Array, delta: jax.Array | None,
                state: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Depthwise causal conv1d with SiLU, continuing from the previous inputs.

    Args:
      x: (B, T, C) new inputs.
      weight: (C, 1, taps) per-channel taps.
      delta: None or (B, C, 1, taps) per-row perturbation of the taps.
      state: (B, taps - 1, C) inputs preceding x.

    Returns:
      silu(conv) (B, T, C) in x's dtype and the new state (the last taps - 1 inputs).
    """
    T, taps = x.shape[1], weight.shape[-1]
    if delta is not None:
        weight = (weight.astype(F32) + delta).astype(weight.dtype)[:, None]  # (B, 1, C, 1, k)
    weight = weight[..., 0, :].astype(F32)  # (C, k) or (B, 1, C, k)
    inputs = jnp.concatenate([state.astype(x.dtype), x], axis=1)
    out = sum(inputs[:, i:i + T].astype(F32) * weight[..., i] for i in range(taps))
    return jax.nn.silu(out.astype(x.dtype)), inputs[:, T:]


def recurrent_delta_rule(q: jax.Array, k: jax.Array, v: jax.Array, g: jax.Array,
                         beta: jax.Array, state: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Gated delta rule one token at a time (float32).

    Args:
      q, k: (B, T, H, dk) normalised queries (already scaled) and keys.
      v: (B, T, H, dv) values.
      g: (B, T, H) log decays (<= 0); beta: (B, T, H) write strengths.
      state: (B, H, dk, dv) initial state.

    Returns:
      Outputs (B, T, H, dv) and the final state.
    """

    def step(state, xs):
        q_t, k_t, v_t, g_t, beta_t = xs
        state = state * jnp.exp(g_t)[..., None, None]
        predicted = jnp.einsum("bhkv,bhk->bhv", state, k_t)
        update = (v_t - predicted) * beta_t[..., None]
        state = state + k_t[..., None] * update[..., None, :]
        return state, jnp.einsum("bhkv,bhk->bhv", state, q_t)

    xs = tuple(jnp.moveaxis(x, 1, 0) for x in (q, k, v, g, beta))
    state, out = jax.lax.scan(step, state, xs)
    return jnp.moveaxis(out, 0, 1), state


def chunked_delta_rule(q: jax.Array, k: jax.Array, v: jax.Array, g: jax.Array,
                       beta: jax.Array, state: jax.Array, chunk_size: int = CHUNK_SIZE
                       ) -> tuple[jax.Array, jax.Array]:
    """The gated delta rule over chunks (same arguments and results as the recurrent form).

    Within a chunk, the delta-rule writes are condensed by a unit lower-triangular solve
    (the WY/UT transform); only the state is carried from chunk to chunk. Decays enter as
    exp of differences of cumulative log decays, never above 1, so float32 stays stable.
    """
    B, T, H, dk = k.shape
    C = min(chunk_size, T)
    pad = -T % C
    q, k, v, g, beta = (jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2))
                        for x in (q, k, v, g, beta))  # Padded steps: k = 0, g = 0: identity.
    n = (T + pad) // C

    def chunks(x):  # (B, T', H, ...) -> (B, H, n, C, ...)
        return jnp.moveaxis(x.reshape(B, n, C, H, *x.shape[3:]), 3, 1)

    q, k, v, g, beta = map(chunks, (q, k, v, g, beta))
    cum = jnp.cumsum(g, axis=-1)  # (B, H, n, C) log decay from the chunk start.
    lower = jnp.tril(jnp.ones((C, C), bool))
    decay = jnp.exp(jnp.where(lower, cum[..., :, None] - cum[..., None, :], -jnp.inf))
    k_beta = k * beta[..., None]
    system = jnp.einsum("...id,...jd->...ij", k_beta, k) * decay
    system = jnp.where(jnp.tril(lower, -1), system, 0.0) + jnp.eye(C, dtype=F32)
    rhs = jnp.concatenate([v * beta[..., None], k_beta * jnp.exp(cum)[..., None]], axis=-1)
    solved = jax.lax.linalg.triangular_solve(system, rhs, left_side=True, lower=True,
                                             unit_diagonal=True)
    values, decayed_keys = solved[..., :v.shape[-1]], solved[..., v.shape[-1]:]
    intra = jnp.einsum("...id,...jd->...ij", q, k) * decay
    q_decayed = q * jnp.exp(cum)[..., None]
    k_to_end = k * jnp.exp(cum[..., -1:] - cum)[..., None]
    chunk_decay = jnp.exp(cum[..., -1])[..., None, None]

    def step(state, xs):
        values, decayed_keys, intra, q_decayed, k_to_end, chunk_decay = xs
        new_values = values - decayed_keys @ state
        out = q_decayed @ state + intra @ new_values
        state = state * chunk_decay + jnp.swapaxes(k_to_end, -1, -2) @ new_values
        return state, out

    xs = tuple(jnp.moveaxis(x, 2, 0) for x in (values, decayed_keys, intra, q_decayed,
                                               k_to_end, chunk_decay))
    state, out = jax.lax.scan(step, state, xs)  # out: (n, B, H, C, dv)
    out = jnp.moveaxis(out, 0, 2).reshape(B, H, n * C, -1)[:, :, :T]
    return jnp.swapaxes(out, 1, 2), state


def gated_delta_net(config: ModelConfig, x: jax.Array, params: dict, deltas: dict,
                    real: jax.Array, conv_state: jax.Array, state: jax.Array
                    ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """A Gated DeltaNet token mixer.

    Args:
      config: model config.
      x: (B, T, d) normed hidden states.
      params, deltas: the layer's ``linear_attn`` params and row deltas.
      real: (B, T) False at padded positions (no effect on the conv or the state).
      conv_state, state: this layer's slices of ``HybridCache.conv`` / ``.recurrent``.

    Returns:
      (B, T, d) output and the new conv and recurrent states.
    """
    la = config.linear_attention
    B, T, _ = x.shape
    x = jnp.where(real[..., None], x, 0)
    qkv = decoder.project(x, params["in_proj_qkv"], deltas["in_proj_qkv"])
    qkv, conv_state = causal_conv(qkv, params["conv1d"]["scale"], deltas["conv1d"]["scale"],
                                  conv_state)
    key_dim = la.num_key_heads * la.key_head_dim
    q, k, v = jnp.split(qkv, [key_dim, 2 * key_dim], axis=-1)
    repeats = la.num_value_heads // la.num_key_heads
    q, k = (jnp.repeat(l2_normalize(t.reshape(B, T, la.num_key_heads, la.key_head_dim)),
                       repeats, axis=2) for t in (q, k))
    q = q * la.key_head_dim ** -0.5
    v = v.reshape(B, T, la.num_value_heads, la.value_head_dim).astype(F32)
    beta = jax.nn.sigmoid(decoder.project(x, params["in_proj_b"], deltas["in_proj_b"]))
    a = decoder.project(x, params["in_proj_a"], deltas["in_proj_a"]).astype(F32)
    rate = jnp.exp(decoder.row_vector(params["A_log"]["scale"], deltas["A_log"]["scale"],
                                      3).astype(F32))
    dt_bias = decoder.row_vector(params["dt"]["bias"], deltas["dt"]["bias"], 3).astype(F32)
    g = jnp.where(real[..., None], -rate * jax.nn.softplus(a + dt_bias), 0.0)
    beta = jnp.where(real[..., None], beta.astype(F32), 0.0)
    rule = recurrent_delta_rule if T == 1 else chunked_delta_rule
    out, state = rule(q, k, v, g, beta, state)
    z = decoder.project(x, params["in_proj_z"], deltas["in_proj_z"])
    out = gated_rms_norm(out.astype(x.dtype), z.reshape(out.shape), params["norm"]["scale"],
                         deltas["norm"]["scale"], config.rms_norm_eps)
    out = decoder.project(out.reshape(B, T, la.value_dim), params["out_proj"],
                          deltas["out_proj"])
    return out, conv_state, state


def gated_attention(config: ModelConfig, x: jax.Array, params: dict, deltas: dict,
                    rope: tuple[jax.Array, jax.Array], mask: jax.Array,
                    kv: decoder.KVCache, index: jax.Array, write_index: jax.Array
                    ) -> tuple[jax.Array, decoder.KVCache]:
    """Full attention with zero-centred q/k norms, partial RoPE and an output gate."""
    c = config
    B, T, _ = x.shape
    norm = zero_centred_rms_norm
    q = decoder.project(x, params["q_proj"], deltas["q_proj"])
    if c.attn_output_gate:
        q, gate = jnp.split(q.reshape(B, T, c.num_heads, 2 * c.head_dim), 2, axis=-1)
    q = norm(q.reshape(B, T, c.num_heads, c.head_dim), params["q_norm"]["scale"],
             deltas["q_norm"]["scale"], c.rms_norm_eps)
    k = norm(decoder.project(x, params["k_proj"], deltas["k_proj"]).reshape(
        B, T, c.num_kv_heads, c.head_dim), params["k_norm"]["scale"],
             deltas["k_norm"]["scale"], c.rms_norm_eps)
    v = decoder.project(x, params["v_proj"], deltas["v_proj"]).reshape(
        B, T, c.num_kv_heads, c.head_dim)
    q, k = decoder.apply_rope(q, *rope), decoder.apply_rope(k, *rope)
    attended, kv = decoder.cached_attention(q, k, v, mask, kv, index, write_index)
    if c.attn_output_gate:
        attended = attended * jax.nn.sigmoid(gate.reshape(attended.shape))
    return decoder.project(attended, params["o_proj"], deltas["o_proj"]), kv


def _grouped(tree: PyTree, groups: int) -> PyTree:
    """Splits the leading layer axis of every leaf into (groups, layers per group)."""
    return jax.tree.map(lambda x: x.reshape(groups, -1, *x.shape[1:]), tree)


def _slot(tree: PyTree, i: int) -> PyTree:
    return jax.tree.map(lambda x: x[i], tree)


def forward(config: ModelConfig, params: PyTree, deltas: decoder.Deltas, tokens: jax.Array,
            positions: jax.Array, kv_mask: jax.Array, cache: HybridCache,
            write_index: jax.Array, remat: bool = False) -> tuple[jax.Array, HybridCache]:
    """``decoder.forward`` for hybrid models (same arguments, a ``HybridCache``)."""
    c = config
    mask = decoder.causal_mask(kv_mask, write_index, tokens.shape[1])
    real = jax.lax.dynamic_slice_in_dim(kv_mask, write_index, tokens.shape[1], axis=1)
    factors, members = deltas
    h = decoder.embed(tokens, params["embed"]["embedding"], factors["embed"]["embedding"],
                      members)
    rope = decoder.rope_tables(c, positions, h.dtype)
    pattern = layer_pattern(c)
    groups = c.num_layers // len(pattern)
    per_group = {kind: pattern.count(kind) for kind in ("full_attention", "linear_attention")}

    def body(carry, xs):
        h, cache = carry
        layers, layer_factors, group = xs

        def layer(name, i):  # A layer's params and its rows' deltas.
            return _slot(layers[name], i), decoder.rows(_slot(layer_factors[name], i), members)

        for i, kind in enumerate(pattern):
            j = pattern[:i].count(kind)  # Place among this group's layers of its kind.
            index = group * per_group[kind] + j  # Slot in the whole stack of its kind.
            p, d = layer("shared", i)
            x = zero_centred_rms_norm(h, p["input_norm"]["scale"], d["input_norm"]["scale"],
                                      c.rms_norm_eps)
            if kind == "full_attention":
                y, kv = gated_attention(c, x, *layer("attn", j), rope, mask, cache.kv, index,
                                        write_index)
                cache = cache._replace(kv=kv)
            else:
                y, conv, state = gated_delta_net(c, x, *layer("linear_attn", j), real,
                                                 cache.conv[index], cache.recurrent[index])
                cache = cache._replace(conv=cache.conv.at[index].set(conv),
                                       recurrent=cache.recurrent.at[index].set(state))
            h = h + y
            x = zero_centred_rms_norm(h, p["post_attn_norm"]["scale"],
                                      d["post_attn_norm"]["scale"], c.rms_norm_eps)
            h = h + decoder.mlp(x, p["mlp"], d["mlp"])
        return (h, cache), None

    if remat:
        body = jax.checkpoint(body)

    def split(tree):
        mixers = {name: _grouped(tree[name], groups)
                  for name in ("attn", "linear_attn") if name in tree}
        shared = {name: tree[name] for name in ("input_norm", "post_attn_norm", "mlp")}
        return {**mixers, "shared": _grouped(shared, groups)}

    xs = (split(params["layers"]), split(factors["layers"]), jnp.arange(groups))
    (h, cache), _ = jax.lax.scan(body, (h, cache), xs)
    h = zero_centred_rms_norm(h, params["final_norm"]["scale"],
                              decoder.rows(factors["final_norm"]["scale"], members),
                              c.rms_norm_eps)
    return h, cache
