"""Writing models as Hugging Face checkpoint folders (`transformers` loads them).

The inverse of `loading.load_hf_dir`: tensors get their names from the same table (the
architecture's, through `loading.hf_names`), stacked per-layer leaves are split into one
tensor per layer and (in, out) kernels are transposed back to torch's (out, in); the
config is the architecture's too (`architectures.config_to_hf`). Query/key rows need no
rotary permutation: parameters are always in HF's half-split rotary layout, because HF
folders are loaded as they are and GGUF files are un-permuted when converted
(`gguf.unpermute_rotary`).

    models.save_pretrained(model, "out/checkpoint", generation_config={"temperature": 0.7})
    transformers.AutoModelForCausalLM.from_pretrained("out/checkpoint")

LoRA adapters (``models.lora``) are written as a PEFT adapter folder (``save_adapter``),
or folded into the weights first (``lora.merge``) for a plain checkpoint.

Only one process of a multi-host run should call it, with fully addressable params.
"""

from __future__ import annotations

import json
import os
import pathlib
import secrets
import shutil
from collections.abc import Callable, Mapping
from typing import Any

import flax.traverse_util
import jax.numpy as jnp
import numpy as np
import safetensors.numpy
import transformers

from agentic_esopt.models import architectures, decoder, loading, lora
from agentic_esopt.models.config import ModelConfig, special_token_ids_to_hf
from agentic_esopt.models.tokenizer import save_tokenizer

PyTree = Any
DEFAULT_MAX_SHARD_BYTES = 5 * 10**9
SAMPLING_KEYS = ("temperature", "top_p", "top_k")


def save_pretrained(model: loading.Model, out_dir: str | os.PathLike, *,
                    params: PyTree | None = None, dtype: str | Any | None = None,
                    generation_config: Mapping[str, Any] | None = None,
                    readme: str | None = None,
                    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES) -> pathlib.Path:
    """Writes a HF checkpoint folder: config, safetensors weights, tokenizer and extras.

    Everything is written into a temporary sibling folder that is renamed to `out_dir`
    at the end, so on any error nothing partial is left behind. `models.load(out_dir)`
    gives back the same config and bitwise the same params (in the written dtype).

    Args:
      model: the model whose config and tokenizer (if any) are written.
      out_dir: the folder to create; it must not exist or be empty.
      params: parameters to write instead of `model.params` (e.g. trained ones).
      dtype: "float32", "bfloat16" or "float16"; default: the params' dtype.
      generation_config: `transformers.GenerationConfig` fields (temperature, top_p,
        top_k, max_new_tokens, ...) written to `generation_config.json`; bos/eos/pad ids
        default to the config's. do_sample defaults to temperature > 0; temperature 0
        (this library's greedy decoding) leaves out temperature, top_p and top_k.
      readme: text of a `README.md`.
      max_shard_bytes: above this many bytes of tensors, weights are split into
        `model-0000i-of-0000n.safetensors` files with a `model.safetensors.index.json`.

    Returns:
      `out_dir` as a path.

    Raises:
      ValueError: params that do not fit the config, a config HF cannot express, an
        unknown dtype or an invalid generation config (all before anything is written).
      FileExistsError: `out_dir` exists and is not an empty folder.
      OSError: the parent folder cannot be written.
    """
    config = model.config
    params = model.params if params is None else params
    if lora.adapted(params):
        raise ValueError("These params have LoRA adapters: write them with save_adapter, or "
                         "fold them into the weights with models.lora.merge first.")
    flat = _checked_flat_params(config, params)
    dtype = jnp.dtype(jnp.result_type(*flat.values()) if dtype is None
                      else loading.resolve_dtype(dtype))
    if dtype.name not in loading.DTYPES:
        raise ValueError(f"Cannot export {dtype.name} params; choose a dtype of "
                         f"{tuple(loading.DTYPES)}.")
    hf_config = {**architectures.config_to_hf(config), "dtype": dtype.name,
                 "torch_dtype": dtype.name}
    generation = (None if generation_config is None
                  else hf_generation_config(config, generation_config))

    def fill(staging: pathlib.Path) -> None:
        (staging / "config.json").write_text(json.dumps(hf_config, indent=2) + "\n")
        write_safetensors(staging, hf_tensor_sources(config, flat), flat, dtype,
                          max_shard_bytes)
        if model.tokenizer is not None:
            save_tokenizer(model.tokenizer, staging)
        if generation is not None:
            generation.save_pretrained(staging)
        if readme is not None:
            (staging / "README.md").write_text(readme)

    return _write_folder(pathlib.Path(out_dir), fill)


