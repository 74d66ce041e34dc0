"""models.save_pretrained: folders that transformers and models.load read back exactly."""

import dataclasses
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from agentic_esopt import models
from agentic_esopt.models import architectures, export, gguf, loading, tiny
from agentic_esopt.models.config import RopeConfig

CHAT = [{"role": "user", "content": "héllo 🙂 12+30?"}]
BASE = tiny.tiny_config()
CONFIGS = {
    "llama-tied": BASE,
    "llama-llama3-rope-biases": dataclasses.replace(
        BASE, tie_word_embeddings=False, qkv_bias=True, o_bias=True, mlp_bias=True,
        rope=RopeConfig(theta=500.0, kind="llama3", factor=8.0,
                        original_max_position_embeddings=64)),
    "llama-linear-rope": dataclasses.replace(
        BASE, tie_word_embeddings=False, bos_token_id=1,
        rope=RopeConfig(theta=1e5, kind="linear", factor=2.0)),
    "qwen2-untied": dataclasses.replace(BASE, model_type="qwen2", tie_word_embeddings=False,
                                        qkv_bias=True),
    "qwen2-tied": dataclasses.replace(BASE, model_type="qwen2", qkv_bias=True,
                                      eos_token_ids=(2, 0)),
    "qwen3-tied": dataclasses.replace(BASE, model_type="qwen3", qk_norm=True, head_dim=24),
    "qwen3-untied-biases": dataclasses.replace(
        BASE, model_type="qwen3", qk_norm=True, tie_word_embeddings=False, qkv_bias=True,
        o_bias=True, num_kv_heads=1, max_position_embeddings=512),
}


def random_model(config, seed=0):
    """A Model with the tiny tokenizer; norms ~ 1 + N(0, 0.1²), all else ~ N(0, 0.1²)."""
    shapes = jax.eval_shape(models.init_params, config, jax.random.key(0))
    keys = iter(jax.random.split(jax.random.key(seed), len(jax.tree.leaves(shapes))))
    params = jax.tree_util.tree_map_with_path(
        lambda path, s: (path[-1].key == "scale") + 0.1 * jax.random.normal(next(keys), s.shape),
        shapes)
    return models.Model(config, params, tiny.tiny_tokenizer())


def token_batch(config, length=24):
    """(ids, mask) of two rows, the second left-padded."""
    ids = np.random.RandomState(0).randint(3, config.vocab_size, (2, length))
    mask = np.ones_like(ids)
    mask[1, :7] = 0
    return ids, mask


def load_torch(path, **kwargs):
    """The transformers model of a folder, after checking every tensor was used."""
    model, info = transformers.AutoModelForCausalLM.from_pretrained(
        path, output_loading_info=True, **kwargs)
    assert not (info["missing_keys"] or info["unexpected_keys"] or info["mismatched_keys"])
    return model.eval()


def torch_logits(torch_model, ids, mask):
    with torch.no_grad():
        return torch_model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
                           position_ids=torch.tensor(np.maximum(mask.cumsum(-1) - 1, 0))
                           ).logits.float().numpy()


def assert_logits_match(model, params, torch_model, atol=1e-4, ids_mask=None):
    ids, mask = token_batch(model.config) if ids_mask is None else ids_mask
    ours = np.asarray(models.logits(model.config, params, ids, mask))
    reference = torch_logits(torch_model, ids, mask)
    real = mask.astype(bool)
    assert np.abs(reference[real]).max() > 0.5  # The comparison is not trivially small.
    np.testing.assert_allclose(ours[real], reference[real], atol=atol, rtol=0)


def listing(path):
    return sorted(os.listdir(path))


@pytest.mark.parametrize("config", CONFIGS.values(), ids=CONFIGS.keys())
def test_hf_config_round_trips(config):
    assert architectures.config_from_hf(architectures.config_to_hf(config)) == config


