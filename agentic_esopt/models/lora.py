"""LoRA adapters as extra parameter leaves (ES over the adapters only: ``es.scope="lora"``).

A projection ``layers/<block>/<name>`` (kernel (L, in, out)) with an adapter also holds

    lora_a (L, in, r)    A, kaiming-uniform U(−1/√in, 1/√in): PEFT's default init
    lora_b (L, r, out)   B, zeros (so the adapted model starts as the base model)
    lora_scale (L,)      alpha / r in float32, a constant (scope "lora" never perturbs it)

and ``layers.project`` adds lora_scale · (x A) B to its output, after the bias, as PEFT
does. The adapters are plain leaves, so the ES machinery needs nothing else: scope "lora"
(``es.noise.in_scope``) perturbs and updates only ``lora_a`` and ``lora_b``, with full or
low-rank noise, and population batching adds each row's low-rank deltas of A and B inside
the two products. ``export.save_adapter`` writes them as a PEFT adapter folder;
``merge`` folds them into the kernels (W + scale · A B) for a plain checkpoint.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from agentic_esopt.es.noise import path_id

PyTree = Any
Projection = tuple[str, str, str]  # ("layers", block, name)
LEAVES = ("lora_a", "lora_b", "lora_scale")


class Settings(NamedTuple):
    """An adapter's rank r, alpha (the scale is alpha / r) and target projection names."""

    rank: int
    alpha: float
    targets: tuple[str, ...]


def projections(params: PyTree) -> dict[Projection, dict]:
    """Every layer projection (a ``layers/<block>/<name>`` dict with a kernel) by path."""
    return {("layers", block, name): leaves
            for block, names in params["layers"].items() if isinstance(names, dict)
            for name, leaves in names.items()
            if isinstance(leaves, dict) and "kernel" in leaves}


def adapted(params: PyTree) -> dict[Projection, dict]:
    """The projections that have adapters."""
    return {path: leaves for path, leaves in projections(params).items()
            if "lora_a" in leaves}


def target_projections(params: PyTree, targets: tuple[str, ...]) -> list[Projection]:
    """The projections named by ``targets`` (every block's projection of that name).

    Raises:
      ValueError: a target that names no projection (the message lists those that
        exist), no target, or parameters that already have adapters.
    """
    found = projections(params)
    names = sorted({name for _, _, name in found})
    unknown = [target for target in targets if target not in names]
    if unknown or not targets:
        raise ValueError(f"LoRA targets {list(unknown or targets)} name no projection of "
                         f"this model; choose from {names}")
    if adapted(params):
        raise ValueError("these parameters already have LoRA adapters")
    return [path for path in found if path[2] in targets]


def add_lora(params: PyTree, key: jax.Array, settings: Settings) -> PyTree:
    """``params`` with adapters on the target projections, initialised as PEFT does.

    Each adapter's A is drawn from ``key`` folded with a stable id of its projection's
    path, in float32, and cast to its kernel's dtype.

    Raises:
      ValueError: as ``target_projections``, or rank < 1 or alpha <= 0.
    """
    if settings.rank < 1 or settings.alpha <= 0:
        raise ValueError(f"LoRA needs rank >= 1 and alpha > 0, got {settings}")
    targets = target_projections(params, tuple(settings.targets))
    params = jax.tree.map(lambda leaf: leaf, params)  # New dicts, the same arrays.
    for path in targets:
        leaves = params["layers"][path[1]][path[2]] = dict(params["layers"][path[1]][path[2]])
        layers, n_in, n_out = leaves["kernel"].shape
        bound = 1.0 / math.sqrt(n_in)
        a = jax.random.uniform(jax.random.fold_in(key, path_id("/".join(path))),
                               (layers, n_in, settings.rank), jnp.float32, -bound, bound)
        leaves["lora_a"] = a.astype(leaves["kernel"].dtype)
        leaves["lora_b"] = jnp.zeros((layers, settings.rank, n_out), leaves["kernel"].dtype)
        leaves["lora_scale"] = jnp.full((layers,), settings.alpha / settings.rank,
                                        jnp.float32)
    return params


def settings_of(params: PyTree) -> Settings:
    """The rank, alpha and target names of ``params``' adapters.

    Raises:
      ValueError: no adapters, or adapters of different ranks or scales.
    """
    found = adapted(params)
    if not found:
        raise ValueError("these parameters have no LoRA adapters")
    ranks = {leaves["lora_a"].shape[-1] for leaves in found.values()}
    scales = {float(jnp.asarray(leaves["lora_scale"]).reshape(-1)[0])
              for leaves in found.values()}
    if len(ranks) != 1 or len(scales) != 1:
        raise ValueError(f"adapters of ranks {sorted(ranks)} and scales {sorted(scales)}: "
                         "one rank and one scale are expected")
    rank, scale = ranks.pop(), scales.pop()
    alpha = scale * rank
    return Settings(rank, int(alpha) if alpha == int(alpha) else alpha,
                    tuple(sorted({name for _, _, name in found})))


def base(params: PyTree) -> PyTree:
    """``params`` without their adapter leaves (the base model they adapt)."""
    params = jax.tree.map(lambda leaf: leaf, params)
    for (_, block, name), leaves in adapted(params).items():
        params["layers"][block][name] = {k: v for k, v in leaves.items() if k not in LEAVES}
    return params


def merge(params: PyTree) -> PyTree:
    """The base parameters with every adapter folded into its kernel: W + scale · A B
    (computed in float32, cast to the kernel's dtype); no adapter leaves remain."""
    merged = base(params)
    for (_, block, name), leaves in adapted(params).items():
        delta = jnp.einsum("lir,lro->lio", leaves["lora_a"].astype(jnp.float32),
                           leaves["lora_b"].astype(jnp.float32))
        kernel = leaves["kernel"]
        merged["layers"][block][name]["kernel"] = (
            kernel.astype(jnp.float32) + leaves["lora_scale"][:, None, None] * delta
        ).astype(kernel.dtype)
    return merged
