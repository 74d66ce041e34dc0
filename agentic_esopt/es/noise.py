"""Perturbation noise: key derivation, full-rank and low-rank noise, parameter scopes.

Noise is never stored. Member i's noise for one leaf is regenerated from

    run key -> fold_in(generation) -> fold_in(noise index) -> fold_in(leaf id)

where the leaf id is a CRC32 of the leaf's path string (stable across processes and
backends, unlike Python's salted ``hash``). With antithetic sampling, members 2k and 2k+1
share noise index k and carry opposite signs.

Full-rank mode draws ε ~ N(0, I) with the leaf's shape. Low-rank mode (EGGROLL) draws, for
every matrix leaf of shape (..., in, out), factors A: (..., in, r) and B: (..., out, r) and
uses E = A Bᵀ / √r (unit-variance entries); leading axes are batch axes (e.g. stacked
layers). A matrix leaf has ``ndim >= 2`` and is not named "bias" or "scale": vectors,
including stacked per-layer biases and norm scales of shape (L, d), are cheap and always
get full-rank noise. All noise is drawn in float32 whatever the parameter dtype.

Scopes say which leaves are perturbed (and updated): every leaf, the linear layers, the
LoRA adapter factors (``lora_a``/``lora_b`` leaves, see ``models.lora``) or a regex over
paths. Leaves outside the scope get no noise and are never changed; constants (a LoRA
adapter's ``lora_scale``) are outside every scope.
"""

from __future__ import annotations

import re
import zlib
from typing import Any, NamedTuple

import flax.struct
import jax
import jax.numpy as jnp

PyTree = Any

jax.config.update("jax_threefry_partitionable", True)

NOISE_MODES = ("full", "lowrank")
SCOPE_NAMES = ("full", "all_linear", "lora")
_NON_LINEAR_PATTERN = re.compile(r"embed|lm_head|norm")
_VECTOR_NAMES = re.compile(r"\['(bias|scale)'\]$")
_LORA_NAMES = re.compile(r"\['lora_[ab]'\]$")
_CONSTANT_NAMES = re.compile(r"\['lora_scale'\]$")  # Never perturbed, in any scope.


@flax.struct.dataclass
class Population:
    """One generation's population: O(G) numbers, no weights.

    Attributes:
      keys: (G, 2) uint32 raw noise keys, one per member (antithetic pairs share one).
      signs: (G,) float32, +1 or -1.
      sigma: () float32 perturbation scale of this generation.
      generation: () int32 generation index.
      noise: "full" or "lowrank".
      rank: low-rank factor rank r.
      scope: "full", "all_linear", "lora" or a regex over leaf path strings.
    """

    keys: jax.Array
    signs: jax.Array
    sigma: jax.Array
    generation: jax.Array
    noise: str = flax.struct.field(pytree_node=False, default="full")
    rank: int = flax.struct.field(pytree_node=False, default=1)
    scope: str = flax.struct.field(pytree_node=False, default="full")

    @property
    def size(self) -> int:
        return self.signs.shape[0]


class LowRank(NamedTuple):
    """Scaled low-rank factors of a population's deltas for one leaf.

    Member i adds ``a[i] @ swapaxes(b[i], -1, -2)`` to the leaf; σ·sign_i/√r is folded
    into ``a``. Shapes: a (G, ..., in, r), b (G, ..., out, r).
    """

    a: jax.Array
    b: jax.Array


def path_id(path_string: str) -> int:
    """A stable 32-bit id of a leaf path string."""
    return zlib.crc32(path_string.encode("utf-8"))


def leaf_paths(params: PyTree) -> PyTree:
    """The pytree of leaf path strings (``jax.tree_util.keystr``) of ``params``."""
    return jax.tree_util.tree_map_with_path(lambda p, _: jax.tree_util.keystr(p), params)


def is_matrix(path_string: str, shape: tuple[int, ...]) -> bool:
    """Whether a leaf is a (batch of) matrices rather than a (batch of) vectors."""
    return len(shape) >= 2 and not _VECTOR_NAMES.search(path_string)


def in_scope(scope: str, path_string: str, leaf: jax.Array) -> bool:
    """Whether a leaf is perturbed under ``scope``.

    Args:
      scope: "full" (every leaf but constants), "all_linear" (matrix leaves except
        embeddings, the lm head and norms), "lora" (the LoRA factors ``lora_a`` and
        ``lora_b``), or a regex searched in the path string.
      path_string: the leaf's ``keystr`` path.
      leaf: the leaf (only its shape is read).
    """
    if _CONSTANT_NAMES.search(path_string):
        return False
    if scope == "full":
        return True
    if scope == "all_linear":
        return is_matrix(path_string, leaf.shape) and not _NON_LINEAR_PATTERN.search(path_string)
    if scope == "lora":
        return _LORA_NAMES.search(path_string) is not None
    return re.search(scope, path_string) is not None


