"""Bin packing: offline (ACO-guided) and online (priority-guided, FunSearch style).

An instance is an (N,) integer array of item sizes; a batch is any sequence of them.
Offline bins hold `OFFLINE_CAPACITY`, online bins `ONLINE_CAPACITY`.
"""

from typing import Callable, Sequence

import numpy as np

from agentic_esopt.envs.ahd import aco
from agentic_esopt.envs.ahd import common
from agentic_esopt.envs.ahd.validation import InvalidHeuristicOutput, check_desirability_matrix
from agentic_esopt.envs.ahd.validation import check_real_array

OFFLINE_CAPACITY = 150
OFFLINE_SIZE_RANGE = (20, 100)
ONLINE_CAPACITY = 100
WEIBULL_SHAPE = 3.0
WEIBULL_SCALE = 45.0


def generate_offline_instances(size: int, n: int, seed: int) -> np.ndarray:
    """`n` instances of `size` items with integer sizes uniform in 20..100: (n, size)."""
    common.check_request(size, n)
    low, high = OFFLINE_SIZE_RANGE
    return common.make_rng(seed).integers(low, high + 1, size=(n, size))


def generate_online_instances(size: int, n: int, seed: int) -> np.ndarray:
    """`n` instances of `size` items, Weibull(shape 3, scale 45) rounded into 1..100: (n, size)."""
    common.check_request(size, n)
    draws = WEIBULL_SCALE * common.make_rng(seed).weibull(WEIBULL_SHAPE, size=(n, size))
    return np.clip(np.round(draws), 1, ONLINE_CAPACITY).astype(np.int64)


def check_sizes(sizes, capacity: float) -> np.ndarray:
    """Validated item sizes as an array (N,) in (0, capacity]."""
    sizes = np.asarray(sizes)
    if sizes.ndim != 1 or sizes.size == 0 or not np.issubdtype(sizes.dtype, np.number):
        raise ValueError(f"item sizes must be a non-empty 1-D numeric array, got {sizes.shape}")
    if (sizes <= 0).any() or (sizes > capacity).any():
        raise ValueError(f"item sizes must lie in (0, {capacity}]")
    return sizes


def lower_bound(sizes: np.ndarray, capacity: float) -> int:
    """The L1 bound ceil(sum(sizes) / capacity) on the number of bins."""
    return int(np.ceil(np.sum(sizes) / capacity))


def evaluate_offline_aco(heuristics: Callable, instances: Sequence[np.ndarray],
                         settings: aco.ACOSettings = aco.BPP_SETTINGS) -> float:
    """Mean fewest bins found by ACO guided by `heuristics(demand, capacity)` (lower is better).

    `heuristics` receives a read-only (N,) integer size array and the capacity and must
    return an (N, N) matrix: how desirable it is to put items i and j in the same bin
    (see `check_desirability_matrix`).
    """

    def solve(indexed):
        index, sizes = indexed
        sizes = check_sizes(sizes, OFFLINE_CAPACITY)
        desirability = check_desirability_matrix(
            heuristics(common.read_only(sizes), OFFLINE_CAPACITY), len(sizes))
        return aco.solve_bin_packing(sizes.astype(np.float64), OFFLINE_CAPACITY, desirability,
                                     settings, aco.instance_rng(settings, index))

    return common.mean_objective(solve, list(enumerate(instances)))


def pack_online(priority: Callable, sizes: np.ndarray, capacity: float = ONLINE_CAPACITY) -> int:
    """Number of bins used when `priority` places the items one by one, in order.

    As many bins as items start empty. For each item the heuristic is called as
    `priority(item, bins)` with `bins` a fresh float array of the remaining capacities
    of every bin (open or still empty) the item fits in, in bin order; the item goes to
    the first bin with the highest returned score.

    Raises:
        InvalidHeuristicOutput: scores that are not a real array of len(bins) or hold NaN.
    """
    sizes = check_sizes(sizes, capacity)
    remaining = np.full(len(sizes), float(capacity))
    for item in sizes.astype(np.float64):
        candidates = np.flatnonzero(remaining >= item)
        scores = check_real_array(priority(float(item), remaining[candidates]),
                                  (len(candidates),), "priority output")
        if np.isnan(scores).any():
            raise InvalidHeuristicOutput("priority output contains NaN")
        remaining[candidates[np.argmax(scores)]] -= item
    return int((remaining < capacity).sum())


def online_excess(priority: Callable, sizes: np.ndarray) -> float:
    """Fraction of bins used beyond the L1 lower bound: (used - L1) / L1."""
    sizes = check_sizes(sizes, ONLINE_CAPACITY)
    bound = lower_bound(sizes, ONLINE_CAPACITY)
    return (pack_online(priority, sizes) - bound) / bound


def evaluate_online(priority: Callable, instances: Sequence[np.ndarray]) -> float:
    """Mean excess fraction of bins over the L1 bound (lower is better)."""
    return common.mean_objective(lambda sizes: online_excess(priority, sizes), instances)
