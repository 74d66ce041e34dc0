"""Decoder logit parity with transformers, the perturbation-aware ops and the loader."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.numpy

from agentic_esopt import models
from agentic_esopt.es.noise import LowRank
from agentic_esopt.models import layers, loading

from parity import left_padded_batch, torch_logits

LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0,
               "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64}


@pytest.mark.parametrize("model_type, overrides, shard", [
    ("llama", {}, None),
    ("llama", {"tie_word_embeddings": True, "rope_parameters": LLAMA3_ROPE}, None),
    ("llama", {"attention_bias": True, "mlp_bias": True,
               "rope_parameters": {"rope_type": "linear", "rope_theta": 500.0,
                                   "factor": 2.0}}, None),
    ("qwen2", {}, "40KB"),
    ("qwen3", {"tie_word_embeddings": True, "head_dim": 24}, None),
    ("qwen3", {"attention_bias": True, "num_key_value_heads": 1}, "40KB"),
])
def test_logits_match_transformers(hf_checkpoint, model_type, overrides, shard):
    torch_model, path = hf_checkpoint(model_type, max_shard_size=shard, **overrides)
    if shard:
        assert (path / "model.safetensors.index.json").exists()
    model = models.load(path)
    ids, mask = left_padded_batch()
    ours = np.asarray(models.logits(model.config, model.params, ids, mask))
    reference = torch_logits(torch_model, ids, mask)
    real = mask.astype(bool)
    assert np.abs(reference[real]).max() > 0.5  # The comparison is not trivially small.
    np.testing.assert_allclose(ours[real], reference[real], atol=1e-4, rtol=0)


def test_bfloat16_smoke(hf_checkpoint):
    torch_model, path = hf_checkpoint("qwen3", head_dim=24)
    model = models.load(path, dtype="bfloat16")
    assert {leaf.dtype for leaf in jax.tree.leaves(model.params)} == {jnp.dtype(jnp.bfloat16)}
    ids, mask = left_padded_batch()
    ours = np.asarray(models.logits(model.config, model.params, ids, mask))
    reference = torch_logits(torch_model, ids, mask)
    real = mask.astype(bool)
    assert ours.dtype == np.float32 and np.isfinite(ours).all()
    assert np.abs(ours[real] - reference[real]).max() < 0.1 * np.abs(reference[real]).max()


def test_linear_and_embed_add_each_rows_member_lowrank_delta():
    rng = np.random.RandomState(0)
    members = jnp.asarray([2, 0, 2, 1])
    x = jnp.asarray(rng.randn(4, 3, 5), jnp.float32)
    kernel = jnp.asarray(rng.randn(5, 7), jnp.float32)
    factors = LowRank(jnp.asarray(rng.randn(3, 5, 2), jnp.float32),  # G = 3 members.
                      jnp.asarray(rng.randn(3, 7, 2), jnp.float32))
    table = jnp.asarray(rng.randn(7, 5), jnp.float32)
    tokens = jnp.asarray([[0, 6, 3], [2, 2, 1], [4, 5, 6], [1, 0, 0]])
    row_linear = layers.linear(x, kernel, layers.rows(factors, members))
    member_linear = layers.member_linear(x, kernel, factors, members)
    embedded = layers.embed(tokens, table, layers.transposed(factors), members)
    for b, m in enumerate(members):
        expected = x[b] @ (kernel + factors.a[m] @ factors.b[m].T)
        np.testing.assert_allclose(row_linear[b], expected, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(member_linear[b], expected, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(embedded[b], (table + factors.b[m] @ factors.a[m].T)[tokens[b]],
                                   rtol=1e-5, atol=1e-5)


def test_init_params_follow_the_naming_convention():
    config = models.ModelConfig(model_type="qwen3", vocab_size=32, hidden_size=16,
                                intermediate_size=24, num_layers=3, num_heads=4,
                                num_kv_heads=2, head_dim=8, qkv_bias=True, qk_norm=True)
    params = models.init_params(config, jax.random.key(0), jnp.bfloat16)
    assert params["embed"]["embedding"].shape == (32, 16)
    assert params["lm_head"]["kernel"].shape == (16, 32)
    assert params["layers"]["attn"]["q_proj"]["kernel"].shape == (3, 16, 32)
    assert params["layers"]["attn"]["k_proj"]["bias"].shape == (3, 16)
    assert params["layers"]["attn"]["k_norm"]["scale"].shape == (3, 8)
    assert params["layers"]["mlp"]["down_proj"]["kernel"].shape == (3, 24, 16)
    assert "bias" not in params["layers"]["attn"]["o_proj"]
    assert params["layers"]["attn"]["q_proj"]["kernel"].dtype == jnp.bfloat16


def _rewrite_tensors(path, edit):
    tensors = safetensors.numpy.load_file(path / "model.safetensors")
    edit(tensors)
    safetensors.numpy.save_file(tensors, path / "model.safetensors")


@pytest.mark.parametrize("edit, message", [
    (lambda t: t.update({"model.layers.1.mlp.up_proj.weight": np.zeros((128, 63), np.float32)}),
     r"model\.layers\.1\.mlp\.up_proj\.weight.*shape \(128, 63\), expected \(128, 64\)"),
    (lambda t: t.pop("model.layers.0.self_attn.k_proj.weight"),
     r"missing.*model\.layers\.0\.self_attn\.k_proj\.weight"),
    (lambda t: t.update({"model.layers.0.mlp.extra.weight": np.zeros(3, np.float32)}),
     r"Unexpected tensor 'model\.layers\.0\.mlp\.extra\.weight'"),
    (lambda t: t.update({"model.layers.2.input_layernorm.weight": np.ones(64, np.float32)}),
     r"model\.layers\.2\.input_layernorm\.weight.*only 2 layers"),
    (lambda t: t.update({"model.norm.weight": np.ones(64, np.int32)}),
     r"model\.norm\.weight.*non-floating"),
])
def test_loader_errors_name_the_tensor(hf_checkpoint, edit, message):
    _, path = hf_checkpoint("llama")
    _rewrite_tensors(path, edit)
    with pytest.raises(ValueError, match=message):
        models.load(path)


def test_loader_reads_bf16_checkpoints_and_ignores_tied_head_copy(hf_checkpoint):
    _, path = hf_checkpoint("llama", tie_word_embeddings=True)
    reference = models.load(path)

    def to_bf16_with_head(tensors):
        for name in list(tensors):
            tensors[name] = tensors[name].astype(jnp.bfloat16)
        tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"]

    _rewrite_tensors(path, to_bf16_with_head)
    model = models.load(path)
    assert "lm_head" not in model.params
    np.testing.assert_allclose(model.params["embed"]["embedding"],
                               reference.params["embed"]["embedding"], rtol=1e-2, atol=1e-3)


def test_load_rejects_unknown_sources(tmp_path):
    with pytest.raises(ValueError, match="Cannot load 'no-such-model'"):
        models.load("no-such-model")
    with pytest.raises(ValueError, match="Unknown dtype"):
        models.load("tiny", dtype="int8")
    (tmp_path / "config.json").write_text(json.dumps(
        {"model_type": "llama", "vocab_size": 8, "hidden_size": 8, "intermediate_size": 8,
         "num_hidden_layers": 1, "num_attention_heads": 2}))
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        models.load(tmp_path)


def test_tiny_model_is_deterministic_and_chats():
    first, second = models.load("tiny"), models.load("tiny")
    jax.tree.map(np.testing.assert_array_equal, first.params, second.params)
    text = first.tokenizer.apply_chat_template([{"role": "user", "content": "héllo 🙂"}],
                                               tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>user\nhéllo 🙂<|im_end|>\n<|im_start|>assistant\n"
    ids = first.tokenizer(text, add_special_tokens=False)["input_ids"]
    assert first.tokenizer.decode(ids) == text
    assert loading.route(first.config, "model.layers.7.self_attn.q_proj.weight") == (
        ("layers", "attn", "q_proj", "kernel"), 7)