@pytest.mark.parametrize("name", CONFIGS)
def test_transformers_loads_the_export_with_equal_logits(tmp_path, name):
    model = random_model(CONFIGS[name])
    models.save_pretrained(model, tmp_path / "out")
    torch_model = load_torch(tmp_path / "out")
    assert type(torch_model).__name__ == architectures.config_to_hf(model.config)["architectures"][0]
    assert torch_model.dtype == torch.float32
    written = loading.safetensors_tensors(str(tmp_path / "out"))
    assert ("lm_head.weight" in written) != model.config.tie_word_embeddings
    assert_logits_match(model, model.params, torch_model)


def test_load_round_trips_params_config_and_tokenizer_exactly(tmp_path):
    model = random_model(CONFIGS["qwen3-untied-biases"])
    trained = jax.tree.map(lambda x: x + 1e-3, model.params)
    out = models.save_pretrained(model, tmp_path / "out", params=trained, readme="# Tuned\n",
                                 generation_config={"temperature": 0.7, "top_p": 0.9,
                                                    "top_k": None, "max_new_tokens": 32})
    loaded = models.load(out)
    assert loaded.config == model.config
    jax.tree.map(np.testing.assert_array_equal, loaded.params, trained)
    for tokenizer in (loaded.tokenizer, transformers.AutoTokenizer.from_pretrained(out)):
        assert tokenizer.chat_template == tiny.CHAT_TEMPLATE
        assert tokenizer.apply_chat_template(CHAT) == model.tokenizer.apply_chat_template(CHAT)
        assert tokenizer.encode(CHAT[0]["content"]) == model.tokenizer.encode(
            CHAT[0]["content"])
    generation = transformers.GenerationConfig.from_pretrained(out)
    assert (generation.do_sample, generation.temperature, generation.top_p) == (True, 0.7, 0.9)
    assert (generation.max_new_tokens, generation.eos_token_id) == (32, 2)
    assert (out / "README.md").read_text() == "# Tuned\n"
    assert listing(tmp_path) == ["out"]  # No staging folder left behind.


def test_greedy_generation_config_drops_sampling_fields():
    generation = export.hf_generation_config(BASE, {"temperature": 0.0, "top_p": 0.9})
    assert not generation.do_sample and "top_p" not in generation.to_diff_dict()
    assert generation.pad_token_id == 0 and generation.eos_token_id == 2


def test_bfloat16_export_loads_in_transformers(tmp_path):
    model = random_model(CONFIGS["qwen2-untied"])
    out = models.save_pretrained(model, tmp_path / "out", dtype="bfloat16")
    torch_model = load_torch(out, dtype="auto")
    assert torch_model.dtype == torch.bfloat16
    bf16 = jax.tree.map(lambda x: x.astype(jnp.bfloat16), model.params)
    jax.tree.map(np.testing.assert_array_equal, models.load(out, dtype="bfloat16").params, bf16)
    ids, mask = token_batch(model.config)
    ours = np.asarray(models.logits(model.config, bf16, ids, mask))
    reference = torch_logits(torch_model, ids, mask)
    real = mask.astype(bool)
    assert np.isfinite(reference).all()
    assert np.abs(ours[real] - reference[real]).max() < 0.1 * np.abs(reference[real]).max()


def test_small_max_shard_bytes_writes_an_index(tmp_path):
    model = random_model(CONFIGS["llama-llama3-rope-biases"])
    out = models.save_pretrained(model, tmp_path / "out", max_shard_bytes=40_000)
    weight_map = json.loads((out / "model.safetensors.index.json").read_text())["weight_map"]
    shards = {}
    for name, ref in loading.safetensors_tensors(str(out)).items():
        assert weight_map[name] == os.path.basename(ref.file)
        shards.setdefault(ref.file, []).append(ref.dtype.itemsize * np.prod(ref.shape))
    n = len(shards)
    assert n > 2 and listing(out).count(f"model-{n:05d}-of-{n:05d}.safetensors") == 1
    assert all(sum(sizes) <= 40_000 or len(sizes) == 1 for sizes in shards.values())
    assert_logits_match(model, model.params, load_torch(out))
    jax.tree.map(np.testing.assert_array_equal, models.load(out).params, model.params)


