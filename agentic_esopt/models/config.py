"""Model configuration, and the Hugging Face `config.json` fields every family shares.

Each architecture (``architectures``) reads and writes its own family's `config.json`
with these helpers; ``architectures.config_from_hf`` picks the family by `model_type`.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from typing import Any

LAYER_TYPES = ("full_attention", "linear_attention")
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")
CACHE_LAYOUTS = ("auto", "per_layer", "stacked")


@dataclasses.dataclass(frozen=True)
class RopeConfig:
    """Rotary position embedding settings.

    Attributes:
        theta: base wavelength.
        kind: "default", "linear" (positions divided by `factor`) or "llama3"
            (Llama-3.1 frequency-dependent scaling).
        factor: scaling factor ("linear" and "llama3").
        low_freq_factor: Llama-3 low-frequency factor.
        high_freq_factor: Llama-3 high-frequency factor.
        original_max_position_embeddings: Llama-3 original context length.
        partial_rotary_factor: fraction of each head's dims that is rotated (Qwen3.5).
    """

    theta: float = 10000.0
    kind: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192
    partial_rotary_factor: float = 1.0


@dataclasses.dataclass(frozen=True)
class LinearAttentionConfig:
    """Gated DeltaNet (Qwen3.5 linear-attention layer) sizes.

    Attributes:
        num_key_heads: query/key heads (each serves num_value_heads / num_key_heads values).
        num_value_heads: value heads (heads of the recurrent state).
        key_head_dim: per-head query/key width.
        value_head_dim: per-head value width.
        conv_kernel: taps of the depthwise causal convolution over q, k and v.
    """

    num_key_heads: int
    num_value_heads: int
    key_head_dim: int
    value_head_dim: int
    conv_kernel: int = 4

    def __post_init__(self):
        if self.num_value_heads % self.num_key_heads:
            raise ValueError(f"linear num_value_heads={self.num_value_heads} is not a multiple "
                             f"of num_key_heads={self.num_key_heads}.")

    @property
    def conv_dim(self) -> int:
        """Channels of the convolved q, k, v projection."""
        return 2 * self.num_key_heads * self.key_head_dim + self.value_dim

    @property
    def value_dim(self) -> int:
        return self.num_value_heads * self.value_head_dim


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Static description of a decoder-only transformer (hashable, jit-static).

    Attributes:
        model_type: a registered architecture (``architectures.names()``).
        vocab_size: rows of the embedding table.
        hidden_size: residual width d.
        intermediate_size: MLP width.
        num_layers: number of decoder layers L.
        num_heads: query heads H.
        num_kv_heads: key/value heads (GQA when < num_heads).
        head_dim: per-head width (may differ from d / H).
        rms_norm_eps: RMSNorm epsilon.
        rope: rotary embedding settings.
        tie_word_embeddings: whether the LM head reuses the embedding table.
        qkv_bias: q/k/v projections have biases.
        o_bias: the attention output projection has a bias.
        mlp_bias: gate/up/down projections have biases.
        qk_norm: RMSNorm on each query/key head before RoPE (Qwen3).
        max_position_embeddings: trained context length.
        eos_token_ids: token ids that end generation.
        bos_token_id: beginning-of-sequence id, if any.
        pad_token_id: padding id, if any.
        layer_types: per layer, "full_attention" or "linear_attention" (empty: all full).
        linear_attention: Gated DeltaNet sizes (models with linear-attention layers).
        attn_output_gate: q_proj also emits a per-head gate; attention output × σ(gate).
        cache_layout: how generation lays out a dense model's KV cache: "per_layer" (a
            buffer per layer), "stacked" (one (L, B, ...) buffer) or "auto" (per_layer on
            CPU, stacked on GPU/TPU; ``layers.KVCache``). A run setting, not part of the
            checkpoint; hybrid models always stack theirs.
    """

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope: RopeConfig = RopeConfig()
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    max_position_embeddings: int = 2048
    eos_token_ids: tuple[int, ...] = ()
    bos_token_id: int | None = None
    pad_token_id: int | None = None
    layer_types: tuple[str, ...] = ()
    linear_attention: LinearAttentionConfig | None = None
    attn_output_gate: bool = False
    cache_layout: str = "auto"

    def __post_init__(self):
        check_cache_layout(self.cache_layout)
        if self.layer_types and (len(self.layer_types) != self.num_layers
                                 or not set(self.layer_types) <= set(LAYER_TYPES)):
            raise ValueError(f"layer_types must be {self.num_layers} entries of {LAYER_TYPES}, "
                             f"got {self.layer_types}.")
        if "linear_attention" in self.kinds and self.linear_attention is None:
            raise ValueError("Linear-attention layers need a linear_attention config.")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads={self.num_heads} is not a multiple of "
                             f"num_kv_heads={self.num_kv_heads}.")
        if self.head_dim % 2:
            raise ValueError(f"head_dim={self.head_dim} must be even for rotary embeddings.")

    @property
    def kinds(self) -> tuple[str, ...]:
        """Each layer's type ("full_attention" or "linear_attention")."""
        return self.layer_types or ("full_attention",) * self.num_layers

    @property
    def rotary_dim(self) -> int:
        """Leading dims of each head that RoPE rotates (the rest pass through)."""
        return int(self.head_dim * self.rope.partial_rotary_factor)

    def stacked_layers(self, block: str) -> tuple[int, ...]:
        """Layer indices of the stacked slots of the ``layers/<block>`` leaves.

        Attention leaves stack the full-attention layers, linear-attention leaves the
        linear ones, and norms and MLPs every layer.
        """
        kind = {"attn": "full_attention", "linear_attn": "linear_attention"}.get(block)
        return tuple(i for i, k in enumerate(self.kinds) if kind in (None, k))


