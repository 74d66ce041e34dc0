"""Dense decoder-only transformers: Llama, Qwen2 and Qwen3.

Parameters are a plain nested dict (names follow ``es``' scope conventions):

    embed/embedding (V, d)                 lm_head/kernel (d, V)   (untied models only)
    final_norm/scale (d,)
    layers/input_norm/scale (L, d)         layers/post_attn_norm/scale (L, d)
    layers/attn/{q,k,v,o}_proj/kernel (L, in, out)   [+ bias (L, out)]
    layers/attn/{q,k}_norm/scale (L, head_dim)        (Qwen3)
    layers/mlp/{gate,up,down}_proj/kernel (L, in, out)   [+ bias (L, out)]

Every layer is attention; the stack runs as one ``lax.scan``. With a per-layer
``layers.KVCache`` layer l reads buffer l in place and the new tokens' keys and values are
written to the cache after the scan; a stacked cache rides in the scan's carry, each layer
writing its new keys and values in place before attending (``ModelConfig.cache_layout``).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

from agentic_esopt.models import config as config_lib
from agentic_esopt.models.architectures.base import Architecture, Path
from agentic_esopt.models.config import ModelConfig
from agentic_esopt.models.layers import (Deltas, KVCache, LayerOf, apply_rope, attention,
                                         cache_layout, causal_mask, embed, empty_kv_cache,
                                         is_stacked, mlp, project, rms_norm, rope_tables,
                                         rows, rows_axis, slot_axes, stacked_attention,
                                         stacks_cache, write_slots)

PyTree = Any
HF_CLASSES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
              "qwen3": "Qwen3ForCausalLM"}
# Parameter path -> HF tensor name ("{}" is the layer index of stacked "layers" leaves).
HF_NAMES = {
    ("embed", "embedding"): "model.embed_tokens.weight",
    ("final_norm", "scale"): "model.norm.weight",
    ("lm_head", "kernel"): "lm_head.weight",
    ("layers", "input_norm", "scale"): "model.layers.{}.input_layernorm.weight",
    ("layers", "post_attn_norm", "scale"): "model.layers.{}.post_attention_layernorm.weight",
    **{("layers", "attn", f"{p}_proj", leaf): f"model.layers.{{}}.self_attn.{p}_proj.{suffix}"
       for p in "qkvo" for leaf, suffix in (("kernel", "weight"), ("bias", "bias"))},
    **{("layers", "attn", f"{p}_norm", "scale"): f"model.layers.{{}}.self_attn.{p}_norm.weight"
       for p in "qk"},
    **{("layers", "mlp", f"{p}_proj", leaf): f"model.layers.{{}}.mlp.{p}_proj.{suffix}"
       for p in ("gate", "up", "down") for leaf, suffix in (("kernel", "weight"),
                                                             ("bias", "bias"))},
}


def param_shapes(config: ModelConfig) -> dict[Path, tuple[int, ...]]:
    """Flat map from parameter path to shape: embedding, head, norms, and attention and
    MLP projections (attention stacked over ``config.stacked_layers("attn")``)."""
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
    for (block, name), (depth, n_in, n_out, bias) in projections.items():
        shapes[("layers", block, name, "kernel")] = (depth, n_in, n_out)
        if bias:
            shapes[("layers", block, name, "bias")] = (depth, n_out)
    if c.qk_norm:
        shapes[("layers", "attn", "q_norm", "scale")] = (L_attn, c.head_dim)
        shapes[("layers", "attn", "k_norm", "scale")] = (L_attn, c.head_dim)
    if not c.tie_word_embeddings:
        shapes[("lm_head", "kernel")] = (d, c.vocab_size)
    return shapes


def init_constant(path: Path) -> float | None:
    """Norm scales start at 1 and biases at 0; matrices are drawn (None)."""
    return {"scale": 1.0, "bias": 0.0}.get(path[-1])


def empty_cache(config: ModelConfig, batch: int, length: int, dtype: Any) -> KVCache:
    """A zero KV cache with ``length`` slots, per layer or stacked
    (``layers.stacks_cache``)."""
    return empty_kv_cache(config, config.num_layers, batch, length, dtype,
                          stacked=stacks_cache(config))


def _layer(config: ModelConfig, h: jax.Array, layer: dict, deltas: dict,
           rope: tuple[jax.Array, jax.Array], attend: Any) -> tuple[jax.Array, Any]:
    """A decoder layer over new tokens; ``attend(q, k, v)`` (queries (B, T, H, hd), keys
    and values (B, T, K, hd)) is its attention and returns (the attended (B, T, H * hd),
    what the layer hands back: its new keys and values, or the cache it wrote them to)."""
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
    attended, handed_back = attend(q, k, v)
    h = h + project(attended, attn["o_proj"], attn_deltas["o_proj"])
    x = rms_norm(h, layer["post_attn_norm"]["scale"], deltas["post_attn_norm"]["scale"],
                 c.rms_norm_eps)
    return h + mlp(x, layer["mlp"], deltas["mlp"]), handed_back


def _attend_blocks(masks: tuple[jax.Array, jax.Array], cache: KVCache | None,
                   index: jax.Array, q: jax.Array, k: jax.Array, v: jax.Array
                   ) -> tuple[jax.Array, KVCache]:
    """Attention to layer ``index``'s read-only buffers of a per-layer ``cache`` (or no
    cache: None) and to the new tokens themselves, as two blocks.

    ``masks`` are (prefix mask (B, T, S), new-token mask (B, T, T)). Returns the attended
    and the new tokens' keys/values (``cache_layout``), which the caller writes to the
    cache after the layer scan (so the cache is never copied inside it).
    """
    new = cache_layout(k, v)
    if cache is None:
        return attention(q, [(*new, masks[1])]), new
    prefix = KVCache(LayerOf(cache.k, index), LayerOf(cache.v, index))
    return attention(q, [(*prefix, masks[0]), (*new, masks[1])]), new


def _per_layer_scan(config: ModelConfig, h: jax.Array, xs: tuple, members: jax.Array | None,
                    rope: tuple[jax.Array, jax.Array], kv_mask: jax.Array,
                    token_mask: jax.Array, cache: KVCache | None, write_index: jax.Array,
                    remat: bool) -> tuple[jax.Array, KVCache | None]:
    """The layer scan over a per-layer cache (or none), then the cache's writes."""
    T = token_mask.shape[1]
    new_slots = jax.lax.dynamic_update_slice_in_dim(jnp.zeros_like(kv_mask), token_mask,
                                                    write_index, axis=1)
    cached = kv_mask & ~new_slots
    causal = jnp.arange(T)[:, None] >= jnp.arange(T)[None, :]
    masks = (causal_mask(cached, write_index, T), causal[None] & token_mask[:, None, :])

    def body(h, xs):
        layer, layer_factors, index = xs
        return _layer(config, h, layer, rows(layer_factors, members), rope,
                      functools.partial(_attend_blocks, masks, cache, index))

    if remat:
        body = jax.checkpoint(body)
    h, new = jax.lax.scan(body, h, xs)
    if cache is not None:
        cache = jax.tree.map(
            lambda full, written, axis: write_slots(full, written, token_mask, write_index, axis),
            cache, KVCache(*(tuple(x) for x in new)), slot_axes(cache))
    return h, cache


