"""Loading models: HF checkpoint directories (safetensors), GGUF files and named defaults.

HF tensor names are routed by the architecture's name map (``Architecture.hf_names``,
matched as regexes) into a ``jax.eval_shape``d parameter tree:
per-layer tensors are stacked on the leading L axis and torch (out, in) matrices are
transposed to (in, out). Every name, shape and dtype is checked against the headers before
any tensor data is read, and each leaf is read, converted and placed on device one at a
time. Given shardings (``sharding.Layout.shardings``), each device's shard of a leaf is
read straight from the memory-mapped file (``jax.make_array_from_callback``), so a model
larger than one device never has a full copy on any device. ``hf_names``, ``route`` and
``is_kernel`` are the one definition of this mapping; ``export`` writes checkpoints with
its inverse.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
import struct
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import flax.traverse_util
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

from agentic_esopt import options as options_lib
from agentic_esopt.models import architectures, tiny
from agentic_esopt.models.config import CACHE_LAYOUTS, ModelConfig, check_cache_layout
from agentic_esopt.models.decoder import init_params

PyTree = Any
# shardings(tree of jax.ShapeDtypeStruct) -> tree of jax.sharding.Sharding (raising
# ValueError for leaves they do not fit), e.g. ``sharding.Layout.shardings``.
Shardings = Callable[[PyTree], PyTree]
GGUF_NAMES = ("smollm2-135m",)
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")

# Multimodal checkpoints (Qwen3.5) keep the text model under model.language_model.
LANGUAGE_MODEL_PREFIX = re.compile(r"^model\.language_model\.")
# Rotary tables, and a multimodal checkpoint's vision tower and multi-token-prediction head.
IGNORED_NAMES = re.compile(r".*\.rotary_emb\.inv_freq$|^mtp\.|^model\.visual\.")

_SAFETENSORS_DTYPES = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16,
    "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8,
    "BOOL": np.bool_,
}


@dataclasses.dataclass(frozen=True)
class Model:
    """A loaded model.

    Attributes:
      config: the static model description.
      params: a plain nested dict of arrays (what ``es`` perturbs).
      tokenizer: a ``transformers`` tokenizer, or None if the checkpoint has none.
    """

    config: ModelConfig
    params: PyTree
    tokenizer: Any

    def with_cache_layout(self, cache_layout: str) -> Model:
        """The model generating with KV caches in ``cache_layout``
        (``ModelConfig.cache_layout``)."""
        return dataclasses.replace(self, config=dataclasses.replace(
            self.config, cache_layout=cache_layout))


class TensorRef(NamedTuple):
    """Where one tensor lives in a safetensors file."""

    file: str
    dtype: np.dtype
    shape: tuple[int, ...]
    start: int  # absolute byte offset in the file


def load(name_or_path: str | os.PathLike, dtype: str | Any = "float32",
         shardings: Shardings | None = None, cache_layout: str = "auto") -> Model:
    """Loads a model by name or path.

    Args:
      name_or_path: "tiny" (random 2-layer Llama, in-process tokenizer), a GGUF default
        name (e.g. "smollm2-135m"), a ``.gguf`` file, or a HF checkpoint directory
        (config.json, model.safetensors or a sharded index, tokenizer files).
      dtype: parameter dtype, "float32", "bfloat16" or "float16" (or a jnp dtype).
      shardings: where each parameter goes (default: JAX's default device).
      cache_layout: the KV cache layout of generation (``ModelConfig.cache_layout``).

    Returns:
      The ``Model``.
    """
    check_cache_layout(cache_layout)  # Before anything is read.
    return _load(name_or_path, dtype, shardings).with_cache_layout(cache_layout)


def _load(name_or_path: str | os.PathLike, dtype: str | Any,
          shardings: Shardings | None) -> Model:
    dtype = resolve_dtype(dtype)
    name = os.fspath(name_or_path)
    if name == "tiny":
        config, params, tokenizer = tiny.tiny_model_parts(dtype=dtype)
        return Model(config, params if shardings is None else jax.device_put(
            params, shardings(params)), tokenizer)
    if name in GGUF_NAMES or name.endswith(".gguf"):
        from agentic_esopt.models import gguf  # pylint: disable=import-outside-toplevel

        gguf_path = gguf.default_gguf_path(name) if name in GGUF_NAMES else name
        return load_hf_dir(gguf.convert_to_hf_dir(gguf_path), dtype, shardings)
    if os.path.isdir(name):
        return load_hf_dir(name, dtype, shardings)
    raise ValueError(f"Cannot load {name!r}: not 'tiny', a known GGUF default {GGUF_NAMES}, "
                     "a .gguf file or a HF checkpoint directory.")


def resolve_dtype(dtype: str | Any) -> Any:
    """A jnp floating dtype from a name or dtype; clear error otherwise."""
    if isinstance(dtype, str):
        if dtype not in DTYPES:
            raise ValueError(f"Unknown dtype {dtype!r}; choose one of {tuple(DTYPES)}.")
        return DTYPES[dtype]
    if not jnp.issubdtype(dtype, jnp.floating):
        raise ValueError(f"Parameter dtype must be floating, got {dtype!r}.")
    return dtype


def load_hf_dir(path: str | os.PathLike, dtype: Any = jnp.float32,
                shardings: Shardings | None = None) -> Model:
    """Loads config, safetensors weights and (if present) the tokenizer of a HF directory."""
    path = os.fspath(path)
    config = architectures.config_from_hf(path)
    params = load_params(config, safetensors_tensors(path), resolve_dtype(dtype), shardings)
    return Model(config, params, load_tokenizer(path))


def load_tokenizer(path: str) -> Any:
    """``AutoTokenizer`` of a checkpoint directory, or None if it has no tokenizer files."""
    if not any(os.path.exists(os.path.join(path, f)) for f in TOKENIZER_FILES):
        return None
    from transformers import AutoTokenizer  # pylint: disable=import-outside-toplevel

    return AutoTokenizer.from_pretrained(path)


def safetensors_tensors(path: str) -> dict[str, TensorRef]:
    """All tensors of a checkpoint dir (single ``model.safetensors`` or a sharded index)."""
    index_path = os.path.join(path, "model.safetensors.index.json")
    if os.path.isfile(index_path):
        with open(index_path) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    elif os.path.isfile(os.path.join(path, "model.safetensors")):
        files = ["model.safetensors"]
    else:
        raise FileNotFoundError(f"No model.safetensors or model.safetensors.index.json in "
                                f"{path!r}.")
    tensors = {}
    for file in files:
        tensors.update(read_safetensors_header(os.path.join(path, file)))
    return tensors


def read_safetensors_header(file: str) -> dict[str, TensorRef]:
    """Tensor locations from a safetensors file header (no tensor data is read)."""
    with open(file, "rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(header_len))
    header.pop("__metadata__", None)
    refs = {}
    for name, entry in header.items():
        if entry["dtype"] not in _SAFETENSORS_DTYPES:
            raise ValueError(f"Tensor {name!r} in {file} has unsupported dtype {entry['dtype']}.")
        refs[name] = TensorRef(file, np.dtype(_SAFETENSORS_DTYPES[entry["dtype"]]),
                               tuple(entry["shape"]), 8 + header_len + entry["data_offsets"][0])
    return refs


def read_tensor(ref: TensorRef) -> np.ndarray:
    """Memory-maps one tensor's data."""
    return np.memmap(ref.file, dtype=ref.dtype, mode="r", offset=ref.start, shape=ref.shape)


def is_kernel(path: tuple[str, ...]) -> bool:
    """Whether parameter ``path`` is an (in, out) matrix that torch stores as (out, in)."""
    return path[-1] == "kernel"


def hf_names(config: ModelConfig, path: tuple[str, ...]) -> dict[int | None, str]:
    """HF tensor name per slot of a stacked ``layers`` leaf, else ``{None: name}``.

    Slot i of a stack holds layer ``config.stacked_layers(block)[i]`` (every layer,
    except Qwen3.5's attention and linear-attention stacks).
    """
    name = architectures.get(config).hf_names[path]
    if path[0] != "layers":
        return {None: name}
    return {slot: name.format(layer) for slot, layer in enumerate(config.stacked_layers(path[1]))}


@functools.cache
def _name_patterns(config: ModelConfig) -> list[tuple[re.Pattern, tuple[str, ...]]]:
    """(regex of a HF tensor name, its parameter path) for each of the config's names."""
    return [(re.compile(re.escape(name).replace(r"\{\}", r"(\d+)") + "$"), path)
            for path, name in architectures.get(config).hf_names.items()]


def route(config: ModelConfig, name: str) -> tuple[tuple[str, ...], int | None] | None:
    """(parameter path, layer index or None) of a HF tensor name, or None if unknown."""
    name = LANGUAGE_MODEL_PREFIX.sub("model.", name)
    for pattern, path in _name_patterns(config):
        match = pattern.match(name)
        if match:
            return path, int(match.group(1)) if match.groups() else None
    return None


def load_params(config: ModelConfig, tensors: Mapping[str, TensorRef], dtype: Any,
                shardings: Shardings | None = None) -> PyTree:
    """Builds the parameter tree from named tensors, validating everything first.

    With ``shardings``, each leaf is assembled from per-device slices read from the files.

    Raises:
      ValueError: naming the tensor, for unexpected or missing names, wrong shapes or
        non-floating dtypes; or naming the leaves ``shardings`` does not fit.
    """
    shapes = jax.eval_shape(functools.partial(init_params, config, dtype=dtype),
                            jax.random.key(0))
    flat_shapes = flax.traverse_util.flatten_dict(shapes)
    sources = _route_all(config, tensors, flat_shapes)
    placements = ({} if shardings is None
                  else flax.traverse_util.flatten_dict(shardings(shapes)))
    leaves = {}
    for path, spec in flat_shapes.items():
        read = functools.partial(read_leaf_slice, tensors, sources[path], is_kernel(path),
                                 spec)
        if path in placements:
            leaves[path] = jax.make_array_from_callback(spec.shape, placements[path], read)
        else:
            leaves[path] = jnp.asarray(read(()))
    return flax.traverse_util.unflatten_dict(leaves)


def read_leaf_slice(tensors: Mapping[str, TensorRef], names: Mapping[int | None, str],
                    kernel: bool, spec: jax.ShapeDtypeStruct,
                    index: tuple[slice, ...]) -> np.ndarray:
    """The ``index`` block of one parameter leaf, read from its tensors (``names``: the
    tensor of each stack slot, or ``{None: name}``), transposed if a kernel, cast."""
    index = tuple(index) + (slice(None),) * (len(spec.shape) - len(index))

    def tensor(name: str) -> np.ndarray:
        data = read_tensor(tensors[name])
        return data.T if kernel else data

    if None in names:
        return np.asarray(tensor(names[None])[index], np.dtype(spec.dtype))
    slots = range(*index[0].indices(spec.shape[0]))
    block = np.empty((len(slots),) + tuple(len(range(*part.indices(size)))
                                           for part, size in zip(index[1:], spec.shape[1:])),
                     np.dtype(spec.dtype))
    for i, slot in enumerate(slots):
        block[i] = tensor(names[slot])[index[1:]]
    return block


def _route_all(config: ModelConfig, tensors: Mapping[str, TensorRef],
               flat_shapes: Mapping[tuple[str, ...], Any]
               ) -> dict[tuple[str, ...], dict[int | None, str]]:
    """Maps every expected (path, layer) to a tensor name; checks names, shapes, dtypes."""
    sources: dict[tuple[str, ...], dict[int | None, str]] = {p: {} for p in flat_shapes}
    for name, ref in sorted(tensors.items()):
        routed = route(config, name)
        if routed is None or routed[0] not in flat_shapes:
            if IGNORED_NAMES.match(name) or (name == "lm_head.weight"
                                             and config.tie_word_embeddings):
                continue
            raise ValueError(f"Unexpected tensor {name!r} for a {config.model_type} model with "
                             "this config.")
        path, layer = routed
        if layer is not None and layer >= config.num_layers:
            raise ValueError(f"Unexpected tensor {name!r}: the config has only "
                             f"{config.num_layers} layers.")
        if layer is not None:
            stacked = config.stacked_layers(path[1])
            if layer not in stacked:
                raise ValueError(f"Unexpected tensor {name!r}: layer {layer} is not a "
                                 f"{path[1]} layer in this config.")
            layer = stacked.index(layer)  # Its slot in the stack.
        expected = flat_shapes[path].shape[1:] if layer is not None else flat_shapes[path].shape
        shape = ref.shape[::-1] if is_kernel(path) else ref.shape
        if tuple(shape) != tuple(expected):
            torch_expected = expected[::-1] if is_kernel(path) else expected
            raise ValueError(f"Tensor {name!r} has shape {ref.shape}, expected "
                             f"{tuple(torch_expected)} from the config.")
        if not np.issubdtype(ref.dtype, np.floating) and ref.dtype != ml_dtypes.bfloat16:
            raise ValueError(f"Tensor {name!r} has non-floating dtype {ref.dtype}.")
        sources[path][layer] = name
    missing = [name for path in flat_shapes for layer, name in hf_names(config, path).items()
               if layer not in sources[path]]
    if missing:
        raise ValueError(f"Checkpoint is missing tensors: {missing[:10]}"
                         f"{' ...' if len(missing) > 10 else ''}")
    return sources


@dataclasses.dataclass(frozen=True)
class Options:
    """Which model a run loads (a config file's ``model`` section)."""

    name: str = options_lib.field("tiny", "'tiny', 'smollm2-135m', a .gguf file or a HF "
                                          "checkpoint folder.")
    dtype: str = options_lib.field("float32", "Parameter dtype: float32, bfloat16 or "
                                              "float16.")
    cache_layout: str = options_lib.field(
        "auto", "KV cache layout of generation: per_layer, stacked or auto (per_layer on "
                "CPU, stacked on GPU/TPU; docs/models.md).")

    def problems(self) -> list[str]:
        problems = []
        check = options_lib.checker(problems)
        check(self.name == "tiny" or self.name in GGUF_NAMES or os.path.exists(self.name),
              f"name: {self.name!r} is not 'tiny', one of {GGUF_NAMES}, or an existing "
              ".gguf file / checkpoint folder")
        check(self.dtype in DTYPES, f"dtype: unknown {self.dtype!r}; choose one of "
                                    f"{tuple(DTYPES)}")
        check(self.cache_layout in CACHE_LAYOUTS, f"cache_layout: unknown "
              f"{self.cache_layout!r}; choose one of {CACHE_LAYOUTS}")
        return problems
