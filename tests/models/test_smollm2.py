"""The embedded default (SmolLM2-135M-Instruct GGUF) against transformers' GGUF loader.

Select with `-m smollm2`. Both sides use the same dequantised weights, so logits agree to
float32 rounding and greedy continuations are identical.
"""

import numpy as np
import pytest
import torch
import transformers

from agentic_esopt import models
from agentic_esopt.models.gguf import default_gguf_path

pytestmark = pytest.mark.smollm2

CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "Answer with one number."},
     {"role": "user", "content": "What is 12 + 30?"}],
    [{"role": "user", "content": "Write a haiku about the sea."}],
]
MAX_NEW_TOKENS = 16


@pytest.fixture(scope="module")
def ours():
    return models.load("smollm2-135m")


@pytest.fixture(scope="module")
def reference():
    path = default_gguf_path("smollm2-135m")
    return transformers.LlamaForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def prompt_ids(ours):
    return [ours.tokenizer.apply_chat_template(chat, add_generation_prompt=True)["input_ids"]
            for chat in CHATS]


def left_padded(prompt_ids, pad_id):
    """(input_ids, attention_mask) of the prompts as one left-padded batch."""
    width = max(map(len, prompt_ids))
    input_ids = np.full((len(prompt_ids), width), pad_id)
    mask = np.zeros_like(input_ids)
    for row, ids in enumerate(prompt_ids):
        input_ids[row, width - len(ids):] = ids
        mask[row, width - len(ids):] = 1
    return input_ids, mask


def test_config_is_the_embedded_default(ours):
    config = ours.config
    shape = (config.num_layers, config.hidden_size, config.num_heads, config.num_kv_heads)
    assert shape == (30, 576, 9, 3) and config.vocab_size == 49152
    assert config.rope.theta == 1e5 and config.tie_word_embeddings
    assert config.eos_token_ids == (2,) and ours.tokenizer.eos_token == "<|im_end|>"


def test_logits_match_transformers(ours, reference, prompt_ids):
    input_ids, mask = left_padded(prompt_ids, ours.tokenizer.pad_token_id)
    logits = np.asarray(models.logits(ours.config, ours.params, input_ids, mask))
    with torch.no_grad():
        expected = reference(
            input_ids=torch.tensor(input_ids), attention_mask=torch.tensor(mask),
            position_ids=torch.tensor(np.maximum(mask.cumsum(1) - 1, 0))).logits.numpy()
    real = mask.astype(bool)
    assert np.abs(logits[real] - expected[real]).max() <= 1e-3


def test_greedy_generation_matches_transformers(ours, reference, prompt_ids):
    generated = models.generate(ours, prompt_ids, max_new_tokens=MAX_NEW_TOKENS,
                                temperature=0.0)
    input_ids, mask = left_padded(prompt_ids, ours.tokenizer.pad_token_id)
    with torch.no_grad():
        expected = reference.generate(
            torch.tensor(input_ids), attention_mask=torch.tensor(mask),
            max_new_tokens=MAX_NEW_TOKENS, do_sample=False, eos_token_id=2, pad_token_id=2)
    for row, token_ids in enumerate(generated.token_ids):
        continuation = expected[row, input_ids.shape[1]:].tolist()
        if 2 in continuation:  # transformers pads finished rows; ours stops after EOS.
            continuation = continuation[:continuation.index(2) + 1]
        assert token_ids == continuation, row
    assert "Paris" in generated.texts[0]
