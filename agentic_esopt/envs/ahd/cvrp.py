"""Capacitated vehicle routing: instances and the ACO evaluator.

An instance is an (N+1, 3) array with columns [demand, x, y]; row 0 is the depot
(demand 0) and the vehicle capacity is `CAPACITY`. A batch is any sequence of instances.
"""

from typing import Callable, Sequence

import numpy as np

from agentic_esopt.envs.ahd import aco
from agentic_esopt.envs.ahd import common
from agentic_esopt.envs.ahd.validation import check_desirability_matrix

CAPACITY = 50
MAX_DEMAND = 9


def generate_instances(size: int, n: int, seed: int) -> np.ndarray:
    """`n` instances of `size` customers plus a depot: (n, size + 1, 3).

    Coordinates are uniform in the unit square; customer demands are integers
    uniform in 1..9; the depot (row 0) has demand 0.
    """
    common.check_request(size, n)
    rng = common.make_rng(seed)
    coordinates = rng.random((n, size + 1, 2))
    demands = rng.integers(1, MAX_DEMAND + 1, size=(n, size + 1)).astype(np.float64)
    demands[:, 0] = 0.0
    return np.concatenate([demands[..., None], coordinates], axis=-1)


def split_instance(instance) -> tuple[np.ndarray, np.ndarray]:
    """(demands (N+1,), coordinates (N+1, 2)) of a validated instance."""
    instance = np.asarray(instance, np.float64)
    if instance.ndim != 2 or instance.shape[1] != 3 or len(instance) < 2:
        raise ValueError(f"a CVRP instance must have shape (N+1>=2, 3), got {instance.shape}")
    demands = instance[:, 0]
    if demands[0] != 0 or (demands[1:] <= 0).any() or (demands > CAPACITY).any():
        raise ValueError(
            f"CVRP demands must be 0 at the depot and in (0, {CAPACITY}] for customers")
    return demands, instance[:, 1:]


def evaluate_aco(heuristics: Callable, instances: Sequence[np.ndarray],
                 settings: aco.ACOSettings = aco.CVRP_SETTINGS) -> float:
    """Mean best total route length of ACO guided by the heuristic (lower is better).

    `heuristics(distance_matrix, coordinates, demands, capacity)` receives read-only
    arrays (N+1, N+1), (N+1, 2), (N+1,) and the capacity, and must return an
    (N+1, N+1) edge-desirability matrix (see `check_desirability_matrix`).
    """

    def solve(indexed):
        index, instance = indexed
        demands, coordinates = split_instance(instance)
        distances = common.pairwise_distances(coordinates)
        desirability = check_desirability_matrix(
            heuristics(common.read_only(distances), common.read_only(coordinates),
                       common.read_only(demands), CAPACITY),
            len(distances))
        return aco.solve_cvrp(distances, demands, CAPACITY, desirability, settings,
                              aco.instance_rng(settings, index))

    return common.mean_objective(solve, list(enumerate(instances)))
