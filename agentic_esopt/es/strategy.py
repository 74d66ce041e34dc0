"""What every ES strategy shares: init / ask / perturb / tell over any parameter pytree.

An ES algorithm is an ``Algorithm`` record of hooks; ``make`` binds it to a ``Sampling``
(how ``ask`` draws the population) and returns a ``Strategy`` of pure functions. Each
generation ``ask`` derives G member keys (no weights); the caller evaluates members
θ + σ ε_i (``perturb``, or population-batched inference with ``noise.population_factors``);
``tell`` shapes the rewards into weights w and applies the estimate

    ĝ = s · Σ_i w_i sign_i ε_i            (s: the algorithm's scale, e.g. 1/G)

through the algorithm's optax transformation, which receives −ĝ. ``tell`` regenerates the
noise leaf by leaf inside a loop (one member, or a chunk of low-rank factors no larger than
the leaf, per step), so it never holds more than O(one leaf) of noise whatever G is.

Leaves outside the scope are left exactly as they are: no estimate, no optimizer step
(nor weight decay), no rounding.

``tell`` consumes its state: the update donates it, so the new state reuses its buffers
(copy a state, or the params given to ``init``, that must outlive it). With an
``Algorithm.elementwise`` optimizer (plain SGD) each leaf's estimate is regenerated,
transformed and applied before the next leaf's begins, and a low-rank matrix larger than
``Algorithm.block_bytes`` a block of rows at a time (bit for bit the whole leaf's), so the
update holds θ plus a few blocks (full-rank and stochastically rounded leaves: a few of
the largest leaf). Any other transformation gets the whole float32 estimate at once
(+1× float32 θ): one that reads the whole tree (``clip_by_global_norm``, ``masked``,
L-BFGS, line searches) must, and Adam/AdamW, element-wise as they are, stay whole so
results stay bitwise: compiled per leaf, XLA turns their bias-correction division x/c into
x·(1/c), which moves last bits.

Low-precision leaves (bfloat16) lose steps far below their spacing to nearest rounding;
``rounding="stochastic"`` rounds each entry up or down with probabilities that make it
unbiased, drawing from a key of the run key and the generation (replay stays bitwise), and
``master_weights`` keeps an exact float32 copy of such leaves in the optimizer state.

The settings of a run (``Options``, the config's ``es`` section) and their problems
(``settings_problems``, also checked by the strategy factories) live here too.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Callable, NamedTuple

import flax.struct
import jax
import jax.numpy as jnp
import optax

from agentic_esopt import options as options_lib
from agentic_esopt.es import fitness as fitness_lib
from agentic_esopt.es import noise as noise_lib
from agentic_esopt.es import schedules

PyTree = Any
OPTIMIZERS = ("sgd", "adam", "adamw")
ROUNDINGS = ("nearest", "stochastic")
_ROUNDING_STREAM = 0x7FFFFFFF  # Folded into the run key for rounding keys (≠ any generation).
UPDATE_BLOCK_BYTES = 16 * 2**20  # The default float32 block of an in-place leaf update.
_MIN_DOT_ROWS = 256  # Rows of a matrix's block at least (see _min_block_rows).


@flax.struct.dataclass
class ESState:
    """Optimiser state: parameters, optax state, generation index and raw run key (2,)."""

    params: PyTree
    opt_state: PyTree
    generation: jax.Array
    key: jax.Array


class Strategy(NamedTuple):
    """Pure functions of an ES strategy, plus the spec that rebuilds it.

    ``tell`` validates rewards on the host, then calls ``update``, the jitted update with
    no host-side checks (usable under ``jax.jit`` / ``.lower`` for memory analysis).
    """

    init: Callable[[jax.Array, PyTree], ESState]
    ask: Callable[[ESState], noise_lib.Population]
    perturb: Callable[[ESState, noise_lib.Population, int], PyTree]
    tell: Callable[[ESState, noise_lib.Population, Any], tuple[ESState, dict]]
    update: Callable[[ESState, noise_lib.Population, jax.Array], tuple[ESState, dict]]
    spec: dict


class Sampling(NamedTuple):
    """How ``ask`` draws a population.

    Attributes:
      population_size: G, the number of perturbed members per generation.
      sigma: the perturbation scale's schedule over generations.
      noise: "full" (Gaussian ε per leaf) or "lowrank" (E = A Bᵀ/√r for matrices).
      rank: r for low-rank noise.
      antithetic: members 2k and 2k+1 share ε with opposite signs.
      scope: "full", "all_linear", "lora" or a regex over leaf paths: the leaves
        perturbed and updated.
    """

    population_size: int
    sigma: schedules.Schedule
    noise: str = "full"
    rank: int = 1
    antithetic: bool = False
    scope: str = "full"

    @property
    def spec(self) -> dict:
        return dict(population_size=self.population_size, sigma=self.sigma.spec,
                    noise=self.noise, rank=self.rank, antithetic=self.antithetic,
                    scope=self.scope)


class Algorithm(NamedTuple):
    """The hooks that make an ES algorithm of the shared machinery.

    Attributes:
      shape: rewards (G,) float32 -> per-member weights w (G,), recorded in the history.
      scale: the population -> the estimate's factor s (a scalar), e.g. 1/G or 1/(Gσ).
      optimizer: the optax transformation applied to −ĝ; its state is ``ESState.opt_state``.
      learning_rate: α's schedule, reported in the metrics.
      spec: the algorithm's own settings, JSON values (``Strategy.spec`` adds the sampling
        settings and ``learning_rate``).
      elementwise: ``optimizer`` treats every entry alone (as sgd does), so the update
        estimates, transforms and applies one leaf after another.
      rounding: "nearest" or "stochastic": how updated low-precision leaves round.
      master_weights: keep float32 copies of low-precision leaves in the optimizer state.
      block_bytes: with ``elementwise``, a low-rank matrix leaf larger than this many
        float32 bytes is updated a block of rows at a time (``block_rows``), bit for bit
        as whole; 0 updates whole leaves.
    """

    shape: Callable[[jax.Array], jax.Array]
    scale: Callable[[noise_lib.Population], jax.Array | float]
    optimizer: optax.GradientTransformation
    learning_rate: schedules.Schedule
    spec: dict
    elementwise: bool = False
    rounding: str = "nearest"
    master_weights: bool = False
    block_bytes: int = 0


def raw_key(key: jax.Array | int) -> jax.Array:
    """Raw uint32 (2,) key data from an int seed, a typed key or raw key data."""
    if isinstance(key, int):
        key = jax.random.key(key)
    if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        return jax.random.key_data(key)
    return jnp.asarray(key, jnp.uint32)


def named_optimizer(name: str, learning_rate: schedules.Schedule,
                    weight_decay: float) -> optax.GradientTransformation:
    """The optax transformation called ``name`` (one of ``OPTIMIZERS``)."""
    if name == "adamw":
        return optax.adamw(learning_rate, weight_decay=weight_decay)
    return {"sgd": optax.sgd, "adam": optax.adam}[name](learning_rate)


def settings_problems(*, population_size: int, noise: str, rank: int, antithetic: bool,
                      scope: str, sigma_schedule: str, sigma_start: float, sigma_end: float,
                      sigma_warmup: int, learning_rate: float | None,
                      optimizer: str | optax.GradientTransformation, weight_decay: float,
                      fitness: str, rounding: str = "nearest",
                      master_weights: bool = False,
                      update_block_bytes: int = UPDATE_BLOCK_BYTES) -> list[str]:
    """Every problem of a set of ES settings (the trainer checks σ warmup < generations).

    Args:
      population_size, noise, rank, antithetic, scope: as in ``Sampling``.
      sigma_schedule, sigma_start, sigma_end, sigma_warmup: σ's schedule kind and fields.
      learning_rate: α at the start, or None (only with an optax transformation).
      optimizer: one of ``OPTIMIZERS`` or an optax transformation.
      weight_decay: decoupled weight decay (adamw only).
      fitness: one of ``fitness.SHAPERS``.
      rounding: one of ``ROUNDINGS``, how updated low-precision leaves round.
      master_weights: keep float32 copies of low-precision leaves.
      update_block_bytes: ``Algorithm.block_bytes``, an int >= 0.
    """
    problems: list[str] = []
    check = options_lib.checker(problems)
    check(population_size >= 2, f"population_size must be >= 2 (z-scores of one member are "
                                f"meaningless), got {population_size}")
    check(not (antithetic and population_size % 2),
          f"antithetic sampling needs an even population_size, got {population_size}")
    check(noise in noise_lib.NOISE_MODES,
          f"noise: unknown {noise!r}; choose one of {noise_lib.NOISE_MODES}")
    check(rank >= 1, f"rank must be >= 1, got {rank}")
    check(not (rank > 1 and noise == "full"),
          f"rank={rank} only applies to noise='lowrank'; use rank=1 with full noise")
    try:
        noise_lib.validate_scope(scope)
    except ValueError as error:
        problems.append(f"scope: {error}")
    check(sigma_schedule in schedules.KINDS,
          f"sigma_schedule: unknown {sigma_schedule!r}; choose one of {schedules.KINDS}")
    check(sigma_start > 0, f"sigma_start must be > 0, got {sigma_start}")
    check(sigma_end >= 0, f"sigma_end must be >= 0, got {sigma_end}")
    check(not (sigma_schedule == "constant" and sigma_end != sigma_start),
          f"sigma_end: a constant σ schedule has no end value; set sigma_end = "
          f"sigma_start ({sigma_start}), got {sigma_end}")
    check(sigma_warmup >= 0, f"sigma_warmup must be >= 0, got {sigma_warmup}")
    custom = isinstance(optimizer, optax.GradientTransformation)
    check(custom or optimizer in OPTIMIZERS,
          f"optimizer: unknown {optimizer!r}; choose one of {OPTIMIZERS} or pass an "
          "optax.GradientTransformation")
    check(custom or learning_rate is not None,
          "learning_rate is required unless optimizer is an optax transformation")
    check(custom or learning_rate is None or learning_rate > 0,
          f"learning_rate must be > 0, got {learning_rate}")
    check(weight_decay >= 0, f"weight_decay must be >= 0, got {weight_decay}")
    check(not (weight_decay > 0 and optimizer != "adamw"),
          f"weight_decay only applies to optimizer='adamw', got "
          f"{'an optax transformation' if custom else repr(optimizer)}")
    check(fitness in fitness_lib.SHAPERS,
          f"fitness: unknown {fitness!r}; choose one of {tuple(fitness_lib.SHAPERS)}")
    check(rounding in ROUNDINGS,
          f"rounding: unknown {rounding!r}; choose one of {ROUNDINGS}")
    check(not (master_weights and rounding == "stochastic"),
          "rounding='stochastic' and master_weights are alternatives: float32 master "
          "weights are exact, so choose one")
    check(isinstance(update_block_bytes, int) and not isinstance(update_block_bytes, bool)
          and update_block_bytes >= 0,
          f"update_block_bytes must be an int >= 0 (0: whole leaves), got "
          f"{update_block_bytes!r}")
    return problems


def _rows(x: jax.Array, block: tuple[Any, int] | None, axis: int = 0) -> jax.Array:
    """The rows ``block`` = (start, size) of ``x`` along ``axis`` (all of ``x`` if None)."""
    return x if block is None else jax.lax.dynamic_slice_in_dim(x, block[0], block[1], axis)


def _rows_shape(shape: tuple[int, ...], block: tuple[Any, int] | None) -> tuple[int, ...]:
    return shape if block is None else (block[1], *shape[1:])


def _estimate_leaf(path_string: str, shape: tuple[int, ...], keys: jax.Array,
                   coeffs: jax.Array, noise: str, rank: int,
                   block: tuple[Any, int] | None = None) -> jax.Array:
    """Σ_j coeffs_j ε_j for one leaf (its rows ``block``: low-rank matrices only),
    regenerating one member's noise per loop step."""
    if noise == "lowrank" and noise_lib.is_matrix(path_string, shape):
        return _estimate_lowrank_leaf(path_string, shape, keys, coeffs, rank, block)

    def add_member(j, total):
        return total + coeffs[j] * noise_lib.leaf_noise(keys[j], path_string, shape, noise,
                                                        rank)

    return jax.lax.fori_loop(0, keys.shape[0], add_member,
                             jnp.zeros(shape, jnp.float32))