def test_refuses_to_overwrite_a_non_empty_folder(tmp_path):
    model = random_model(BASE)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="Refusing to overwrite.*not an empty folder"):
        models.save_pretrained(model, tmp_path / "out")
    assert listing(tmp_path / "out") == ["keep.txt"] and listing(tmp_path) == ["out"]
    (tmp_path / "empty").mkdir()
    models.save_pretrained(model, tmp_path / "empty")
    assert "model.safetensors" in listing(tmp_path / "empty")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_unwritable_parent_is_a_clear_error(tmp_path):
    parent = tmp_path / "locked"
    parent.mkdir()
    parent.chmod(0o555)
    try:
        with pytest.raises(PermissionError, match="Cannot write a checkpoint folder in"):
            models.save_pretrained(random_model(BASE), parent / "out")
        assert listing(parent) == []
    finally:
        parent.chmod(0o755)


def test_parent_that_is_a_file_is_a_clear_error(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(OSError, match="Cannot write a checkpoint folder in"):
        models.save_pretrained(random_model(BASE), tmp_path / "file" / "out")
    assert listing(tmp_path) == ["file"]


def test_an_error_while_writing_leaves_nothing(tmp_path, monkeypatch):
    def fail(*args, **kwargs):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(export, "save_tokenizer", fail)
    with pytest.raises(RuntimeError, match="disk on fire"):
        models.save_pretrained(random_model(BASE), tmp_path / "out")
    assert listing(tmp_path) == []


@pytest.mark.parametrize("edit, config, options, message", [
    (lambda p: p.update(lm_head={"kernel": jnp.zeros((64, 259))}), BASE, None,
     "unexpected lm_head/kernel"),
    (lambda p: p["layers"]["attn"]["q_proj"].update(kernel=jnp.zeros((2, 64, 63))), BASE,
     None, r"layers/attn/q_proj/kernel has shape \(2, 64, 63\), expected \(2, 64, 64\)"),
    (lambda p: None, dataclasses.replace(BASE, model_type="qwen2", mlp_bias=True), None,
     "no HF equivalent.*qwen2 has q/k/v biases.*only llama has MLP biases"),
    (lambda p: None, BASE, {"do_sample": False, "temperature": 0.5}, "temperature"),
    (lambda p: None, BASE, {"top_p": 0.9}, "top_p"),
])
def test_invalid_inputs_fail_before_writing(tmp_path, edit, config, options, message):
    model = random_model(config)
    params = jax.tree.map(lambda x: x, model.params)
    edit(params)
    with pytest.raises(ValueError, match=message):
        models.save_pretrained(model, tmp_path / "out", params=params,
                               generation_config=options)
    assert listing(tmp_path) == []


@pytest.mark.smollm2
def test_smollm2_export_matches_transformers(tmp_path):
    model = models.load("smollm2-135m")
    out = models.save_pretrained(model, tmp_path / "smollm2",
                                 generation_config={"temperature": 0.0, "max_new_tokens": 64})
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    ids = tokenizer.apply_chat_template(CHAT, add_generation_prompt=True)["input_ids"]
    assert ids == model.tokenizer.apply_chat_template(CHAT, add_generation_prompt=True)[
        "input_ids"]
    batch = np.asarray([ids]), np.ones((1, len(ids)), np.int64)
    exported = load_torch(out)
    # The export is exact: transformers gives bitwise the logits of the folder converted
    # from the GGUF, whose rotary rows were un-permuted to HF's layout.
    source = load_torch(gguf.convert_to_hf_dir(gguf.default_gguf_path("smollm2-135m")))
    np.testing.assert_array_equal(torch_logits(exported, *batch), torch_logits(source, *batch))
    # Ours vs torch differ by float32 summation order over 30 layers (1.2e-4 observed).
    assert_logits_match(model, model.params, exported, atol=5e-4, ids_mask=batch)
