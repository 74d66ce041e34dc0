"""Ant colony optimisation (Ant System) for TSP, CVRP and offline bin packing, in numpy.

All three solvers share one scheme. Each iteration every ant builds a full solution,
choosing each move at random with probability proportional to
pheromone^alpha * desirability^beta over the feasible moves; then all pheromone
evaporates (multiplied by `decay`) and every ant deposits on the pairs its solution
used. The desirability matrix is what a candidate heuristic designs. Ants are
vectorised: one numpy step advances all of them. Results depend only on the inputs and
the generator passed in, so a fixed seed gives a fixed answer.
"""

from typing import Callable, NamedTuple

import numpy as np


class ACOSettings(NamedTuple):
    """ACO hyperparameters.

    Attributes:
        n_ants: ants per iteration.
        n_iterations: construction + pheromone-update rounds.
        alpha: pheromone exponent.
        beta: desirability exponent.
        decay: fraction of pheromone kept per iteration.
        seed: base seed; instance i of an evaluation uses the stream (seed, i).
    """

    n_ants: int
    n_iterations: int
    alpha: float = 1.0
    beta: float = 1.0
    decay: float = 0.9
    seed: int = 0


# Ant and iteration counts of the published ACO-based AHD settings.
TSP_SETTINGS = ACOSettings(n_ants=30, n_iterations=100)
CVRP_SETTINGS = ACOSettings(n_ants=30, n_iterations=100)
BPP_SETTINGS = ACOSettings(n_ants=20, n_iterations=100)
# A few ants for a few rounds: for tests and quick smoke runs.
FAST_SETTINGS = ACOSettings(n_ants=8, n_iterations=5)


def check_settings(settings: ACOSettings) -> None:
    """Raises ValueError for unusable settings."""
    if settings.n_ants < 1 or settings.n_iterations < 1:
        raise ValueError(f"n_ants and n_iterations must be >= 1, got {settings}")
    if not 0.0 < settings.decay <= 1.0:
        raise ValueError(f"decay must lie in (0, 1], got {settings.decay}")


def instance_rng(settings: ACOSettings, index: int) -> np.random.Generator:
    """The random stream of instance `index` under `settings`."""
    return np.random.default_rng([settings.seed, index])


