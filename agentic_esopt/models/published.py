"""The paper's models by name: their published ``config.json`` values, for planning runs
without their weights (``training.plan``).

Each entry holds the fields of the model's Hugging Face ``config.json`` that shape its
parameters, caches and compute, read by the same architecture readers as a local folder's
``config.json`` (``architectures.config_from_hf``), and the file it was copied from.
"""

from __future__ import annotations

import os
from typing import Any, NamedTuple

from agentic_esopt.models import architectures, loading, tiny
from agentic_esopt.models.config import ModelConfig

_HF = "https://huggingface.co/{}/blob/main/config.json"


class Published(NamedTuple):
    """A model's published ``config.json`` fields and where they come from."""

    hf_config: dict[str, Any]
    source: str


_QWEN3_5 = dict(model_type="qwen3_5_text", hidden_act="silu", rms_norm_eps=1e-6,
                attn_output_gate=True, head_dim=256, num_key_value_heads=4,
                linear_conv_kernel_dim=4, linear_key_head_dim=128, linear_value_head_dim=128,
                linear_num_key_heads=16, full_attention_interval=4, vocab_size=248320,
                max_position_embeddings=262144, eos_token_id=248044,
                rope_parameters=dict(rope_type="default", rope_theta=10000000.0,
                                     partial_rotary_factor=0.25))
_QWEN2_5 = dict(model_type="qwen2", hidden_act="silu", rms_norm_eps=1e-6,
                max_position_embeddings=32768, rope_theta=1000000.0, bos_token_id=151643,
                eos_token_id=151645)

MODELS: dict[str, Published] = {
    "qwen3.5-4b": Published(dict(
        _QWEN3_5, hidden_size=2560, intermediate_size=9216, num_hidden_layers=32,
        num_attention_heads=16, linear_num_value_heads=32, tie_word_embeddings=True),
        _HF.format("Qwen/Qwen3.5-4B")),
    "qwen3.5-27b": Published(dict(
        _QWEN3_5, hidden_size=5120, intermediate_size=17408, num_hidden_layers=64,
        num_attention_heads=24, linear_num_value_heads=48, tie_word_embeddings=False),
        _HF.format("Qwen/Qwen3.5-27B")),
    "qwen2.5-1.5b": Published(dict(
        _QWEN2_5, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
        num_attention_heads=12, num_key_value_heads=2, vocab_size=151936,
        tie_word_embeddings=True), _HF.format("Qwen/Qwen2.5-1.5B-Instruct")),
    "qwen2.5-7b": Published(dict(
        _QWEN2_5, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
        num_attention_heads=28, num_key_value_heads=4, vocab_size=152064,
        tie_word_embeddings=False), _HF.format("Qwen/Qwen2.5-7B-Instruct")),
    "llama-3.1-8b": Published(dict(
        model_type="llama", hidden_act="silu", hidden_size=4096, intermediate_size=14336,
        num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
        vocab_size=128256, rms_norm_eps=1e-5, tie_word_embeddings=False,
        max_position_embeddings=131072, bos_token_id=128000,
        eos_token_id=[128001, 128008, 128009],
        rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                          high_freq_factor=4.0, original_max_position_embeddings=8192),
        rope_theta=500000.0), _HF.format("meta-llama/Llama-3.1-8B-Instruct")),
}


def names() -> tuple[str, ...]:
    """The named models."""
    return tuple(MODELS)


def model_config(name_or_path: str) -> tuple[ModelConfig, str]:
    """The config of a named model, of a local folder's (or file's) ``config.json``, of a
    GGUF file's metadata or of ``tiny``, and where it was read from; no weights are read.

    Raises:
      ValueError: a name not in the table that is not a folder or file either, naming the
        table's models.
    """
    if name_or_path in MODELS:
        published = MODELS[name_or_path]
        return architectures.config_from_hf(published.hf_config), published.source
    if name_or_path == "tiny":
        return tiny.tiny_config(), "models.tiny"
    if name_or_path in loading.GGUF_NAMES or name_or_path.endswith(".gguf"):
        from agentic_esopt.models import gguf  # pylint: disable=import-outside-toplevel

        path = (gguf.default_gguf_path(name_or_path) if name_or_path in loading.GGUF_NAMES
                else name_or_path)
        return architectures.config_from_hf(gguf.hf_config(gguf.open_gguf(path))), str(path)
    if os.path.exists(name_or_path):
        return architectures.config_from_hf(name_or_path), os.path.abspath(name_or_path)
    raise ValueError(f"unknown model {name_or_path!r}: not one of {names()} and not a folder "
                     "with a config.json")
