"""The in-place update: ĝ regenerated leaf by leaf, transformed by optax and applied.

Given each member's weight w_i, the estimate of one leaf is

    ĝ = s · Σ_i w_i sign_i ε_i            (s: the strategy's scale, e.g. 1/G)

regenerated inside a loop (one member, or a chunk of low-rank factors no larger than the
leaf, per step), so the update never holds more than O(one leaf) of noise whatever G is.
The optax transformation receives −ĝ. Leaves outside the scope are left exactly as they
are: no estimate, no optimizer step (nor weight decay), no rounding.

How steps are applied is the engine's, not the strategy's (``Mode``). With an
``elementwise`` optimizer (plain SGD) each leaf's estimate is regenerated, transformed and
applied before the next leaf's begins, and a low-rank matrix larger than ``block_bytes``
a block of rows at a time (bit for bit the whole leaf's), so the update holds θ plus a few
blocks (full-rank and stochastically rounded leaves: a few of the largest leaf). Any other
transformation gets the whole float32 estimate at once (+1× float32 θ): one that reads the
whole tree (``clip_by_global_norm``, ``masked``, L-BFGS, line searches) must, and
Adam/AdamW, element-wise as they are, stay whole so results stay bitwise: compiled per
leaf, XLA turns their bias-correction division x/c into x·(1/c), which moves last bits.

Low-precision leaves (bfloat16) lose steps far below their spacing to nearest rounding;
``rounding="stochastic"`` rounds each entry up or down with probabilities that make it
unbiased, from a key of the run key and the generation (replay stays bitwise), and
``master_weights`` keeps an exact float32 copy of such leaves in the optimizer state.
"""

from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

from agentic_esopt.es import noise as noise_lib

PyTree = Any
ROUNDINGS = ("nearest", "stochastic")
UPDATE_BLOCK_BYTES = 16 * 2**20  # The default float32 block of an in-place leaf update.
_ROUNDING_STREAM = 0x7FFFFFFF  # Folded into the run key for rounding keys (≠ any generation).
_MIN_DOT_ROWS = 256  # Rows of a matrix's block at least (see _min_block_rows).


class Mode(NamedTuple):
    """How the engine applies a step: memory and precision, never the algorithm.

    Attributes:
      elementwise: the optimizer treats every entry alone (as sgd does), so the update
        estimates, transforms and applies one leaf after another.
      rounding: "nearest" or "stochastic": how updated low-precision leaves round.
      master_weights: keep float32 copies of low-precision leaves in the optimizer state.
      block_bytes: with ``elementwise``, a low-rank matrix leaf larger than this many
        float32 bytes is updated a block of rows at a time (``block_rows``), bit for bit
        as whole; 0 updates whole leaves.
    """

    elementwise: bool = False
    rounding: str = "nearest"
    master_weights: bool = False
    block_bytes: int = 0


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


def _apply_step(mode: Mode, leaf: jax.Array, master: jax.Array | None, step: jax.Array,
                key: jax.Array) -> tuple[jax.Array, jax.Array | None]:
    """(the updated leaf, its updated master copy or None) after adding ``step``."""
    if master is not None:
        master = master + step
        return master.astype(leaf.dtype), master
    if mode.rounding == "stochastic" and _low_precision(leaf):
        return stochastic_round(leaf.astype(jnp.float32) + step, leaf.dtype, key), None
    return optax.apply_updates(leaf, step), None


def init_optimizer(optimizer: optax.GradientTransformation, mode: Mode,
                   params: PyTree) -> PyTree:
    """The optimizer state of ``params`` (with their float32 masters if ``mode`` keeps
    them). Jit it: the float32 view of the params is then never materialised when the
    optimizer keeps no per-parameter state (plain SGD)."""
    inner = optimizer.init(jax.tree.map(lambda p: p.astype(jnp.float32), params))
    return (inner, jax.tree.map(_master, params)) if mode.master_weights else inner


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


def _min_block_rows(mode: Mode, population: noise_lib.Population,
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
            and not (mode.rounding == "stochastic" and _low_precision(leaf))):
        return None
    return _MIN_DOT_ROWS if leaf.ndim == 2 else 1