def save_adapter(config: ModelConfig, params: PyTree, out_dir: str | os.PathLike, *,
                 base_model_name_or_path: str, dtype: str | Any | None = None,
                 readme: str | None = None) -> pathlib.Path:
    """Writes the LoRA adapters of ``params`` (``models.lora``) as a PEFT adapter folder.

    The folder holds ``adapter_config.json`` (peft_type LORA, task_type CAUSAL_LM, r,
    lora_alpha, target_modules, base_model_name_or_path) and ``adapter_model.safetensors``
    with PEFT's tensor names, e.g. ``base_model.model.model.layers.0.self_attn.q_proj
    .lora_A.weight`` (r, in) and ``...lora_B.weight`` (out, r); ``peft.PeftModel
    .from_pretrained(<the base model in transformers>, out_dir)`` applies them. Written
    like ``save_pretrained``: all or nothing.

    Args:
      config: the base model's config.
      params: parameters with adapters (their base leaves must fit ``config``).
      out_dir: the folder to create; it must not exist or be empty.
      base_model_name_or_path: the base model, recorded in the adapter config.
      dtype: "float32", "bfloat16" or "float16"; default: the adapters' dtype.
      readme: text of a `README.md`.

    Raises:
      ValueError: params without adapters, or whose base leaves do not fit ``config``.
      FileExistsError: `out_dir` exists and is not an empty folder.
    """
    settings = lora.settings_of(params)
    _checked_flat_params(config, lora.base(params))
    adapters = lora.adapted(params)
    dtype = jnp.dtype(jnp.result_type(*(leaves["lora_a"] for leaves in adapters.values()))
                      if dtype is None else loading.resolve_dtype(dtype))
    tensors = {}
    for (_, block, name), leaves in adapters.items():
        names = loading.hf_names(config, ("layers", block, name, "kernel"))
        for slot, weight_name in names.items():
            stem = "base_model.model." + weight_name.removesuffix(".weight")
            for factor, suffix in (("lora_a", "lora_A"), ("lora_b", "lora_B")):
                tensors[f"{stem}.{suffix}.weight"] = np.ascontiguousarray(
                    np.asarray(leaves[factor][slot]).astype(dtype).T)
    adapter_config = {
        "peft_type": "LORA", "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model_name_or_path, "r": settings.rank,
        "lora_alpha": settings.alpha, "target_modules": list(settings.targets),
        "lora_dropout": 0.0, "bias": "none", "fan_in_fan_out": False,
        "init_lora_weights": True, "inference_mode": True, "use_rslora": False,
        "use_dora": False, "modules_to_save": None}

    def fill(staging: pathlib.Path) -> None:
        (staging / "adapter_config.json").write_text(json.dumps(adapter_config, indent=2)
                                                     + "\n")
        safetensors.numpy.save_file(dict(sorted(tensors.items())),
                                    staging / "adapter_model.safetensors",
                                    metadata={"format": "pt"})
        if readme is not None:
            (staging / "README.md").write_text(readme)

    return _write_folder(pathlib.Path(out_dir), fill)


def hf_tensor_sources(config: ModelConfig, flat: Mapping[tuple[str, ...], Any]
                      ) -> dict[str, tuple[tuple[str, ...], int | None]]:
    """HF tensor name -> (parameter path, layer or None); global tensors first, then by layer."""
    sources = {name: (path, layer) for path in flat
               for layer, name in loading.hf_names(config, path).items()}
    return dict(sorted(sources.items(), key=lambda item: -1 if item[1][1] is None
                       else item[1][1]))


def hf_tensor(leaf: Any, path: tuple[str, ...], layer: int | None, dtype: Any) -> np.ndarray:
    """One HF tensor (torch layout, `dtype`) of a parameter leaf, or of its `layer` slice."""
    array = np.asarray(leaf if layer is None else leaf[layer]).astype(dtype, copy=False)
    return np.ascontiguousarray(array.T if loading.is_kernel(path) else array)


