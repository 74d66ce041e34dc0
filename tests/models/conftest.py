"""Fixtures for model tests: tiny random transformers checkpoints saved in-process."""

import pytest
import torch
import transformers

from agentic_esopt.models import sampling, tiny

HF_CLASSES = {
    "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
    "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
    "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
    "qwen3_5": (transformers.Qwen3_5TextConfig, transformers.Qwen3_5ForCausalLM),
}
TINY_HF_CONFIG = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, vocab_size=259,
                      eos_token_id=2, pad_token_id=0, bos_token_id=None)


def random_hf_model(model_type: str, seed: int = 0, **overrides) -> torch.nn.Module:
    """A tiny random transformers model; norms ~ 1 + N(0, 0.1²), all else ~ N(0, 0.1²).

    Qwen3.5's zero-centred norms (weights w of x̂·(1 + w)) are ~ N(0, 0.1²) as well.
    """
    config_cls, model_cls = HF_CLASSES[model_type]
    torch.manual_seed(seed)
    model = model_cls(config_cls(**{**TINY_HF_CONFIG, **overrides})).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.normal_(std=0.1)
            zero_centred = model_type == "qwen3_5" and "linear_attn.norm" not in name
            if "norm" in name and not zero_centred:
                param.add_(1.0)
    return model


@pytest.fixture(scope="session")
def hf_checkpoint(tmp_path_factory):
    """Factory: (torch model, fresh checkpoint dir) of a random model with the tiny tokenizer."""

    def make(model_type: str, max_shard_size=None, seed: int = 0, **overrides):
        model = random_hf_model(model_type, seed=seed, **overrides)
        path = tmp_path_factory.mktemp(f"{model_type}-{seed}")
        kwargs = {} if max_shard_size is None else dict(max_shard_size=max_shard_size)
        model.save_pretrained(path, **kwargs)
        tiny.tiny_tokenizer().save_pretrained(path)
        return model, path

    return make


@pytest.fixture
def fed_pieces(monkeypatch) -> list[int]:
    """Makes ``generate`` feed every chunk wider than 16 tokens in pieces of 16 tokens or
    fewer; returns the list of the fed pieces' widths, filled as calls feed them."""
    monkeypatch.setattr(sampling, "MAX_PIECE_SCORES", 1)
    widths, extend = [], sampling._extend  # pylint: disable=protected-access

    def counting(config, params, deltas, cache, tokens, *args, **kwargs):
        widths.append(tokens.shape[1])
        return extend(config, params, deltas, cache, tokens, *args, **kwargs)

    monkeypatch.setattr(sampling, "_extend", counting)
    return widths
