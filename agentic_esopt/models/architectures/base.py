"""The interface every model family implements."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from agentic_esopt.models.config import ModelConfig

Path = tuple[str, ...]


class Architecture(NamedTuple):
    """A model family: its parameters, forward pass, cache and Hugging Face format.

    Attributes:
      layer_types: the layer types it runs (``ModelConfig.kinds`` entries).
      param_shapes: ``(config) -> {path: shape}`` of every parameter leaf.
      init_constant: ``(path) -> float | None``, the constant a leaf starts at, or None
        for a random N(0, 0.02²) draw.
      forward: ``(config, params, deltas, tokens, positions, kv_mask, cache, write_index,
        remat, token_mask) -> (final-normed hidden states, cache)`` (see
        ``decoder.forward``).
      empty_cache: ``(config, batch, length, dtype) -> cache``, zeros with ``length``
        attention slots.
      cache_rows_axis: ``(cache) -> int``, the batch-row axis of every leaf of one of its
        caches (it may depend on the cache's layout, ``ModelConfig.cache_layout``).
      prefix_cache: whether a kept cache cut back to a prefix of its tokens is that
        prefix's cache (true of attention-only models; recurrent states cannot roll back).
      hf_model_types: the ``model_type``s of the HF ``config.json`` files it reads.
      hf_names: parameter path -> HF tensor name ("{}": the layer of a ``layers`` leaf).
      config_from_hf: ``(HF config dict) -> ModelConfig``.
      config_to_hf: ``(config) -> HF config dict``; raises ValueError for a config its HF
        class cannot express.
    """

    layer_types: tuple[str, ...]
    param_shapes: Callable[[ModelConfig], dict[Path, tuple[int, ...]]]
    init_constant: Callable[[Path], float | None]
    forward: Callable[..., tuple[Any, Any]]
    empty_cache: Callable[[ModelConfig, int, int, Any], Any]
    cache_rows_axis: Callable[[Any], int]
    prefix_cache: bool
    hf_model_types: tuple[str, ...]
    hf_names: Mapping[Path, str]
    config_from_hf: Callable[[Mapping[str, Any]], ModelConfig]
    config_to_hf: Callable[[ModelConfig], dict[str, Any]]
