"""The registry of automatic-heuristic-design (AHD) tasks.

Each `AHDTask` bundles what a heuristic search needs: the problem description and the
function interface shown to the LLM, the objective's direction, a seeded instance
generator, a loader for the published anchor arrays, the evaluator (a plain numpy
function of a Python callable and instances, safe to call inside a sandbox child
process), the source of a simple seed heuristic, and a classical baseline (the seed
heuristic run through the same evaluator).

    task = TASKS["tsp_constructive"]
    instances = task.generate_instances(task.default_size, 8, seed=0)
    heuristic = compile_heuristic(task.seed_heuristic_source, task.function_name)
    task.evaluate(heuristic, instances)   # == task.baseline(instances)

ACO tasks take an optional `settings=aco.FAST_SETTINGS` (or any `aco.ACOSettings`) in
`evaluate` and `baseline`; the default is the published ant/iteration count.
"""

import dataclasses
import os
import textwrap
from typing import Callable, Optional

import numpy as np

from agentic_esopt.envs.ahd import admissible_sets
from agentic_esopt.envs.ahd import bin_packing
from agentic_esopt.envs.ahd import cvrp
from agentic_esopt.envs.ahd import knapsack
from agentic_esopt.envs.ahd import tsp
from agentic_esopt.envs.ahd.validation import InvalidHeuristicOutput  # re-exported

__all__ = ["AHDTask", "TASKS", "InvalidHeuristicOutput", "compile_heuristic",
           "evaluate_heuristic"]

ANCHOR_SPLITS = ("train", "val", "test")


def compile_heuristic(source: str, function_name: str) -> Callable:
    """Executes trusted `source` in a fresh namespace and returns `function_name` from it.

    Only for code this package ships (seed heuristics) or code already vetted: run
    LLM-written code through the sandbox instead.
    """
    namespace = {"__name__": "heuristic"}
    exec(compile(source, f"<{function_name}>", "exec"), namespace)  # pylint: disable=exec-used
    function = namespace.get(function_name)
    if not callable(function):
        raise ValueError(f"source defines no function named {function_name!r}")
    return function


@dataclasses.dataclass(frozen=True)
class AHDTask:
    """One heuristic-design task.

    Attributes:
        name: registry key.
        description: the problem, as shown to the LLM.
        function_name: name of the function the LLM writes.
        signature: its `def` line (with type hints, no trailing colon).
        docstring: what it receives and must return.
        minimise: True when a lower objective is better.
        default_size: problem size of the published training setting (fewer items for
            online bin packing, for speed).
        generate_instances: (size, n, seed) -> instances, deterministic in the seed.
        evaluate: (heuristic_fn, instances, **options) -> mean objective.
        seed_heuristic_source: source of a simple heuristic in the required interface.
        anchor_name: folder of the published arrays under ahd/datasets, if any.
    """

    name: str
    description: str
    function_name: str
    signature: str
    docstring: str
    minimise: bool
    default_size: int
    generate_instances: Callable
    evaluate: Callable[..., float]
    seed_heuristic_source: str
    anchor_name: Optional[str] = None

    def interface(self) -> str:
        """The function stub (signature and docstring) to show the LLM."""
        body = textwrap.indent(f'"""{self.docstring}\n"""', "    ")
        return f"{self.signature}:\n{body}\n"

    def baseline(self, instances, **options) -> float:
        """Objective of the classical heuristic (the seed) on `instances`."""
        heuristic = compile_heuristic(self.seed_heuristic_source, self.function_name)
        return self.evaluate(heuristic, instances, **options)

    def load_anchor_instances(self, path: str, size: int, split: str) -> np.ndarray:
        """Reads the published arrays `<path>/ahd/datasets/<task>/<split><size>_dataset.np[yz]`.

        Args:
            path: the anchor data root, given explicitly (e.g. a launcher flag); nothing
                is read from a default location.
            size: problem size in the file name (customers for CVRP, items for BPP).
            split: "train", "val" or "test".

        Returns:
            The instance array, in this task's instance layout.
        """
        if self.anchor_name is None:
            raise ValueError(f"task {self.name!r} has no published anchor arrays")
        if split not in ANCHOR_SPLITS:
            raise ValueError(f"split must be one of {ANCHOR_SPLITS}, got {split!r}")
        folder = os.path.join(path, "ahd", "datasets", self.anchor_name)
        stem = os.path.join(folder, f"{split}{size}_dataset")
        if os.path.exists(stem + ".npy"):
            return np.load(stem + ".npy")
        if os.path.exists(stem + ".npz"):
            with np.load(stem + ".npz") as archive:
                return archive["demands"]
        available = sorted(os.listdir(folder)) if os.path.isdir(folder) else []
        raise FileNotFoundError(f"no anchor file {stem}.np[yz]; available in {folder}: "
                                f"{available}")