def _stacked_scan(config: ModelConfig, h: jax.Array, xs: tuple, members: jax.Array | None,
                  rope: tuple[jax.Array, jax.Array], kv_mask: jax.Array,
                  token_mask: jax.Array, cache: KVCache, write_index: jax.Array,
                  remat: bool) -> tuple[jax.Array, KVCache]:
    """The layer scan carrying a stacked cache, each layer writing its new keys and
    values in place and attending over all its slots (``layers.stacked_attention``)."""
    mask = causal_mask(kv_mask, write_index, token_mask.shape[1])

    def body(carry, xs):
        h, cache = carry
        layer, layer_factors, index = xs
        attend = functools.partial(stacked_attention, mask=mask, token_mask=token_mask,
                                   cache=cache, index=index, write_index=write_index)
        return _layer(config, h, layer, rows(layer_factors, members), rope, attend), None

    if remat:
        body = jax.checkpoint(body)
    (h, cache), _ = jax.lax.scan(body, (h, cache), xs)
    return h, cache


def forward(config: ModelConfig, params: PyTree, deltas: Deltas, tokens: jax.Array,
            positions: jax.Array, kv_mask: jax.Array, cache: KVCache | None,
            write_index: jax.Array, remat: bool = False, token_mask: jax.Array | None = None
            ) -> tuple[jax.Array, KVCache | None]:
    """``decoder.forward`` of a dense model (a ``KVCache`` in either layout, or None: no
    cache).

    A padded new token (``token_mask`` False) keeps what its slot held: a row's cached
    prefix may sit there (``kv_mask`` True), and the new tokens attend to it.
    """
    T = tokens.shape[1]
    if token_mask is None:
        token_mask = jax.lax.dynamic_slice_in_dim(kv_mask, write_index, T, axis=1)
    factors, members = deltas
    h = embed(tokens, params["embed"]["embedding"], factors["embed"]["embedding"], members)
    rope = rope_tables(config, positions, h.dtype)
    scan = _stacked_scan if cache is not None and is_stacked(cache) else _per_layer_scan
    xs = (params["layers"], factors["layers"], jnp.arange(config.num_layers))
    h, cache = scan(config, h, xs, members, rope, kv_mask, token_mask, cache, write_index,
                    remat)
    h = rms_norm(h, params["final_norm"]["scale"], rows(factors["final_norm"]["scale"], members),
                 config.rms_norm_eps)
    return h, cache