def _update_rows(optimizer: optax.GradientTransformation, mode: Mode,
                 population: noise_lib.Population, path_string: str, leaf: jax.Array,
                 master: jax.Array | None, leaf_state: PyTree,
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
    step, leaf_state = optimizer.update(
        descent, jax.tree.map(cut, leaf_state), rows if master is None else master_rows)
    rows, master_rows = _apply_step(mode, rows, master_rows, step,
                                    noise_lib.leaf_key(rounding_key, path_string))
    return rows, master_rows, leaf_state, jnp.sum(step * step)


def _update_leaf(optimizer: optax.GradientTransformation, mode: Mode,
                 population: noise_lib.Population, path_string: str, leaf: jax.Array,
                 master: jax.Array | None, leaf_state: PyTree,
                 draws: tuple[jax.Array, jax.Array], scale: jax.Array | float,
                 rounding_key: jax.Array) -> tuple[jax.Array, jax.Array | None, PyTree,
                                                   jax.Array]:
    """``_update_rows`` over the whole leaf; a low-rank matrix (``_min_block_rows``) one
    block of rows (``block_rows``) at a time, in place: the temporaries are one block's.
    Every entry is computed as the whole leaf's would be (noise entries, factor rows and
    element-wise steps are the same), so the result is the same bit for bit; Σ step² is
    summed by block."""
    min_rows = _min_block_rows(mode, population, path_string, leaf)
    size = None if min_rows is None else block_rows(leaf.shape, mode.block_bytes,
                                                    min_rows)
    if size is None or size == leaf.shape[0]:
        return _update_rows(optimizer, mode, population, path_string, leaf, master,
                            leaf_state, draws, scale, rounding_key, None)

    def update_block(start, rows, carry):
        leaf, master, state, square = carry
        # Moments come from the carry (updated so far), the rest from the input state.
        state_in = jax.tree.map(lambda now, given: now if now.shape == leaf.shape else given,
                                state, leaf_state)
        new_rows, master_rows, state_rows, block_square = _update_rows(
            optimizer, mode, population, path_string, leaf, master, state_in, draws, scale,
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


def _update_leafwise(optimizer: optax.GradientTransformation, mode: Mode, params: PyTree,
                     opt_state: PyTree, population: noise_lib.Population,
                     draws: tuple[jax.Array, jax.Array], scale: jax.Array | float,
                     rounding_key: jax.Array) -> tuple[PyTree, PyTree, list[jax.Array]]:
    """Estimate, transform and apply one leaf after another (``Mode.elementwise``),
    a leaf larger than ``Mode.block_bytes`` block by block (``_update_leaf``).

    Each leaf's noise coefficients depend (by an added zero) on the previous leaf's
    updated values, so XLA schedules the leaves in turn and no two leaves' estimates are
    ever live together (``optimization_barrier`` does not order them: XLA:CPU drops it).
    """
    inner, masters = opt_state if mode.master_weights else (opt_state, None)
    flat, treedef = jax.tree_util.tree_flatten_with_path(params)
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
                optimizer, mode, population, path_string, leaf, master, leaf_state,
                (keys, coeffs), scale, rounding_key)
            squares.append(square)
            previous = (leaf, square)
        leaves.append(leaf)
        new_masters.append(master)
        new_states.append(leaf_state)
    inner = join(new_states)
    if mode.master_weights:
        inner = (inner, treedef.unflatten(new_masters))
    return treedef.unflatten(leaves), inner, squares


def _update_whole(optimizer: optax.GradientTransformation, mode: Mode, params: PyTree,
                  opt_state: PyTree, population: noise_lib.Population,
                  draws: tuple[jax.Array, jax.Array], scale: jax.Array | float,
                  rounding_key: jax.Array) -> tuple[PyTree, PyTree, list[jax.Array]]:
    """The optax transformation on the whole estimate at once (any transformation)."""
    inner, masters = opt_state if mode.master_weights else (opt_state, None)
    descent = jax.tree_util.tree_map_with_path(
        lambda path, leaf: -_scoped_estimate(population, jax.tree_util.keystr(path), leaf,
                                             *draws, scale), params)
    steps, inner = optimizer.update(
        descent, inner, params if masters is None else jax.tree.map(
            lambda leaf, master: leaf if master is None else master, params, masters))
    flat, treedef = jax.tree_util.tree_flatten_with_path(params)
    scoped = [noise_lib.in_scope(population.scope, jax.tree_util.keystr(path), leaf)
              for path, leaf in flat]
    steps = treedef.flatten_up_to(steps)
    updated = [_apply_step(mode, leaf, master, step,
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




def rounding_key(run_key: jax.Array, generation: jax.Array) -> jax.Array:
    """The raw key of a generation's stochastic rounding (a stream of the run key)."""
    return jax.random.key_data(jax.random.fold_in(jax.random.fold_in(
        jax.random.wrap_key_data(run_key), _ROUNDING_STREAM), generation))


def apply(optimizer: optax.GradientTransformation, mode: Mode, params: PyTree,
          opt_state: PyTree, population: noise_lib.Population, weights: jax.Array,
          antithetic: bool, scale: jax.Array | float, key: jax.Array
          ) -> tuple[PyTree, PyTree, jax.Array]:
    """θ and the optimizer state after the step on ĝ = scale · Σ_i weights_i sign_i ε_i,
    and the step's norm.

    Args:
      optimizer: the transformation, given −ĝ.
      mode: how steps are applied (memory, rounding).
      params, opt_state: θ and the optimizer state (``init_optimizer``).
      population: the generation's members.
      weights: (G,) per-member weights.
      antithetic: pairs of members share their noise draw.
      scale: s, the estimate's factor.
      key: the generation's rounding key (``rounding_key``).
    """
    draws = _noise_draws(population, weights, antithetic)
    update = _update_leafwise if mode.elementwise else _update_whole
    params, opt_state, squares = update(optimizer, mode, params, opt_state, population,
                                        draws, scale, key)
    return params, opt_state, jnp.sqrt(sum(squares))