def check_cache_layout(cache_layout: str) -> None:
    """Raises ValueError naming the option unless ``cache_layout`` is one of
    ``CACHE_LAYOUTS``."""
    if cache_layout not in CACHE_LAYOUTS:
        raise ValueError(f"cache_layout must be one of {CACHE_LAYOUTS}, got "
                         f"{cache_layout!r}.")


def read_hf_config(path: str | os.PathLike) -> dict[str, Any]:
    """Reads `config.json` from a file path or a checkpoint directory."""
    path = os.fspath(path)
    if os.path.isdir(path):
        path = os.path.join(path, "config.json")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"No HF config.json at {path!r}.")
    with open(path) as f:
        return json.load(f)


def common_fields_from_hf(hf: Mapping[str, Any]) -> dict[str, Any]:
    """The `ModelConfig` fields every family reads alike from a HF config dict.

    Raises:
      ValueError: a HF feature no family implements, or a missing required field.
    """
    if hf.get("hidden_act", "silu") != "silu":
        raise ValueError(f"Unsupported hidden_act {hf['hidden_act']!r}; only 'silu' is "
                         "implemented.")
    if hf.get("use_sliding_window", False):
        raise ValueError("Sliding-window attention (use_sliding_window=true) is not supported.")
    if hf.get("pretraining_tp", 1) != 1:
        raise ValueError("pretraining_tp != 1 is not supported.")
    return dict(
        vocab_size=required(hf, "vocab_size"),
        hidden_size=required(hf, "hidden_size"),
        intermediate_size=required(hf, "intermediate_size"),
        num_layers=required(hf, "num_hidden_layers"),
        num_heads=required(hf, "num_attention_heads"),
        rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        eos_token_ids=_as_id_tuple(hf.get("eos_token_id")),
        bos_token_id=_first_id(hf.get("bos_token_id")),
        pad_token_id=_first_id(hf.get("pad_token_id")),
    )


def common_fields_to_hf(config: ModelConfig, architecture: str, model_type: str
                        ) -> dict[str, Any]:
    """The HF config dict fields every family writes alike, the inverse of
    `common_fields_from_hf` (plus head and RoPE settings).

    RoPE is written both as transformers 5 `rope_parameters` and as transformers 4
    `rope_theta`/`rope_scaling`, so either version reads it.

    Args:
      config: the config to write.
      architecture: the transformers class (`architectures` entry).
      model_type: the HF `model_type`.
    """
    c = config
    rope = rope_to_hf(c.rope)
    hf = {
        "architectures": [architecture],
        "model_type": model_type,
        "vocab_size": c.vocab_size,
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_hidden_layers": c.num_layers,
        "num_attention_heads": c.num_heads,
        "num_key_value_heads": c.num_kv_heads,
        "head_dim": c.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": c.rms_norm_eps,
        "max_position_embeddings": c.max_position_embeddings,
        "tie_word_embeddings": c.tie_word_embeddings,
        "attention_bias": c.o_bias,  # qwen2's q/k/v biases are implied by its model_type.
        "rope_parameters": rope,
        "rope_theta": c.rope.theta,
        **special_token_ids_to_hf(c),
    }
    if c.rope.kind != "default":
        hf["rope_scaling"] = {k: v for k, v in rope.items() if k != "rope_theta"}
    return hf