_TSP_DESCRIPTION = (
    "Given nodes with coordinates in the unit square, find the shortest route that visits "
    "every node exactly once and returns to the start. The route is built step by step "
    "from node 0: at each step the heuristic picks the next node among the unvisited ones.")

_ACO_NOTE = (
    "An ant colony optimisation solver uses the returned matrix as prior edge "
    "desirability: ants build solutions step by step and pick each move with probability "
    "proportional to pheromone * desirability. Higher means more promising. The diagonal "
    "is ignored; other entries must be finite, and values below 1e-9 times the largest "
    "are raised to that floor.")

_TSP_CONSTRUCTIVE = AHDTask(
    name="tsp_constructive",
    description=_TSP_DESCRIPTION,
    function_name="select_next_node",
    signature=("def select_next_node(current_node: int, destination_node: int, "
               "unvisited_nodes: np.ndarray, distance_matrix: np.ndarray) -> int"),
    docstring=textwrap.dedent("""\
        Chooses the next node of the route.

        Args:
            current_node: the node the route is at.
            destination_node: the node the route must finally return to (node 0).
            unvisited_nodes: int array of the ids of the nodes not yet visited (ascending).
            distance_matrix: (N, N) read-only array of distances between all nodes.

        Returns:
            The id of the next node: one of unvisited_nodes."""),
    minimise=True,
    default_size=50,
    generate_instances=tsp.generate_instances,
    evaluate=tsp.evaluate_constructive,
    seed_heuristic_source=textwrap.dedent('''\
        import numpy as np


        def select_next_node(current_node, destination_node, unvisited_nodes, distance_matrix):
            """Moves to the nearest unvisited node."""
            distances = distance_matrix[current_node, unvisited_nodes]
            return int(unvisited_nodes[np.argmin(distances)])
        '''),
    anchor_name="tsp_constructive",
)

_KP_CONSTRUCTIVE = AHDTask(
    name="kp_constructive",
    description=(
        "Given items with weights and values and a knapsack of limited capacity, choose "
        "items to maximise their total value without exceeding the capacity. Items are "
        "packed one at a time: at each step the heuristic picks the next item among the "
        "unpacked items that still fit, or stops."),
    function_name="select_next_item",
    signature=("def select_next_item(remaining_capacity: float, weights: np.ndarray, "
               "values: np.ndarray) -> int"),
    docstring=textwrap.dedent("""\
        Chooses the next item to pack.

        Args:
            remaining_capacity: capacity still free in the knapsack.
            weights: weights of the unpacked items that fit (all <= remaining_capacity).
            values: values of the same items, in the same order.

        Returns:
            An index into weights/values of the item to pack next, or -1 to stop."""),
    minimise=False,
    default_size=100,
    generate_instances=knapsack.generate_instances,
    evaluate=knapsack.evaluate,
    seed_heuristic_source=textwrap.dedent('''\
        import numpy as np


        def select_next_item(remaining_capacity, weights, values):
            """Packs the item with the highest value per unit of weight."""
            return int(np.argmax(values / np.maximum(weights, 1e-12)))
        '''),
    anchor_name="kp_constructive",
)