def sample_rows(weights: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Draws one column per row with probability proportional to the row's weights.

    Args:
        weights: (rows, columns) non-negative; every row must have a positive sum.
        rng: the random stream.

    Returns:
        (rows,) int column indices.
    """
    cumulative = np.cumsum(weights, axis=1)
    totals = cumulative[:, -1]
    # Strictly below the total, so the first column whose running sum exceeds the draw
    # always has a positive weight.
    draws = np.minimum(rng.random(len(weights)) * totals, np.nextafter(totals, 0.0))
    return (cumulative <= draws[:, None]).sum(axis=1)


def _move_weights(pheromone: np.ndarray, desirability: np.ndarray,
                  settings: ACOSettings) -> np.ndarray:
    return pheromone ** settings.alpha * desirability ** settings.beta


def _inverse(lengths: np.ndarray) -> np.ndarray:
    """1 / length, guarded against zero-length solutions (coincident points)."""
    return 1.0 / np.maximum(lengths, 1e-12)


def _deposit_on_edges(pheromone: np.ndarray, sources: np.ndarray, targets: np.ndarray,
                      amounts: np.ndarray) -> None:
    """Adds `amounts` to both directions of each edge (in place)."""
    np.add.at(pheromone, (sources, targets), amounts)
    np.add.at(pheromone, (targets, sources), amounts)


Deposit = Callable[[np.ndarray], None]


def _run_colony(size: int, desirability: np.ndarray, settings: ACOSettings,
                construct: Callable[[np.ndarray], tuple[np.ndarray, Deposit]]) -> float:
    """The loop every solver shares: each iteration the ants build their solutions from
    the move weights (``construct`` -> (each ant's cost, how it deposits)), the pheromone
    evaporates, then the ants deposit. Returns the lowest cost of every iteration."""
    check_settings(settings)
    pheromone = np.ones((size, size))
    best = np.inf
    for _ in range(settings.n_iterations):
        costs, deposit = construct(_move_weights(pheromone, desirability, settings))
        best = min(best, float(costs.min()))
        pheromone *= settings.decay
        deposit(pheromone)
    return best


def solve_tsp(distances: np.ndarray, desirability: np.ndarray, settings: ACOSettings,
              rng: np.random.Generator) -> float:
    """Best closed-tour length found by the colony.

    Args:
        distances: (N, N) symmetric distances.
        desirability: (N, N) validated desirability (positive off the diagonal).
        settings: ACO hyperparameters.
        rng: the random stream.

    Returns:
        The shortest tour length over all ants and iterations.
    """
    size = len(distances)
    ants = np.arange(settings.n_ants)

    def construct(weights: np.ndarray) -> tuple[np.ndarray, Deposit]:
        tours = np.empty((settings.n_ants, size), dtype=np.int64)
        tours[:, 0] = rng.integers(size, size=settings.n_ants)
        unvisited = np.ones((settings.n_ants, size), dtype=bool)
        unvisited[ants, tours[:, 0]] = False
        for step in range(1, size):
            tours[:, step] = sample_rows(weights[tours[:, step - 1]] * unvisited, rng)
            unvisited[ants, tours[:, step]] = False
        successors = np.roll(tours, -1, axis=1)
        lengths = distances[tours, successors].sum(axis=1)
        return lengths, lambda pheromone: _deposit_on_edges(
            pheromone, tours, successors,
            np.broadcast_to(_inverse(lengths)[:, None], tours.shape))

    return _run_colony(size, desirability, settings, construct)


def solve_cvrp(distances: np.ndarray, demands: np.ndarray, capacity: float,
               desirability: np.ndarray, settings: ACOSettings,
               rng: np.random.Generator) -> float:
    """Best total route length found by the colony for a CVRP instance.

    Every ant leaves the depot (node 0), visits customers whose demand fits its
    remaining load, may return to the depot from any customer (reloading to
    `capacity`), and stops at the depot once every customer is served.

    Args:
        distances: (N+1, N+1) distances, node 0 the depot.
        demands: (N+1,) demands, demands[0] = 0, each at most `capacity`.
        capacity: vehicle capacity.
        desirability: (N+1, N+1) validated desirability.
        settings: ACO hyperparameters.
        rng: the random stream.

    Returns:
        The shortest total route length over all ants and iterations.
    """
    size = len(distances)
    ants = np.arange(settings.n_ants)

    def construct(weights: np.ndarray) -> tuple[np.ndarray, Deposit]:
        position = np.zeros(settings.n_ants, dtype=np.int64)
        load_left = np.full(settings.n_ants, float(capacity))
        unvisited = np.ones((settings.n_ants, size), dtype=bool)
        unvisited[:, 0] = False
        lengths = np.zeros(settings.n_ants)
        sources, targets, movers = [], [], []
        while True:
            active = (position != 0) | unvisited.any(axis=1)
            if not active.any():
                break
            allowed = unvisited & (demands[None, :] <= load_left[:, None])
            allowed[:, 0] = position != 0
            move_weights = weights[position] * allowed
            move_weights[~active, 0] = 1.0  # finished ants idle at the depot
            chosen = sample_rows(move_weights, rng)
            lengths += distances[position, chosen]
            sources.append(position)
            targets.append(chosen)
            movers.append(active)
            load_left = np.where(chosen == 0, capacity, load_left - demands[chosen])
            unvisited[ants, chosen] = False
            position = chosen
        moved = np.array(movers)
        return lengths, lambda pheromone: _deposit_on_edges(
            pheromone, np.array(sources)[moved], np.array(targets)[moved],
            np.broadcast_to(_inverse(lengths), moved.shape)[moved])

    return _run_colony(size, desirability, settings, construct)


def solve_bin_packing(sizes: np.ndarray, capacity: float, desirability: np.ndarray,
                      settings: ACOSettings, rng: np.random.Generator) -> int:
    """Fewest bins found by the colony for an offline bin-packing instance.

    Each ant fills one bin at a time. A new bin starts with an unpacked item drawn
    with probability proportional to its size (large items first, as in first-fit
    decreasing); then, while some unpacked item fits, the next item i is drawn with weight
    sum over items j already in the bin of pheromone_ij^alpha * desirability_ij^beta.
    Ants deposit on every pair of items sharing a bin an amount equal to their
    solution's fitness, the mean over bins of (load / capacity)^2.

    Args:
        sizes: (N,) item sizes, each at most `capacity`.
        capacity: bin capacity.
        desirability: (N, N) validated item-item desirability.
        settings: ACO hyperparameters.
        rng: the random stream.

    Returns:
        The smallest number of bins over all ants and iterations.
    """
    n_items = len(sizes)
    ants = np.arange(settings.n_ants)

    def construct(weights: np.ndarray) -> tuple[np.ndarray, Deposit]:
        unpacked = np.ones((settings.n_ants, n_items), dtype=bool)
        load = np.zeros(settings.n_ants)
        affinity = np.zeros((settings.n_ants, n_items))
        bin_of_item = np.zeros((settings.n_ants, n_items), dtype=np.int64)
        bin_count = np.zeros(settings.n_ants, dtype=np.int64)
        for _ in range(n_items):
            fits = unpacked & (sizes[None, :] <= capacity - load[:, None])
            opens = ~fits.any(axis=1) | (load == 0)
            bin_count += opens
            load[opens] = 0.0
            affinity[opens] = 0.0
            chosen = sample_rows(np.where(opens[:, None], unpacked * sizes, affinity * fits), rng)
            bin_of_item[ants, chosen] = bin_count - 1
            unpacked[ants, chosen] = False
            load += sizes[chosen]
            affinity += weights[chosen]
        loads = np.stack([np.bincount(bins, weights=sizes, minlength=n_items)
                          for bins in bin_of_item])
        fitness = ((loads / capacity) ** 2).sum(axis=1) / bin_count
        shares_bin = bin_of_item[:, :, None] == bin_of_item[:, None, :]

        def deposit(pheromone: np.ndarray) -> None:
            pheromone += np.einsum("a,aij->ij", fitness, shares_bin)

        return bin_count, deposit

    return int(_run_colony(n_items, desirability, settings, construct))