def check_expressible(config: ModelConfig, problems: list[tuple[bool, str]]) -> None:
    """Raises ValueError naming every message whose condition holds: what the HF class of
    `config.model_type` cannot express."""
    messages = [message for failed, message in problems if failed]
    if messages:
        raise ValueError(f"This {config.model_type} config has no HF equivalent: "
                         f"{'; '.join(messages)}.")


def rope_from_hf(hf: Mapping[str, Any], partial_rotary_factor: float | None = None
                 ) -> RopeConfig:
    """RoPE settings from `rope_parameters` (transformers 5) or `rope_theta`/`rope_scaling`.

    Args:
      hf: the HF config dict.
      partial_rotary_factor: the default fraction of each head that is rotated, for a
        family that rotates part of each head; None: whole heads (any other fraction is
        an error).
    """
    params = dict(hf.get("rope_scaling") or {})
    params.update(hf.get("rope_parameters") or {})
    kind = params.get("rope_type", params.get("type", "default"))
    if kind not in SUPPORTED_ROPE_TYPES:
        raise ValueError(f"Unsupported rope_type {kind!r}; supported: {SUPPORTED_ROPE_TYPES}.")
    default = 1.0 if partial_rotary_factor is None else partial_rotary_factor
    partial = float(params.get("partial_rotary_factor",
                               hf.get("partial_rotary_factor", default)))
    if partial != 1.0 and partial_rotary_factor is None:
        raise ValueError(f"{hf.get('model_type')} rotates whole heads; "
                         f"partial_rotary_factor={partial} is not supported.")
    theta = params.get("rope_theta", hf.get("rope_theta", 10000.0))
    if kind == "default":
        return RopeConfig(theta=float(theta), partial_rotary_factor=partial)
    if "factor" not in params:
        raise ValueError(f"rope_type {kind!r} needs a 'factor' entry.")
    if kind == "linear":
        return RopeConfig(theta=float(theta), kind=kind, factor=float(params["factor"]))
    missing = [k for k in ("low_freq_factor", "high_freq_factor") if k not in params]
    if missing:
        raise ValueError(f"rope_type 'llama3' is missing {missing}.")
    return RopeConfig(
        theta=float(theta),
        kind=kind,
        factor=float(params["factor"]),
        low_freq_factor=float(params["low_freq_factor"]),
        high_freq_factor=float(params["high_freq_factor"]),
        original_max_position_embeddings=int(params.get(
            "original_max_position_embeddings", hf.get("max_position_embeddings", 8192))),
    )


def special_token_ids_to_hf(config: ModelConfig) -> dict[str, Any]:
    """HF `bos_token_id`, `eos_token_id` (an id, a list of ids or None) and `pad_token_id`."""
    eos = list(config.eos_token_ids)
    return {"bos_token_id": config.bos_token_id,
            "eos_token_id": eos[0] if len(eos) == 1 else eos or None,
            "pad_token_id": config.pad_token_id}


def rope_to_hf(rope: RopeConfig) -> dict[str, Any]:
    """`rope_parameters` (transformers 5) of RoPE settings, the inverse of `rope_from_hf`."""
    params = {"rope_type": rope.kind, "rope_theta": rope.theta}
    if rope.partial_rotary_factor != 1.0:
        params["partial_rotary_factor"] = rope.partial_rotary_factor
    if rope.kind in ("linear", "llama3"):
        params["factor"] = rope.factor
    if rope.kind == "llama3":
        params.update(low_freq_factor=rope.low_freq_factor,
                      high_freq_factor=rope.high_freq_factor,
                      original_max_position_embeddings=rope.original_max_position_embeddings)
    return params


def required(hf: Mapping[str, Any], key: str) -> int:
    """``int(hf[key])``; raises ValueError naming the field when it is missing."""
    if key not in hf or hf[key] is None:
        raise ValueError(f"config.json is missing required field {key!r}.")
    return int(hf[key])


def _as_id_tuple(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    return tuple(int(v) for v in value)


def _first_id(value: Any) -> int | None:
    ids = _as_id_tuple(value)
    return ids[0] if ids else None