def write_safetensors(out_dir: pathlib.Path,
                      sources: Mapping[str, tuple[tuple[str, ...], int | None]],
                      flat: Mapping[tuple[str, ...], Any], dtype: Any,
                      max_shard_bytes: int) -> None:
    """Writes `model.safetensors`, or shards and an index above `max_shard_bytes`.

    Tensors are converted one shard at a time, so host memory holds at most one shard.
    """
    sizes = {name: int(np.prod(flat[path].shape[layer is not None:])) * dtype.itemsize
             for name, (path, layer) in sources.items()}
    shards = _group_shards(sizes, max_shard_bytes)
    files = (["model.safetensors"] if len(shards) == 1 else
             [f"model-{i:05d}-of-{len(shards):05d}.safetensors"
              for i in range(1, len(shards) + 1)])
    for file, names in zip(files, shards):
        tensors = {name: hf_tensor(flat[sources[name][0]], *sources[name], dtype)
                   for name in names}
        safetensors.numpy.save_file(tensors, out_dir / file, metadata={"format": "pt"})
        del tensors
    if len(shards) > 1:
        index = {"metadata": {"total_size": sum(sizes.values())},
                 "weight_map": {name: file for file, names in zip(files, shards)
                                for name in names}}
        (out_dir / "model.safetensors.index.json").write_text(json.dumps(index, indent=2)
                                                               + "\n")


def hf_generation_config(config: ModelConfig, options: Mapping[str, Any]
                         ) -> transformers.GenerationConfig:
    """A validated `GenerationConfig` from `options` over the config's special token ids.

    Raises:
      ValueError: transformers rejects the combination of options.
    """
    fields = {**special_token_ids_to_hf(config), **options}
    fields = {key: value for key, value in fields.items() if value is not None}
    fields.setdefault("do_sample", fields.get("temperature", 0) > 0)
    if fields.get("temperature") == 0:  # This library's greedy decoding.
        fields = {key: value for key, value in fields.items() if key not in SAMPLING_KEYS}
    generation = transformers.GenerationConfig(**fields)
    generation.validate(strict=True)
    return generation


def _checked_flat_params(config: ModelConfig, params: PyTree
                         ) -> dict[tuple[str, ...], Any]:
    """The flattened params, after checking their paths and shapes against the config."""
    flat = flax.traverse_util.flatten_dict(params)
    expected = decoder.param_shapes(config)
    problems = [f"missing {'/'.join(p)}" for p in expected if p not in flat]
    problems += [f"unexpected {'/'.join(p)}" for p in flat if p not in expected]
    problems += [f"{'/'.join(p)} has shape {tuple(flat[p].shape)}, expected {expected[p]}"
                 for p in flat if p in expected and tuple(flat[p].shape) != expected[p]]
    problems += [f"{'/'.join(p)} has non-floating dtype {flat[p].dtype}"
                 for p in flat if not jnp.issubdtype(flat[p].dtype, jnp.floating)]
    if problems:
        raise ValueError(f"Params do not fit the {config.model_type} config: "
                         f"{'; '.join(problems)}.")
    return flat


def _group_shards(sizes: Mapping[str, int], max_bytes: int) -> list[list[str]]:
    """Consecutive names in shards of at most `max_bytes` (a bigger tensor gets its own)."""
    shards, total = [[]], 0
    for name, size in sizes.items():
        if shards[-1] and total + size > max_bytes:
            shards, total = shards + [[]], 0
        shards[-1].append(name)
        total += size
    return shards


def _write_folder(out_dir: pathlib.Path, fill: Callable[[pathlib.Path], None]
                  ) -> pathlib.Path:
    """``fill``s a temporary sibling folder and renames it to ``out_dir``; on any error
    nothing is left behind."""
    _check_target(out_dir)
    staging = _make_staging_dir(out_dir)
    try:
        fill(staging)
        try:
            os.replace(staging, out_dir)
        except OSError as error:  # out_dir was created or filled meanwhile.
            raise FileExistsError(f"Refusing to overwrite {str(out_dir)!r}: it appeared "
                                  "while the checkpoint was being written.") from error
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out_dir


def _check_target(out_dir: pathlib.Path) -> None:
    if out_dir.exists() and not (out_dir.is_dir() and not any(out_dir.iterdir())):
        raise FileExistsError(f"Refusing to overwrite {str(out_dir)!r}: it exists and is "
                              "not an empty folder.")


def _make_staging_dir(out_dir: pathlib.Path) -> pathlib.Path:
    """An empty hidden sibling of `out_dir` (created with the parents it needs)."""
    staging = out_dir.parent / f".{out_dir.name}.partial-{secrets.token_hex(4)}"
    try:
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        staging.mkdir()
    except OSError as error:
        raise type(error)(error.errno, f"Cannot write a checkpoint folder in "
                          f"{str(out_dir.parent)!r}: {error.strerror}") from error
    return staging
