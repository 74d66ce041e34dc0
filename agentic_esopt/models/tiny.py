"""A tiny random Llama with an in-process byte-level tokenizer, for tests and demos.

Nothing is downloaded or read from disk: the tokenizer is a byte-level BPE over the 256
byte symbols plus ChatML special tokens, and the weights are drawn from a seed.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import tokenizers
from tokenizers import decoders, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from agentic_esopt.models.config import ModelConfig
from agentic_esopt.models.decoder import init_params

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    """Byte-level BPE tokenizer: specials at ids 0-2, then one token per byte (259 in all)."""
    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS)}
    for symbol in sorted(pre_tokenizers.ByteLevel.alphabet()):
        vocab[symbol] = len(vocab)
    backend = tokenizers.Tokenizer(tokenizers.models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(list(SPECIAL_TOKENS))
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|im_end|>",
                                   pad_token="<|endoftext|>", chat_template=CHAT_TEMPLATE)


def tiny_config(vocab_size: int = 259) -> ModelConfig:
    """A 2-layer GQA Llama config (d=64, 4 query / 2 key-value heads, tied embeddings)."""
    return ModelConfig(model_type="llama", vocab_size=vocab_size, hidden_size=64,
                       intermediate_size=128, num_layers=2, num_heads=4, num_kv_heads=2,
                       head_dim=16, rms_norm_eps=1e-6, tie_word_embeddings=True,
                       eos_token_ids=(SPECIAL_TOKENS.index("<|im_end|>"),),
                       pad_token_id=SPECIAL_TOKENS.index("<|endoftext|>"))


def tiny_model_parts(seed: int = 0, dtype: Any = jnp.float32
                     ) -> tuple[ModelConfig, Any, PreTrainedTokenizerFast]:
    """(config, params, tokenizer) of the tiny model; weights are a pure function of seed."""
    tokenizer = tiny_tokenizer()
    config = tiny_config(len(tokenizer))
    return config, init_params(config, jax.random.key(seed), dtype), tokenizer
