"""Small helpers shared by the AHD task modules."""

from typing import Callable, Sequence

import numpy as np


def make_rng(seed: int) -> np.random.Generator:
    """A numpy generator from a non-negative integer seed (refuses anything else)."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    return np.random.default_rng(int(seed))


def check_request(size: int, n: int, min_size: int = 1) -> None:
    """Validates an instance request: `n` >= 1 instances of problem size >= `min_size`."""
    for name, value, least in (("size", size, min_size), ("n", n, 1)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < least:
            raise ValueError(f"{name} must be an integer >= {least}, got {value!r}")


def read_only(array: np.ndarray) -> np.ndarray:
    """A read-only view, so a heuristic cannot alter the evaluator's data in place."""
    view = np.asarray(array).view()
    view.flags.writeable = False
    return view


def mean_objective(solve: Callable[[object], float], instances: Sequence) -> float:
    """Mean of `solve(instance)` over a non-empty sequence of instances."""
    if len(instances) == 0:
        raise ValueError("instances is empty")
    return float(np.mean([solve(instance) for instance in instances]))


def pairwise_distances(coordinates: np.ndarray) -> np.ndarray:
    """Euclidean distance matrix (N, N) of points (N, 2)."""
    coordinates = np.asarray(coordinates, np.float64)
    if coordinates.ndim != 2 or coordinates.shape[1] != 2 or len(coordinates) < 2:
        raise ValueError(f"coordinates must have shape (N>=2, 2), got {coordinates.shape}")
    return np.linalg.norm(coordinates[:, None, :] - coordinates[None, :, :], axis=-1)
