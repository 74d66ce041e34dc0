"""0/1 knapsack: instances and the constructive evaluator.

An instance is an (N, 2) array with columns [weight, value]; its capacity follows the
published setting from N alone (`capacity_for`). A batch is any sequence of instances.
"""

from typing import Callable, Sequence

import numpy as np

from agentic_esopt.envs.ahd import common
from agentic_esopt.envs.ahd.validation import InvalidHeuristicOutput, check_integer

STOP = -1


def capacity_for(size: int) -> float:
    """Knapsack capacity of an N-item instance: 12.5 for N = 50, 25 otherwise."""
    return 12.5 if size == 50 else 25.0


def generate_instances(size: int, n: int, seed: int) -> np.ndarray:
    """`n` instances of `size` items, weights and values uniform in [0, 1]: (n, size, 2)."""
    common.check_request(size, n)
    return common.make_rng(seed).random((n, size, 2))


def _check_items(items) -> np.ndarray:
    items = np.asarray(items, np.float64)
    if items.ndim != 2 or items.shape[1] != 2 or len(items) == 0:
        raise ValueError(f"a knapsack instance must have shape (N>=1, 2), got {items.shape}")
    if (items < 0).any():
        raise ValueError("knapsack weights and values must be non-negative")
    return items


def pack(select_next_item: Callable, items: np.ndarray) -> float:
    """Total value packed when `select_next_item` picks the items one at a time.

    While some unpacked item still fits, the heuristic is called as
    `select_next_item(remaining_capacity, weights, values)`, where `weights` and
    `values` are fresh arrays of the unpacked items that fit, in their original order.
    It returns an index into those arrays, or -1 to stop packing.

    Raises:
        InvalidHeuristicOutput: a non-integer answer or an index out of range.
    """
    items = _check_items(items)
    weights, values = items[:, 0], items[:, 1]
    remaining = capacity_for(len(items))
    unpacked = np.ones(len(items), dtype=bool)
    total = 0.0
    while True:
        fitting = np.flatnonzero(unpacked & (weights <= remaining))
        if fitting.size == 0:
            return total
        choice = check_integer(select_next_item(remaining, weights[fitting], values[fitting]),
                               "select_next_item output")
        if choice == STOP:
            return total
        if not 0 <= choice < fitting.size:
            raise InvalidHeuristicOutput(
                f"select_next_item returned {choice}; valid answers are 0..{fitting.size - 1} "
                f"(an item that fits) or -1 (stop)")
        item = fitting[choice]
        remaining -= float(weights[item])
        total += float(values[item])
        unpacked[item] = False


def evaluate(select_next_item: Callable, instances: Sequence[np.ndarray]) -> float:
    """Mean total packed value (higher is better)."""
    return common.mean_objective(lambda items: pack(select_next_item, items), instances)
