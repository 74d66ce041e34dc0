"""Travelling salesman: instances, the constructive evaluator and the ACO evaluator.

An instance is an (N, 2) array of node coordinates in the unit square; a batch of
instances is any sequence of them, e.g. an (n, N, 2) array.
"""

from typing import Callable, Sequence

import numpy as np

from agentic_esopt.envs.ahd import aco
from agentic_esopt.envs.ahd import common
from agentic_esopt.envs.ahd.validation import InvalidHeuristicOutput, check_desirability_matrix
from agentic_esopt.envs.ahd.validation import check_integer


def generate_instances(size: int, n: int, seed: int) -> np.ndarray:
    """`n` instances of `size` nodes drawn uniformly in the unit square: (n, size, 2)."""
    common.check_request(size, n, min_size=2)
    return common.make_rng(seed).random((n, size, 2))


def tour_length(tour: np.ndarray, distances: np.ndarray) -> float:
    """Length of the closed tour visiting `tour` in order and returning to its start."""
    tour = np.asarray(tour)
    return float(distances[tour, np.roll(tour, -1)].sum())


def construct_tour(select_next_node: Callable, distances: np.ndarray) -> np.ndarray:
    """Builds a tour from node 0, asking `select_next_node` for every next node.

    The heuristic is called N - 1 times as
    `select_next_node(current_node, 0, unvisited_nodes, distance_matrix)`, where
    `unvisited_nodes` is a fresh int array of the unvisited node ids in ascending order
    and `distance_matrix` is a read-only view.

    Raises:
        InvalidHeuristicOutput: a non-integer answer or a node that is not unvisited.
    """
    size = len(distances)
    shown_distances = common.read_only(distances)
    is_unvisited = np.ones(size, dtype=bool)
    is_unvisited[0] = False
    tour = [0]
    for _ in range(size - 1):
        unvisited = np.flatnonzero(is_unvisited)
        choice = check_integer(select_next_node(tour[-1], 0, unvisited, shown_distances),
                               "select_next_node output")
        if not (0 <= choice < size and is_unvisited[choice]):
            raise InvalidHeuristicOutput(
                f"select_next_node returned node {choice}, which is not among the "
                f"{len(unvisited)} unvisited nodes")
        is_unvisited[choice] = False
        tour.append(choice)
    return np.array(tour)


def evaluate_constructive(select_next_node: Callable, instances: Sequence[np.ndarray]) -> float:
    """Mean tour length of the tours `select_next_node` builds (lower is better)."""

    def solve(coordinates):
        distances = common.pairwise_distances(coordinates)
        return tour_length(construct_tour(select_next_node, distances), distances)

    return common.mean_objective(solve, instances)


def evaluate_aco(heuristics: Callable, instances: Sequence[np.ndarray],
                 settings: aco.ACOSettings = aco.TSP_SETTINGS) -> float:
    """Mean best tour length of ACO guided by `heuristics(distance_matrix)` (lower is better).

    `heuristics` receives a read-only (N, N) distance matrix (zero diagonal) and must
    return an (N, N) edge-desirability matrix (see `check_desirability_matrix`).
    """

    def solve(indexed):
        index, coordinates = indexed
        distances = common.pairwise_distances(coordinates)
        desirability = check_desirability_matrix(
            heuristics(common.read_only(distances)), len(distances))
        return aco.solve_tsp(distances, desirability, settings, aco.instance_rng(settings, index))

    return common.mean_objective(solve, list(enumerate(instances)))