def _estimate_lowrank_leaf(path_string: str, shape: tuple[int, ...], keys: jax.Array,
                           coeffs: jax.Array, rank: int,
                           block: tuple[Any, int] | None = None) -> jax.Array:
    """Σ_j coeffs_j A_j B_jᵀ/√r as matmuls over chunks of members.

    A chunk's factors hold at most one leaf's worth of numbers, so memory stays O(leaf)
    while each step is one (in × chunk·r) @ (chunk·r × out) matmul. The rows ``block``
    of the estimate take the same rows of A (and of B where they are a batch axis), so
    they are the whole estimate's rows, entry for entry.
    """
    *_, n_in, n_out = shape
    size = keys.shape[0]
    chunk = max(1, min(size, (n_in * n_out) // ((n_in + n_out) * rank)))
    num_chunks = -(-size // chunk)
    padding = num_chunks * chunk - size
    keys = jnp.concatenate([keys, jnp.broadcast_to(keys[:1], (padding, 2))])
    coeffs = jnp.concatenate([coeffs, jnp.zeros((padding,), coeffs.dtype)])
    keys = keys.reshape(num_chunks, chunk, 2)
    coeffs = coeffs.reshape(num_chunks, chunk) / jnp.sqrt(jnp.float32(rank))

    def add_chunk(j, total):
        factors = jax.vmap(lambda k: noise_lib.lowrank_factors(
            noise_lib.leaf_key(k, path_string), shape, rank))(keys[j])
        a, b = factors
        a = _rows(a * coeffs[j].reshape((-1,) + (1,) * (a.ndim - 1)), block, axis=1)
        if len(shape) > 2:  # Axis 0 is a batch axis of both factors.
            b = _rows(b, block, axis=1)
        return total + jnp.einsum("c...ir,c...or->...io", a, b)

    return jax.lax.fori_loop(0, num_chunks, add_chunk,
                             jnp.zeros(_rows_shape(shape, block), jnp.float32))


def _noise_draws(population: noise_lib.Population, weights: jax.Array,
                antithetic: bool) -> tuple[jax.Array, jax.Array]:
    """The distinct noise keys and their coefficients Σ w_i sign_i over the members sharing
    each (antithetic pairs share one draw)."""
    coeffs = weights * population.signs
    if not antithetic:
        return population.keys, coeffs
    return population.keys[::2], coeffs.reshape(-1, 2).sum(axis=1)


def _scoped_estimate(population: noise_lib.Population, path_string: str, leaf: jax.Array,
                     keys: jax.Array, coeffs: jax.Array, scale: jax.Array | float,
                     block: tuple[Any, int] | None = None) -> jax.Array:
    """One leaf's ĝ, or its rows ``block`` (float32; zeros outside the scope)."""
    if not noise_lib.in_scope(population.scope, path_string, leaf):
        return jnp.zeros(_rows_shape(leaf.shape, block), jnp.float32)
    return scale * _estimate_leaf(path_string, leaf.shape, keys, coeffs, population.noise,
                                  population.rank, block)


def stochastic_round(x: jax.Array, dtype: Any, key: jax.Array) -> jax.Array:
    """``x`` (float32) rounded to one of its two neighbours in ``dtype``, unbiased.

    The farther neighbour is taken with probability |x − nearest| / (its distance to the
    nearest), so E[result] = x; non-finite values round to nearest.
    """
    nearest = x.astype(dtype)
    base = nearest.astype(jnp.float32)
    other = jnp.nextafter(nearest, jnp.where(x > base, jnp.inf, -jnp.inf).astype(dtype))
    chance = (x - base) / (other.astype(jnp.float32) - base)
    return jnp.where(jax.random.uniform(key, x.shape) < chance, other, nearest)


def _low_precision(leaf: jax.Array) -> bool:
    return jnp.issubdtype(leaf.dtype, jnp.floating) and jnp.finfo(leaf.dtype).bits < 32


def _master(leaf: jax.Array) -> jax.Array | None:
    """The float32 master copy a leaf keeps with ``master_weights`` (None if float32)."""
    return leaf.astype(jnp.float32) if _low_precision(leaf) else None


def _apply_step(algorithm: Algorithm, leaf: jax.Array, master: jax.Array | None,
                step: jax.Array, key: jax.Array) -> tuple[jax.Array, jax.Array | None]:
    """(the updated leaf, its updated master copy or None) after adding ``step``."""
    if master is not None:
        master = master + step
        return master.astype(leaf.dtype), master
    if algorithm.rounding == "stochastic" and _low_precision(leaf):
        return stochastic_round(leaf.astype(jnp.float32) + step, leaf.dtype, key), None
    return optax.apply_updates(leaf, step), None


def _init_optimizer(algorithm: Algorithm, params: PyTree) -> PyTree:
    # Jitted, so the float32 view of the params is never materialised when the
    # optimizer keeps no per-parameter state (plain SGD).
    inner = algorithm.optimizer.init(jax.tree.map(lambda p: p.astype(jnp.float32), params))
    return (inner, jax.tree.map(_master, params)) if algorithm.master_weights else inner


def _ask(sampling: Sampling, state: ESState) -> noise_lib.Population:
    keys, signs = noise_lib.generation_keys(state.key, state.generation,
                                            sampling.population_size, sampling.antithetic)
    return noise_lib.Population(keys=keys, signs=signs,
                                sigma=sampling.sigma(state.generation).astype(jnp.float32),
                                generation=state.generation, noise=sampling.noise,
                                rank=sampling.rank, scope=sampling.scope)


def _per_leaf(opt_state: PyTree, treedef: Any) -> tuple[list[PyTree], Callable]:
    """An optax state split into one state per parameter leaf, and the function that joins
    per-leaf states back into one.

    Sub-trees shaped like the parameters (moments) are split; anything else (step counts,
    hyperparameters) is shared, and the joined state takes the first leaf's.
    """
    def like(node):
        return jax.tree.structure(node) == treedef

    slots, outer = jax.tree.flatten(opt_state, is_leaf=like)
    split = [like(slot) for slot in slots]
    columns = [treedef.flatten_up_to(slot) if is_split else None
               for slot, is_split in zip(slots, split)]
    states = [outer.unflatten([column[i] if is_split else slot for slot, column, is_split
                               in zip(slots, columns, split)])
              for i in range(treedef.num_leaves)]

    def join(leaf_states: list[PyTree]) -> PyTree:
        rows = [outer.flatten_up_to(state) for state in leaf_states]
        return outer.unflatten([treedef.unflatten([row[k] for row in rows]) if is_split
                                else rows[0][k] for k, is_split in enumerate(split)])

    return states, join


def _zero_after(leaf: jax.Array, square: jax.Array) -> jax.Array:
    """A float32 zero that XLA computes only once ``leaf`` and ``square`` are."""
    value = leaf.reshape(-1)[0].astype(jnp.float32) + square
    return 0.0 * jnp.where(jnp.isfinite(value), value, 0.0)


def block_rows(shape: tuple[int, ...], block_bytes: int, min_rows: int = 1) -> int:
    """Rows (entries of axis 0) per block of a leaf's in-place update: as many as fit
    ``block_bytes`` of float32, at least ``min_rows``; all of them if that leaves fewer
    than two blocks or ``block_bytes`` is 0. The last block also takes the remainder."""
    rows = shape[0] if shape else 1
    if not shape or not block_bytes:
        return rows
    size = max(min_rows, block_bytes // (4 * math.prod(shape[1:])), 1)
    return size if 2 * size <= rows else rows


def _min_block_rows(algorithm: Algorithm, population: noise_lib.Population,
                    path_string: str, leaf: jax.Array) -> int | None:
    """The fewest rows a block of this leaf may have, or None: update it whole.

    Only low-rank matrices are cut: a block's estimate comes from the same rows of the
    small factors. Threefry draws (full-rank noise, stochastic rounding's uniforms) cover
    the whole leaf; a block of them is a slice of the whole draw, which XLA:CPU computes
    whole for every block. A single matrix's estimate is a dot product over its rows, and
    XLA:CPU picks other kernels, whose sums round differently, for dots of a few rows
    (below ~64), so its blocks keep ``_MIN_DOT_ROWS``; stacked layers cut anywhere.
    """
    if not (population.noise == "lowrank"
            and noise_lib.is_matrix(path_string, leaf.shape)
            and noise_lib.in_scope(population.scope, path_string, leaf)
            and not (algorithm.rounding == "stochastic" and _low_precision(leaf))):
        return None
    return _MIN_DOT_ROWS if leaf.ndim == 2 else 1


def _update_rows(algorithm: Algorithm, population: noise_lib.Population, path_string: str,
                 leaf: jax.Array, master: jax.Array | None, leaf_state: PyTree,
                 draws: tuple[jax.Array, jax.Array], scale: jax.Array | float,
                 rounding_key: jax.Array, block: tuple[Any, int] | None
                 ) -> tuple[jax.Array, jax.Array | None, PyTree, jax.Array]:
    """The rows ``block`` of one leaf (all if None) estimated, transformed and stepped:
    (leaf rows, master rows or None, optimizer state, Σ step²).

    ``leaf_state``'s arrays shaped like the leaf (moments) are cut to the block; the rest
    (step counts) are the same for every block.
    """
    def cut(x):
        return _rows(x, block) if x.shape == leaf.shape else x

    descent = -_scoped_estimate(population, path_string, leaf, *draws, scale, block)
    rows, master_rows = _rows(leaf, block), None if master is None else _rows(master, block)
    step, leaf_state = algorithm.optimizer.update(
        descent, jax.tree.map(cut, leaf_state), rows if master is None else master_rows)
    rows, master_rows = _apply_step(algorithm, rows, master_rows, step,
                                    noise_lib.leaf_key(rounding_key, path_string))
    return rows, master_rows, leaf_state, jnp.sum(step * step)


def _update_leaf(algorithm: Algorithm, population: noise_lib.Population, path_string: str,
                 leaf: jax.Array, master: jax.Array | None, leaf_state: PyTree,
                 draws: tuple[jax.Array, jax.Array], scale: jax.Array | float,
                 rounding_key: jax.Array) -> tuple[jax.Array, jax.Array | None, PyTree,
                                                   jax.Array]:
    """``_update_rows`` over the whole leaf; a low-rank matrix (``_min_block_rows``) one
    block of rows (``block_rows``) at a time, in place: the temporaries are one block's.
    Every entry is computed as the whole leaf's would be (noise entries, factor rows and
    element-wise steps are the same), so the result is the same bit for bit; Σ step² is
    summed by block."""
    min_rows = _min_block_rows(algorithm, population, path_string, leaf)
    size = None if min_rows is None else block_rows(leaf.shape, algorithm.block_bytes,
                                                    min_rows)
    if size is None or size == leaf.shape[0]:
        return _update_rows(algorithm, population, path_string, leaf, master, leaf_state,
                            draws, scale, rounding_key, None)

    def update_block(start, rows, carry):
        leaf, master, state, square = carry
        # Moments come from the carry (updated so far), the rest from the input state.
        state_in = jax.tree.map(lambda now, given: now if now.shape == leaf.shape else given,
                                state, leaf_state)
        new_rows, master_rows, state_rows, block_square = _update_rows(
            algorithm, population, path_string, leaf, master, state_in, draws, scale,
            rounding_key, (start, rows))

        def put(full, part):
            return jax.lax.dynamic_update_slice_in_dim(full, part, start, 0)

        state = jax.tree.map(lambda now, part: put(now, part) if now.shape == leaf.shape
                             else part, state, state_rows)
        return (put(leaf, new_rows), None if master is None else put(master, master_rows),
                state, square + block_square)

    last = (leaf.shape[0] // size - 1) * size  # The last block takes the remainder.
    carry = jax.lax.fori_loop(0, last // size,
                              lambda i, carry: update_block(i * size, size, carry),
                              (leaf, master, leaf_state, jnp.zeros((), jnp.float32)))
    return update_block(last, leaf.shape[0] - last, carry)


def _update_leafwise(algorithm: Algorithm, state: ESState, population: noise_lib.Population,
                     draws: tuple[jax.Array, jax.Array], scale: jax.Array | float,
                     rounding_key: jax.Array) -> tuple[PyTree, PyTree, list[jax.Array]]:
    """Estimate, transform and apply one leaf after another (``Algorithm.elementwise``),
    a leaf larger than ``Algorithm.block_bytes`` block by block (``_update_leaf``).

    Each leaf's noise coefficients depend (by an added zero) on the previous leaf's
    updated values, so XLA schedules the leaves in turn and no two leaves' estimates are
    ever live together (``optimization_barrier`` does not order them: XLA:CPU drops it).
    """
    inner, masters = state.opt_state if algorithm.master_weights else (state.opt_state, None)
    flat, treedef = jax.tree_util.tree_flatten_with_path(state.params)
    leaf_states, join = _per_leaf(inner, treedef)
    masters = [None] * len(flat) if masters is None else treedef.flatten_up_to(masters)
    keys, coeffs = draws
    leaves, new_masters, new_states, squares = [], [], [], []
    previous = None  # The last updated leaf and its step's square (orders the next).
    for (path, leaf), master, leaf_state in zip(flat, masters, leaf_states):
        path_string = jax.tree_util.keystr(path)
        if noise_lib.in_scope(population.scope, path_string, leaf):
            if previous is not None:
                coeffs = coeffs + _zero_after(*previous)
            leaf, master, leaf_state, square = _update_leaf(
                algorithm, population, path_string, leaf, master, leaf_state,
                (keys, coeffs), scale, rounding_key)
            squares.append(square)
            previous = (leaf, square)
        leaves.append(leaf)
        new_masters.append(master)
        new_states.append(leaf_state)
    inner = join(new_states)
    if algorithm.master_weights:
        inner = (inner, treedef.unflatten(new_masters))
    return treedef.unflatten(leaves), inner, squares


def _update_whole(algorithm: Algorithm, state: ESState, population: noise_lib.Population,
                  draws: tuple[jax.Array, jax.Array], scale: jax.Array | float,
                  rounding_key: jax.Array) -> tuple[PyTree, PyTree, list[jax.Array]]:
    """The optax transformation on the whole estimate at once (any transformation)."""
    inner, masters = state.opt_state if algorithm.master_weights else (state.opt_state, None)
    descent = jax.tree_util.tree_map_with_path(
        lambda path, leaf: -_scoped_estimate(population, jax.tree_util.keystr(path), leaf,
                                             *draws, scale), state.params)
    steps, inner = algorithm.optimizer.update(
        descent, inner, state.params if masters is None else jax.tree.map(
            lambda leaf, master: leaf if master is None else master, state.params, masters))
    flat, treedef = jax.tree_util.tree_flatten_with_path(state.params)
    scoped = [noise_lib.in_scope(population.scope, jax.tree_util.keystr(path), leaf)
              for path, leaf in flat]
    steps = treedef.flatten_up_to(steps)
    updated = [_apply_step(algorithm, leaf, master, step,
                           noise_lib.leaf_key(rounding_key, jax.tree_util.keystr(path)))
               if in_scope else (leaf, master)
               for (path, leaf), master, step, in_scope in zip(
                   flat, ([None] * len(flat) if masters is None
                          else treedef.flatten_up_to(masters)), steps, scoped)]
    params = treedef.unflatten([leaf for leaf, _ in updated])
    if masters is not None:
        inner = (inner, treedef.unflatten([master for _, master in updated]))
    return params, inner, [jnp.sum(step * step) for step, in_scope in zip(steps, scoped)
                           if in_scope]


def _update(sampling: Sampling, algorithm: Algorithm, state: ESState,
            population: noise_lib.Population, rewards: jax.Array) -> tuple[ESState, dict]:
    weights = algorithm.shape(rewards)
    draws = _noise_draws(population, weights, sampling.antithetic)
    rounding_key = jax.random.key_data(jax.random.fold_in(jax.random.fold_in(
        jax.random.wrap_key_data(state.key), _ROUNDING_STREAM), state.generation))
    update = _update_leafwise if algorithm.elementwise else _update_whole
    params, opt_state, squares = update(algorithm, state, population, draws,
                                        algorithm.scale(population), rounding_key)
    metrics = dict(sigma=population.sigma,
                   learning_rate=algorithm.learning_rate(state.generation),
                   update_norm=jnp.sqrt(sum(squares)),
                   reward_mean=rewards.mean(), reward_std=rewards.std(),
                   reward_max=rewards.max(), reward_min=rewards.min(),
                   weights=weights)
    new_state = ESState(params=params, opt_state=opt_state,
                        generation=state.generation + 1, key=state.key)
    return new_state, metrics


def make(sampling: Sampling, algorithm: Algorithm) -> Strategy:
    """The ``Strategy`` of ``algorithm`` over populations drawn as ``sampling`` says."""
    init_optimizer = jax.jit(functools.partial(_init_optimizer, algorithm))
    update = jax.jit(functools.partial(_update, sampling, algorithm), donate_argnums=0)

    def init(key: jax.Array | int, params: PyTree) -> ESState:
        return ESState(params=params, opt_state=init_optimizer(params),
                       generation=jnp.zeros((), jnp.int32), key=raw_key(key))

    def perturb(state: ESState, population: noise_lib.Population, member: int) -> PyTree:
        return noise_lib.perturb(state.params, population, member)

    def tell(state: ESState, population: noise_lib.Population,
             rewards) -> tuple[ESState, dict]:
        rewards = fitness_lib.check_rewards(rewards, sampling.population_size)
        return update(state, population, jnp.asarray(rewards))

    spec = dict(sampling.spec, learning_rate=algorithm.learning_rate.spec, **algorithm.spec)
    return Strategy(init=init, ask=jax.jit(functools.partial(_ask, sampling)),
                    perturb=perturb, tell=tell, update=update, spec=spec)


@dataclasses.dataclass(frozen=True)
class Options:
    """The ES settings of a run (a config file's ``es`` section)."""

    population_size: int = options_lib.field(8, "G, perturbed members per generation.")
    noise: str = options_lib.field("full", "Perturbation noise: 'full' or 'lowrank'.")
    rank: int = options_lib.field(1, "Rank r of low-rank noise.")
    antithetic: bool = options_lib.field(False, "Antithetic pairs (+ε, −ε); needs an even "
                                                "population.")
    sigma_schedule: str = options_lib.field("cosine", "σ schedule: constant, linear or "
                                                      "cosine.")
    sigma_start: float = options_lib.field(1e-3, "σ at the start (after warmup).")
    sigma_end: float = options_lib.field(2.5e-4, "σ at the last generation (== sigma_start "
                                                 "for constant).")
    sigma_warmup: int = options_lib.field(0, "Generations of linear σ warmup from 0.")
    learning_rate: float = options_lib.field(5e-4, "α, the ES learning rate.")
    optimizer: str = options_lib.field("sgd", "Optimizer on the ES estimate: sgd (the "
                                              "paper's), adam or adamw.")
    weight_decay: float = options_lib.field(0.0, "Decoupled weight decay (adamw only).")
    scale_by_sigma: bool = options_lib.field(False, "Divide the estimate by σ (the paper "
                                                    "does not).")
    fitness: str = options_lib.field("zscore", "Reward shaping: zscore, centered_rank or "
                                               "identity.")
    scope: str = options_lib.field("full", "Perturbed parameters: 'full', 'all_linear', "
                                           "'lora' (LoRA adapters only) or a regex over "
                                           "parameter paths.")
    lora_rank: int = options_lib.field(8, "Rank r of the LoRA adapters (scope 'lora').")
    lora_alpha: float = options_lib.field(8.0, "LoRA alpha: adapters add (alpha / r)·x A B "
                                               "(scope 'lora').")
    lora_targets: str = options_lib.field("q_proj,v_proj", "Comma-separated projections "
                                                           "that get adapters (scope "
                                                           "'lora').")
    rounding: str = options_lib.field("nearest", "How updated bfloat16/float16 parameters "
                                                 "round: nearest or stochastic (unbiased).")
    master_weights: bool = options_lib.field(False, "Keep float32 copies of bfloat16/"
                                                    "float16 parameters in the optimizer "
                                                    "state (exact; +4 bytes per entry).")
    update_block_bytes: int = options_lib.field(
        UPDATE_BLOCK_BYTES, "SGD updates low-rank matrices in place a block of rows of at "
                            "most this many float32 bytes at a time (0: whole leaves); "
                            "the result is the same bit for bit.")

    @property
    def lora_target_names(self) -> tuple[str, ...]:
        """``lora_targets`` as a tuple of projection names."""
        return tuple(name.strip() for name in self.lora_targets.split(","))

    def problems(self) -> list[str]:
        """Every problem with these settings (``settings_problems``, and the LoRA options';
        whether the targets exist is checked against the model, ``models.lora``)."""
        settings = dataclasses.asdict(self)
        for name in ("scale_by_sigma", *_LORA_FIELDS):  # Either value is valid.
            del settings[name]
        problems = settings_problems(**settings)
        check = options_lib.checker(problems)
        if self.scope != "lora":
            changed = [name for name in _LORA_FIELDS
                       if getattr(self, name) != getattr(Options, name)]
            check(not changed, f"{', '.join(changed)}: LoRA options need scope='lora', got "
                               f"scope={self.scope!r}")
            return problems
        names = self.lora_target_names
        check(self.lora_rank >= 1, f"lora_rank must be >= 1, got {self.lora_rank}")
        check(self.lora_alpha > 0, f"lora_alpha must be > 0, got {self.lora_alpha}")
        check(all(name.isidentifier() for name in names) and len(set(names)) == len(names),
              f"lora_targets must be distinct comma-separated projection names like "
              f"'q_proj,v_proj', got {self.lora_targets!r}")
        return problems


_LORA_FIELDS = ("lora_rank", "lora_alpha", "lora_targets")