_ASP_CONSTRUCTIVE = AHDTask(
    name="asp_constructive",
    description=(
        "Build a large admissible set A(n, w): a set of vectors in {0, 1, 2}^n, each with "
        "exactly w non-zero entries and no two with the same non-zero positions, such "
        "that any three distinct vectors have a coordinate where their values are "
        "{0, 1, 2} or {0, 0, 1} or {0, 0, 2} (in any order). A greedy procedure visits "
        "candidate vectors from the highest priority to the lowest and keeps each one "
        "that leaves the set admissible; the score is the final set size. Settings: "
        "(n, w) = (12, 7), (15, 10), (21, 15); for the two larger ones each block of three "
        "coordinates holds a rotation of 000, 001, 002, 012, 021, 111 or 222, the priority "
        "scores the block patterns as given, and accepting a candidate adds all its "
        "block rotations."),
    function_name="priority",
    signature="def priority(el: tuple[int, ...], n: int, w: int) -> float",
    docstring=textwrap.dedent("""\
        Scores a candidate vector; higher-priority candidates are tried first.

        Args:
            el: the candidate, a tuple of n entries in {0, 1, 2} with w non-zeros.
            n: vector length.
            w: number of non-zero entries.

        Returns:
            The priority, a real number (not NaN)."""),
    minimise=False,
    default_size=12,
    generate_instances=admissible_sets.generate_instances,
    evaluate=admissible_sets.evaluate,
    seed_heuristic_source=textwrap.dedent('''\
        def priority(el, n, w):
            """Gives every candidate the same priority (enumeration order decides)."""
            return 0.0
        '''),
)

_TSP_ACO = AHDTask(
    name="tsp_aco",
    description=("Find the shortest route visiting every node of a TSP instance once and "
                 "returning to the start. " + _ACO_NOTE),
    function_name="heuristics",
    signature="def heuristics(distance_matrix: np.ndarray) -> np.ndarray",
    docstring=textwrap.dedent("""\
        Scores how promising each edge is for a short tour.

        Args:
            distance_matrix: (N, N) read-only distances; the diagonal is 0.

        Returns:
            (N, N) array of edge desirabilities."""),
    minimise=True,
    default_size=50,
    generate_instances=tsp.generate_instances,
    evaluate=tsp.evaluate_aco,
    seed_heuristic_source=textwrap.dedent('''\
        import numpy as np


        def heuristics(distance_matrix):
            """Prefers short edges: desirability is the inverse distance."""
            with np.errstate(divide="ignore"):
                return 1.0 / distance_matrix
        '''),
    anchor_name="tsp_aco",
)

_CVRP_ACO = AHDTask(
    name="cvrp_aco",
    description=(
        "Capacitated vehicle routing: vehicles of capacity 50 start and end at the depot "
        "(node 0) and together serve every customer exactly once; the demands on one trip "
        "may not exceed the capacity. Minimise the total travelled distance. " + _ACO_NOTE),
    function_name="heuristics",
    signature=("def heuristics(distance_matrix: np.ndarray, coordinates: np.ndarray, "
               "demands: np.ndarray, capacity: int) -> np.ndarray"),
    docstring=textwrap.dedent("""\
        Scores how promising each edge is for short routes.

        Args:
            distance_matrix: (N+1, N+1) read-only distances; node 0 is the depot.
            coordinates: (N+1, 2) read-only node coordinates.
            demands: (N+1,) read-only customer demands; demands[0] = 0 (depot).
            capacity: vehicle capacity.

        Returns:
            (N+1, N+1) array of edge desirabilities."""),
    minimise=True,
    default_size=50,
    generate_instances=cvrp.generate_instances,
    evaluate=cvrp.evaluate_aco,
    seed_heuristic_source=textwrap.dedent('''\
        import numpy as np


        def heuristics(distance_matrix, coordinates, demands, capacity):
            """Prefers short edges: desirability is the inverse distance."""
            with np.errstate(divide="ignore"):
                return 1.0 / distance_matrix
        '''),
    anchor_name="cvrp_aco",
)