def config_from_hf(hf: Mapping[str, Any]) -> ModelConfig:
    """A Llama, Qwen2 or Qwen3 `ModelConfig` from its HF config dict."""
    model_type = hf["model_type"]
    fields = config_lib.common_fields_from_hf(hf)
    default_head_dim = (128 if model_type == "qwen3"
                        else fields["hidden_size"] // fields["num_heads"])
    attention_bias = bool(hf.get("attention_bias", False))
    return ModelConfig(
        model_type=model_type,
        **fields,
        num_kv_heads=hf.get("num_key_value_heads") or fields["num_heads"],
        head_dim=hf.get("head_dim") or default_head_dim,
        rope=config_lib.rope_from_hf(hf),
        qkv_bias=model_type == "qwen2" or attention_bias,
        o_bias=model_type != "qwen2" and attention_bias,
        mlp_bias=bool(hf.get("mlp_bias", False)),
        qk_norm=model_type == "qwen3",
        max_position_embeddings=int(hf.get("max_position_embeddings", 2048)),
    )


def config_to_hf(config: ModelConfig) -> dict[str, Any]:
    """The HF config dict of a Llama, Qwen2 or Qwen3 config, the inverse of
    ``config_from_hf``.

    Raises:
      ValueError: biases, norms or gates the HF class of ``config.model_type`` lacks.
    """
    c = config
    qwen2 = c.model_type == "qwen2"
    config_lib.check_expressible(c, [
        (c.qk_norm != (c.model_type == "qwen3"), "q/k norms exist exactly in qwen3"),
        (c.attn_output_gate, f"{c.model_type} has no attention output gates"),
        (qwen2 and (not c.qkv_bias or c.o_bias), "qwen2 has q/k/v biases and no o bias"),
        (not qwen2 and c.qkv_bias != c.o_bias,
         f"{c.model_type} has q/k/v/o biases all or none (attention_bias)"),
        (c.model_type != "llama" and c.mlp_bias, "only llama has MLP biases (mlp_bias)"),
    ])
    return {**config_lib.common_fields_to_hf(c, HF_CLASSES[c.model_type], c.model_type),
            "mlp_bias": c.mlp_bias}


ARCHITECTURE = Architecture(
    layer_types=("full_attention",),
    param_shapes=param_shapes,
    init_constant=init_constant,
    forward=forward,
    empty_cache=empty_cache,
    cache_rows_axis=rows_axis,
    prefix_cache=True,
    hf_model_types=tuple(HF_CLASSES),
    hf_names=HF_NAMES,
    config_from_hf=config_from_hf,
    config_to_hf=config_to_hf,
)
