"""Qwen3.5: a hybrid of Gated DeltaNet linear-attention and gated full-attention layers.

The same interface as ``dense`` (pure functions of config, params, deltas, tokens and a
cache; every projection through ``layers.project``). Differences from Qwen3:

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

Parameters: ``dense``'s, with ``layers/attn`` stacked over the full-attention layers
(q_proj twice as wide: a query and a gate per head), plus ``layers/linear_attn``
(``in_proj_{qkv,z,b,a}``, ``out_proj``, ``conv1d/scale``, ``A_log/scale``, ``dt/bias``,
``norm/scale``) stacked over the linear ones; ``config.stacked_layers`` names the layers
of each stack.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from agentic_esopt.models import config as config_lib
from agentic_esopt.models import layers
from agentic_esopt.models.architectures import dense
from agentic_esopt.models.architectures.base import Architecture, Path
from agentic_esopt.models.config import LinearAttentionConfig, ModelConfig

PyTree = Any
F32 = jnp.float32
CHUNK_SIZE = 64
L2_EPS = 1e-6
HF_CLASS = "Qwen3_5ForCausalLM"
HF_NAMES = {
    **dense.HF_NAMES,
    **{("layers", "linear_attn", p, "kernel"): f"model.layers.{{}}.linear_attn.{p}.weight"
       for p in ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj")},
    ("layers", "linear_attn", "conv1d", "scale"): "model.layers.{}.linear_attn.conv1d.weight",
    ("layers", "linear_attn", "A_log", "scale"): "model.layers.{}.linear_attn.A_log",
    ("layers", "linear_attn", "dt", "bias"): "model.layers.{}.linear_attn.dt_bias",
    ("layers", "linear_attn", "norm", "scale"): "model.layers.{}.linear_attn.norm.weight",
}


class HybridCache(NamedTuple):
    """Generation state of a hybrid model.

    Attributes:
      kv: keys (L_attn, B, K, head_dim, S) and values (L_attn, B, K, S, head_dim) of the
        full-attention layers, stacked (they ride in the layer scan's carry).
      conv: (L_lin, B, conv_kernel - 1, conv_dim) last inputs of each depthwise conv.
      recurrent: (L_lin, B, value_heads, key_head_dim, value_head_dim) float32 states.
    """

    kv: layers.KVCache
    conv: jax.Array
    recurrent: jax.Array


def param_shapes(config: ModelConfig) -> dict[Path, tuple[int, ...]]:
    """``dense.param_shapes`` plus the Gated DeltaNet layers' leaves."""
    c = config
    la, L_lin = c.linear_attention, len(c.stacked_layers("linear_attn"))
    d, heads = c.hidden_size, la.num_value_heads
    kernels = {"in_proj_qkv": (d, la.conv_dim), "in_proj_z": (d, la.value_dim),
               "in_proj_b": (d, heads), "in_proj_a": (d, heads),
               "out_proj": (la.value_dim, d)}
    return {
        **dense.param_shapes(c),
        **{("layers", "linear_attn", name, "kernel"): (L_lin, *shape)
           for name, shape in kernels.items()},
        # Per-head and per-channel vectors are named "scale"/"bias": es gives them
        # full-rank noise (the depthwise conv keeps torch's (channels, 1, taps) layout).
        ("layers", "linear_attn", "conv1d", "scale"): (L_lin, la.conv_dim, 1, la.conv_kernel),
        ("layers", "linear_attn", "A_log", "scale"): (L_lin, heads),
        ("layers", "linear_attn", "dt", "bias"): (L_lin, heads),
        ("layers", "linear_attn", "norm", "scale"): (L_lin, la.value_head_dim),
    }


def init_constant(path: Path) -> float | None:
    """Zero-centred norm weights (x̂·(1 + w)), biases and A_log start at 0, the gated
    DeltaNet norm's scale at 1; matrices and conv taps are drawn (None)."""
    if path[-1] not in ("scale", "bias") or path[-2] == "conv1d":
        return None
    return 1.0 if path[-2] == "norm" else 0.0


def empty_cache(config: ModelConfig, batch: int, length: int, dtype: Any) -> HybridCache:
    """A zero cache with ``length`` attention slots."""
    la, n_lin = config.linear_attention, len(config.stacked_layers("linear_attn"))
    kv = layers.empty_kv_cache(config, len(config.stacked_layers("attn")), batch, length,
                               dtype, stacked=True)
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
    return (normed * (1.0 + layers.row_vector(weight, delta, x.ndim).astype(F32))
            ).astype(x.dtype)


def gated_rms_norm(x: jax.Array, gate: jax.Array, weight: jax.Array,
                   delta: jax.Array | None, eps: float) -> jax.Array:
    """RMSNorm(x)·w·silu(gate), the gate applied in float32."""
    normed = layers.rms_norm(x, weight, delta, eps).astype(F32)
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


def unit_lower_solve(system: jax.Array, rhs: jax.Array) -> jax.Array:
    """``system⁻¹ @ rhs`` for batched unit lower-triangular (C, C) ``system``s.

    XLA's triangular solve, except on CPU, where it is a LAPACK kernel that never returns
    when several devices call it at once (jax 0.10.2: a sharded batch of 64 solves on 2
    host devices hangs): there (I + N)⁻¹ = Σⱼ (−N)ʲ = ∏ₖ (I + (−N)^(2ᵏ)), N strictly
    lower so (−N)^C = 0, in ⌈log₂ C⌉ doubling steps of matrix products.
    """
    def by_products(system, rhs):
        power = jnp.eye(system.shape[-1], dtype=system.dtype) - system  # −N
        solved = rhs
        for _ in range(max(1, (system.shape[-1] - 1).bit_length())):
            solved = solved + power @ solved
            power = power @ power
        return solved

    def by_triangular_solve(system, rhs):
        return jax.lax.linalg.triangular_solve(system, rhs, left_side=True, lower=True,
                                               unit_diagonal=True)

    return jax.lax.platform_dependent(system, rhs, cpu=by_products,
                                      default=by_triangular_solve)


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
    solved = unit_lower_solve(system, rhs)
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
    qkv = layers.project(x, params["in_proj_qkv"], deltas["in_proj_qkv"])
    qkv, conv_state = causal_conv(qkv, params["conv1d"]["scale"], deltas["conv1d"]["scale"],
                                  conv_state)
    key_dim = la.num_key_heads * la.key_head_dim
    q, k, v = jnp.split(qkv, [key_dim, 2 * key_dim], axis=-1)
    repeats = la.num_value_heads // la.num_key_heads
    q, k = (jnp.repeat(l2_normalize(t.reshape(B, T, la.num_key_heads, la.key_head_dim)),
                       repeats, axis=2) for t in (q, k))
    q = q * la.key_head_dim ** -0.5
    v = v.reshape(B, T, la.num_value_heads, la.value_head_dim).astype(F32)
    beta = jax.nn.sigmoid(layers.project(x, params["in_proj_b"], deltas["in_proj_b"]))
    a = layers.project(x, params["in_proj_a"], deltas["in_proj_a"]).astype(F32)
    rate = jnp.exp(layers.row_vector(params["A_log"]["scale"], deltas["A_log"]["scale"],
                                     3).astype(F32))
    dt_bias = layers.row_vector(params["dt"]["bias"], deltas["dt"]["bias"], 3).astype(F32)
    g = jnp.where(real[..., None], -rate * jax.nn.softplus(a + dt_bias), 0.0)
    beta = jnp.where(real[..., None], beta.astype(F32), 0.0)
    rule = recurrent_delta_rule if T == 1 else chunked_delta_rule
    out, state = rule(q, k, v, g, beta, state)
    z = layers.project(x, params["in_proj_z"], deltas["in_proj_z"])
    out = gated_rms_norm(out.astype(x.dtype), z.reshape(out.shape), params["norm"]["scale"],
                         deltas["norm"]["scale"], config.rms_norm_eps)
    out = layers.project(out.reshape(B, T, la.value_dim), params["out_proj"],
                         deltas["out_proj"])
    return out, conv_state, state


def gated_attention(config: ModelConfig, x: jax.Array, params: dict, deltas: dict,
                    rope: tuple[jax.Array, jax.Array], mask: jax.Array,
                    kv: layers.KVCache, index: jax.Array, write_index: jax.Array
                    ) -> tuple[jax.Array, layers.KVCache]:
    """Full attention with zero-centred q/k norms, partial RoPE and an output gate."""
    c = config
    B, T, _ = x.shape
    norm = zero_centred_rms_norm
    q = layers.project(x, params["q_proj"], deltas["q_proj"])
    if c.attn_output_gate:
        q, gate = jnp.split(q.reshape(B, T, c.num_heads, 2 * c.head_dim), 2, axis=-1)
    q = norm(q.reshape(B, T, c.num_heads, c.head_dim), params["q_norm"]["scale"],
             deltas["q_norm"]["scale"], c.rms_norm_eps)
    k = norm(layers.project(x, params["k_proj"], deltas["k_proj"]).reshape(
        B, T, c.num_kv_heads, c.head_dim), params["k_norm"]["scale"],
             deltas["k_norm"]["scale"], c.rms_norm_eps)
    v = layers.project(x, params["v_proj"], deltas["v_proj"]).reshape(
        B, T, c.num_kv_heads, c.head_dim)
    q, k = layers.apply_rope(q, *rope), layers.apply_rope(k, *rope)
    attended, kv = layers.cached_attention(q, k, v, mask, kv, index, write_index)
    if c.attn_output_gate:
        attended = attended * jax.nn.sigmoid(gate.reshape(attended.shape))
    return layers.project(attended, params["o_proj"], deltas["o_proj"]), kv


def _grouped(tree: PyTree, groups: int) -> PyTree:
    """Splits the leading layer axis of every leaf into (groups, layers per group)."""
    return jax.tree.map(lambda x: x.reshape(groups, -1, *x.shape[1:]), tree)


def _slot(tree: PyTree, i: int) -> PyTree:
    return jax.tree.map(lambda x: x[i], tree)


def forward(config: ModelConfig, params: PyTree, deltas: layers.Deltas, tokens: jax.Array,
            positions: jax.Array, kv_mask: jax.Array, cache: HybridCache | None,
            write_index: jax.Array, remat: bool = False, token_mask: jax.Array | None = None
            ) -> tuple[jax.Array, HybridCache | None]:
    """``decoder.forward`` of a hybrid model (a ``HybridCache``, or None: a whole sequence,
    run through a fresh cache that is not returned)."""
    c = config
    batch, T = tokens.shape
    mask = layers.causal_mask(kv_mask, write_index, T)
    if token_mask is None:
        token_mask = jax.lax.dynamic_slice_in_dim(kv_mask, write_index, T, axis=1)
    factors, members = deltas
    h = layers.embed(tokens, params["embed"]["embedding"], factors["embed"]["embedding"],
                     members)
    rope = layers.rope_tables(c, positions, h.dtype)
    pattern = layer_pattern(c)
    groups = c.num_layers // len(pattern)
    per_group = {kind: pattern.count(kind) for kind in ("full_attention", "linear_attention")}

    def body(carry, xs):
        h, state = carry
        group_params, group_factors, group = xs

        def layer(name, i):  # A layer's params and its rows' deltas.
            return (_slot(group_params[name], i),
                    layers.rows(_slot(group_factors[name], i), members))

        for i, kind in enumerate(pattern):
            j = pattern[:i].count(kind)  # Place among this group's layers of its kind.
            index = group * per_group[kind] + j  # Slot in the whole stack of its kind.
            p, d = layer("shared", i)
            x = zero_centred_rms_norm(h, p["input_norm"]["scale"], d["input_norm"]["scale"],
                                      c.rms_norm_eps)
            if kind == "full_attention":
                y, kv = gated_attention(c, x, *layer("attn", j), rope, mask, state.kv, index,
                                        write_index)
                state = state._replace(kv=kv)
            else:
                y, conv, recurrent = gated_delta_net(c, x, *layer("linear_attn", j), token_mask,
                                                     state.conv[index], state.recurrent[index])
                state = state._replace(conv=state.conv.at[index].set(conv),
                                       recurrent=state.recurrent.at[index].set(recurrent))
            h = h + y
            x = zero_centred_rms_norm(h, p["post_attn_norm"]["scale"],
                                      d["post_attn_norm"]["scale"], c.rms_norm_eps)
            h = h + layers.mlp(x, p["mlp"], d["mlp"])
        return (h, state), None

    if remat:
        body = jax.checkpoint(body)

    def split(tree):
        mixers = {name: _grouped(tree[name], groups)
                  for name in ("attn", "linear_attn") if name in tree}
        shared = {name: tree[name] for name in ("input_norm", "post_attn_norm", "mlp")}
        return {**mixers, "shared": _grouped(shared, groups)}

    state = empty_cache(c, batch, kv_mask.shape[1], h.dtype) if cache is None else cache
    xs = (split(params["layers"]), split(factors["layers"]), jnp.arange(groups))
    (h, state), _ = jax.lax.scan(body, (h, state), xs)
    h = zero_centred_rms_norm(h, params["final_norm"]["scale"],
                              layers.rows(factors["final_norm"]["scale"], members),
                              c.rms_norm_eps)
    return h, None if cache is None else state


def config_from_hf(hf: Mapping[str, Any]) -> ModelConfig:
    """A Qwen3.5 `ModelConfig` from its HF text config, or from a multimodal config.

    A multimodal config contributes its ``text_config`` (the vision tower is not used);
    fields the text config leaves unset (special token ids) come from the outer config,
    whose ``tie_word_embeddings`` decides the head (as in transformers). Text-only
    positions make the multimodal RoPE (``mrope_section``) plain RoPE on the rotated dims,
    so the sections are not read.
    """
    if "text_config" in hf:
        outer = {k: v for k, v in hf.items() if k != "text_config"}
        hf = {**outer, **{k: v for k, v in hf["text_config"].items() if v is not None}}
        if "tie_word_embeddings" in outer:
            hf["tie_word_embeddings"] = outer["tie_word_embeddings"]
    fields = config_lib.common_fields_from_hf(hf)
    interval = int(hf.get("full_attention_interval", 4))
    layer_types = tuple(hf.get("layer_types") or (
        "full_attention" if (i + 1) % interval == 0 else "linear_attention"
        for i in range(fields["num_layers"])))
    attention_bias = bool(hf.get("attention_bias", False))
    return ModelConfig(
        model_type="qwen3_5",
        **fields,
        num_kv_heads=config_lib.required(hf, "num_key_value_heads"),
        head_dim=int(hf.get("head_dim") or 256),
        # transformers' default partial_rotary_factor for Qwen3.5 is 0.25.
        rope=config_lib.rope_from_hf(hf, partial_rotary_factor=0.25),
        qkv_bias=attention_bias,
        o_bias=attention_bias,
        qk_norm=True,
        max_position_embeddings=int(hf.get("max_position_embeddings", 32768)),
        layer_types=layer_types,
        linear_attention=LinearAttentionConfig(
            num_key_heads=int(hf.get("linear_num_key_heads", 16)),
            num_value_heads=int(hf.get("linear_num_value_heads", 32)),
            key_head_dim=int(hf.get("linear_key_head_dim", 128)),
            value_head_dim=int(hf.get("linear_value_head_dim", 128)),
            conv_kernel=int(hf.get("linear_conv_kernel_dim", 4))),
        attn_output_gate=bool(hf.get("attn_output_gate", True)),
    )


def config_to_hf(config: ModelConfig) -> dict[str, Any]:
    """The ``Qwen3_5ForCausalLM`` text config dict, the inverse of ``config_from_hf``.

    Raises:
      ValueError: norms, gates, biases or RoPE settings Qwen3.5 does not have.
    """
    c, la = config, config.linear_attention
    config_lib.check_expressible(c, [
        (not c.qk_norm, "qwen3_5 has q/k norms"),
        (not c.attn_output_gate, "qwen3_5 has attention output gates"),
        (c.rope.kind != "default", "qwen3_5 has plain (default) RoPE"),
        (c.qkv_bias != c.o_bias, "qwen3_5 has q/k/v/o biases all or none (attention_bias)"),
        (c.mlp_bias, "only llama has MLP biases (mlp_bias)"),
    ])
    return {**config_lib.common_fields_to_hf(c, HF_CLASS, "qwen3_5_text"),
            "layer_types": list(c.kinds), "linear_num_key_heads": la.num_key_heads,
            "linear_num_value_heads": la.num_value_heads,
            "linear_key_head_dim": la.key_head_dim, "linear_value_head_dim": la.value_head_dim,
            "linear_conv_kernel_dim": la.conv_kernel}


ARCHITECTURE = Architecture(
    layer_types=config_lib.LAYER_TYPES,
    param_shapes=param_shapes,
    init_constant=init_constant,
    forward=forward,
    empty_cache=empty_cache,
    cache_rows_axis=lambda cache: 1,  # Every leaf stacks its layers first.
    prefix_cache=False,  # Recurrent states cannot roll back to a prefix.
    hf_model_types=("qwen3_5", "qwen3_5_text"),
    hf_names=HF_NAMES,
    config_from_hf=config_from_hf,
    config_to_hf=config_to_hf,
)