_BPP_OFFLINE_ACO = AHDTask(
    name="bpp_offline_aco",
    description=(
        "Offline bin packing: pack all items (integer sizes) into as few bins of capacity "
        "150 as possible. An ant colony optimisation solver fills one bin at a time: it "
        "opens a bin with an item drawn in proportion to its size, then picks each next "
        "item that fits with probability proportional to the summed "
        "pheromone * desirability between it and the items already in the bin. The "
        "returned matrix gives how desirable it is to put items i and j in the same bin; "
        "the diagonal is ignored, other entries must be finite, and values below 1e-9 "
        "times the largest are raised to that floor."),
    function_name="heuristics",
    signature="def heuristics(demand: np.ndarray, capacity: int) -> np.ndarray",
    docstring=textwrap.dedent("""\
        Scores how promising it is to pack each pair of items together.

        Args:
            demand: (N,) read-only integer item sizes.
            capacity: bin capacity.

        Returns:
            (N, N) array of item-pair desirabilities."""),
    minimise=True,
    default_size=500,
    generate_instances=bin_packing.generate_offline_instances,
    evaluate=bin_packing.evaluate_offline_aco,
    seed_heuristic_source=textwrap.dedent('''\
        import numpy as np


        def heuristics(demand, capacity):
            """Prefers pairs that fill much of a bin together without overflowing it."""
            pair_load = demand[:, None] + demand[None, :]
            return np.where(pair_load <= capacity, pair_load / capacity, 1e-6)
        '''),
    anchor_name="bpp_offline_aco",
)

_ONLINE_BPP = AHDTask(
    name="online_bpp",
    description=(
        "Online bin packing: items arrive one at a time and each must be placed at once "
        "into a bin of capacity 100; the goal is to use as few bins as possible. For each "
        "item the priority function scores the bins it fits in (already used bins and "
        "empty ones) and the item goes into the highest-scoring bin. The score is the "
        "fraction of bins used beyond the lower bound ceil(total size / capacity)."),
    function_name="priority",
    signature="def priority(item: float, bins: np.ndarray) -> np.ndarray",
    docstring=textwrap.dedent("""\
        Scores the bins the item could go into.

        Args:
            item: size of the arriving item.
            bins: remaining capacities of the bins the item fits in (all >= item); a
                bin with remaining capacity 100 is still empty.

        Returns:
            Array of scores with the same shape as bins (no NaN); the item goes into
            the first bin with the highest score."""),
    minimise=True,
    default_size=1000,
    generate_instances=bin_packing.generate_online_instances,
    evaluate=bin_packing.evaluate_online,
    seed_heuristic_source=textwrap.dedent('''\
        def priority(item, bins):
            """Best fit: prefers the bin the item leaves least room in."""
            return -(bins - item)
        '''),
)

TASKS: dict[str, AHDTask] = {
    task.name: task
    for task in (_TSP_CONSTRUCTIVE, _KP_CONSTRUCTIVE, _ASP_CONSTRUCTIVE, _TSP_ACO, _CVRP_ACO,
                 _BPP_OFFLINE_ACO, _ONLINE_BPP)
}


def evaluate_heuristic(task_name: str, heuristic_fn: Callable, instances, **options) -> float:
    """Mean objective of `heuristic_fn` on `instances` for the named task.

    Raises:
        ValueError: an unknown task name.
        InvalidHeuristicOutput: the heuristic returned something unusable.
    """
    if task_name not in TASKS:
        raise ValueError(f"unknown AHD task {task_name!r}; known: {sorted(TASKS)}")
    return TASKS[task_name].evaluate(heuristic_fn, instances, **options)
