"""ModelConfig parsing from HF config.json dicts and files (``architectures``)."""

import json

import numpy as np
import pytest

from agentic_esopt.models.architectures import config_from_hf
from agentic_esopt.models.config import RopeConfig
from agentic_esopt.models.layers import rope_inverse_frequencies

LLAMA = dict(model_type="llama", vocab_size=128, hidden_size=64, intermediate_size=128,
             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)


def test_transformers5_rope_parameters():
    config = config_from_hf({
        **LLAMA, "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0,
                                     "factor": 8.0, "low_freq_factor": 1.0,
                                     "high_freq_factor": 4.0,
                                     "original_max_position_embeddings": 8192}})
    assert config.rope == RopeConfig(theta=500000.0, kind="llama3", factor=8.0,
                                     low_freq_factor=1.0, high_freq_factor=4.0,
                                     original_max_position_embeddings=8192)
    assert config.head_dim == 16 and config.num_kv_heads == 2


def test_legacy_rope_theta_and_scaling():
    config = config_from_hf({**LLAMA, "rope_theta": 1e5,
                                  "rope_scaling": {"type": "linear", "factor": 2.0}})
    assert config.rope == RopeConfig(theta=1e5, kind="linear", factor=2.0)
    default = rope_inverse_frequencies(16, RopeConfig(theta=1e5))
    np.testing.assert_allclose(rope_inverse_frequencies(16, config.rope), default / 2)


def test_llama3_scaling_changes_only_low_frequencies():
    rope = RopeConfig(theta=10000.0, kind="llama3", factor=8.0, low_freq_factor=1.0,
                      high_freq_factor=4.0, original_max_position_embeddings=64)
    scaled, default = rope_inverse_frequencies(16, rope), rope_inverse_frequencies(
        16, RopeConfig(theta=10000.0))
    assert scaled[0] == default[0]  # Highest frequency untouched.
    np.testing.assert_allclose(scaled[-1], default[-1] / 8, rtol=1e-6)


def test_model_specific_fields():
    qwen2 = config_from_hf({**LLAMA, "model_type": "qwen2"})
    assert qwen2.qkv_bias and not qwen2.o_bias and not qwen2.qk_norm
    qwen3 = config_from_hf({**LLAMA, "model_type": "qwen3"})
    assert qwen3.qk_norm and qwen3.head_dim == 128 and not qwen3.qkv_bias
    llama = config_from_hf({**LLAMA, "attention_bias": True, "mlp_bias": True,
                                 "tie_word_embeddings": True, "eos_token_id": [5, 7]})
    assert llama.qkv_bias and llama.o_bias and llama.mlp_bias and llama.tie_word_embeddings
    assert llama.eos_token_ids == (5, 7)


def test_from_checkpoint_dir(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({**LLAMA, "head_dim": 32}))
    config = config_from_hf(tmp_path)
    assert config.head_dim == 32
    assert hash(config) == hash(config_from_hf(tmp_path / "config.json"))


@pytest.mark.parametrize("change, message", [
    ({"model_type": "gpt2"}, "model_type"),
    ({"rope_parameters": {"rope_type": "yarn", "factor": 2.0}}, "rope_type"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "low_freq_factor"),
    ({"use_sliding_window": True}, "Sliding-window"),
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"num_key_value_heads": 3}, "num_kv_heads"),
    ({"vocab_size": None}, "vocab_size"),
])
def test_bad_configs_raise_clear_errors(change, message):
    with pytest.raises(ValueError, match=message):
        config_from_hf({**LLAMA, **change})


def test_missing_config_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        config_from_hf(tmp_path)
