"""Model families behind one interface (``Architecture``), and their registry.

``get(config)`` is the architecture that runs a config, by its ``model_type``. Adding a
family is one module defining an ``Architecture`` plus one ``register`` line below.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from agentic_esopt.models import config as config_lib
from agentic_esopt.models.architectures import dense, qwen3_5
from agentic_esopt.models.architectures.base import Architecture
from agentic_esopt.models.config import ModelConfig

_ARCHITECTURES: dict[str, Architecture] = {}


def register(name: str, architecture: Architecture) -> None:
    """Makes ``architecture`` run the configs whose ``model_type`` is ``name``."""
    if _ARCHITECTURES.get(name, architecture) is not architecture:
        raise ValueError(f"model_type {name!r} is already registered")
    _ARCHITECTURES[name] = architecture


def names() -> tuple[str, ...]:
    """The registered model types."""
    return tuple(sorted(_ARCHITECTURES))


def get(config: ModelConfig) -> Architecture:
    """The architecture that runs ``config``.

    Raises:
      ValueError: an unregistered model type, or layer types it does not run.
    """
    if config.model_type not in _ARCHITECTURES:
        raise ValueError(f"Unsupported model_type {config.model_type!r}; supported: "
                         f"{names()}.")
    architecture = _ARCHITECTURES[config.model_type]
    unsupported = sorted(set(config.kinds) - set(architecture.layer_types))
    if unsupported:
        raise ValueError(f"A {config.model_type} model has no {unsupported} layers.")
    return architecture


def config_from_hf(hf: Mapping[str, Any] | str | os.PathLike) -> ModelConfig:
    """A config from a HF `config.json` dict, file path or checkpoint directory, read by
    the architecture whose ``hf_model_types`` has its `model_type`."""
    if not isinstance(hf, Mapping):
        hf = config_lib.read_hf_config(hf)
    model_type = hf.get("model_type")
    readers = [a for a in _ARCHITECTURES.values() if model_type in a.hf_model_types]
    if not readers:
        raise ValueError(f"Unsupported model_type {model_type!r}; supported: {names()}.")
    return readers[0].config_from_hf(hf)


def config_to_hf(config: ModelConfig) -> dict[str, Any]:
    """The HF `config.json` dict of ``config`` (the inverse of ``config_from_hf``)."""
    return get(config).config_to_hf(config)


register("llama", dense.ARCHITECTURE)
register("qwen2", dense.ARCHITECTURE)
register("qwen3", dense.ARCHITECTURE)
register("qwen3_5", qwen3_5.ARCHITECTURE)