def validate_scope(scope: str) -> None:
    """Raises ValueError if ``scope`` is neither a known name nor a valid regex."""
    if scope in SCOPE_NAMES:
        return
    try:
        re.compile(scope)
    except re.error as e:
        raise ValueError(f"scope {scope!r} is not one of {SCOPE_NAMES} or a valid regex: {e}")


def generation_keys(run_key: jax.Array, generation: jax.Array, population_size: int,
                    antithetic: bool) -> tuple[jax.Array, jax.Array]:
    """Member noise keys (G, 2) uint32 and signs (G,) for one generation."""
    members = jnp.arange(population_size)
    noise_index = members // 2 if antithetic else members
    signs = jnp.where(antithetic & (members % 2 == 1), -1.0, 1.0).astype(jnp.float32)
    gen_key = jax.random.fold_in(jax.random.wrap_key_data(run_key), generation)
    keys = jax.vmap(lambda j: jax.random.key_data(jax.random.fold_in(gen_key, j)))(noise_index)
    return keys, signs


def leaf_key(member_key: jax.Array, path_string: str) -> jax.Array:
    """The typed key of one member's noise for one leaf."""
    return jax.random.fold_in(jax.random.wrap_key_data(member_key), path_id(path_string))


def lowrank_factors(key: jax.Array, shape: tuple[int, ...], rank: int
                    ) -> tuple[jax.Array, jax.Array]:
    """Unscaled N(0, 1) factors A (..., in, r) and B (..., out, r) for a leaf shape."""
    *batch, n_in, n_out = shape
    key_a, key_b = jax.random.split(key)
    a = jax.random.normal(key_a, (*batch, n_in, rank), jnp.float32)
    b = jax.random.normal(key_b, (*batch, n_out, rank), jnp.float32)
    return a, b


def leaf_noise(member_key: jax.Array, path_string: str, shape: tuple[int, ...],
               noise: str, rank: int) -> jax.Array:
    """Member's unit-scale noise ε for one leaf, materialised in float32."""
    key = leaf_key(member_key, path_string)
    if noise == "lowrank" and is_matrix(path_string, shape):
        a, b = lowrank_factors(key, shape, rank)
        return jnp.einsum("...ir,...or->...io", a, b) / jnp.sqrt(jnp.float32(rank))
    return jax.random.normal(key, shape, jnp.float32)


def member_noise(params: PyTree, population: Population, member: int | jax.Array) -> PyTree:
    """Member's unit-scale, unsigned noise ε (float32), zeros outside the scope."""
    member_key = population.keys[member]

    def noise_for(path, leaf):
        path_string = jax.tree_util.keystr(path)
        if not in_scope(population.scope, path_string, leaf):
            return jnp.zeros(leaf.shape, jnp.float32)
        return leaf_noise(member_key, path_string, leaf.shape, population.noise,
                          population.rank)

    return jax.tree_util.tree_map_with_path(noise_for, params)


@jax.jit
def perturb(params: PyTree, population: Population, member: int | jax.Array) -> PyTree:
    """θ + σ·sign_i·ε_i for member i, in float32 and cast back to each leaf's dtype
    (leaves outside the scope are returned as they are)."""
    scale = population.sigma * population.signs[member]
    member_key = population.keys[member]

    def perturbed(path, leaf):
        path_string = jax.tree_util.keystr(path)
        if not in_scope(population.scope, path_string, leaf):
            return leaf
        noise = leaf_noise(member_key, path_string, leaf.shape, population.noise,
                           population.rank)
        return (leaf.astype(jnp.float32) + scale * noise).astype(leaf.dtype)

    return jax.tree_util.tree_map_with_path(perturbed, params)


def population_factors(population: Population, params: PyTree) -> PyTree:
    """Every member's scaled low-rank deltas, for population-batched inference.

    Returns a pytree with ``params``' structure down to its leaves, holding at each leaf:
    None outside the scope; ``LowRank`` (σ·sign/√r folded into ``a``) for matrix leaves;
    a (G, *shape) float32 full-rank delta σ·sign·ε for vector leaves (see ``is_matrix``).
    """
    if population.noise != "lowrank":
        raise ValueError("population_factors needs noise='lowrank'; full-rank populations "
                         "are evaluated one member at a time with perturb().")
    scales = population.sigma * population.signs  # (G,)
    root_rank = jnp.sqrt(jnp.float32(population.rank))

    def factors_for(path, leaf):
        path_string = jax.tree_util.keystr(path)
        if not in_scope(population.scope, path_string, leaf):
            return None
        shape = tuple(leaf.shape)
        keys = jax.vmap(lambda k: leaf_key(k, path_string))(population.keys)
        if is_matrix(path_string, shape):
            a, b = jax.vmap(lambda k: lowrank_factors(k, shape, population.rank))(keys)
            return LowRank(a * (scales / root_rank).reshape((-1,) + (1,) * (a.ndim - 1)), b)
        eps = jax.vmap(lambda k: jax.random.normal(k, shape, jnp.float32))(keys)
        return eps * scales.reshape((-1,) + (1,) * len(shape))

    return jax.tree_util.tree_map_with_path(factors_for, params)
