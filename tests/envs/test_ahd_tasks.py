"""Tests for the AHD tasks: generators, evaluators, ACO, seeds, baselines, anchors."""

import math
import os

import numpy as np
import pytest

from agentic_esopt.envs.ahd import FAST_SETTINGS
from agentic_esopt.envs.ahd import TASKS
from agentic_esopt.envs.ahd import InvalidHeuristicOutput
from agentic_esopt.envs.ahd import admissible_sets
from agentic_esopt.envs.ahd import aco
from agentic_esopt.envs.ahd import bin_packing
from agentic_esopt.envs.ahd import common
from agentic_esopt.envs.ahd import compile_heuristic
from agentic_esopt.envs.ahd import cvrp
from agentic_esopt.envs.ahd import evaluate_heuristic
from agentic_esopt.envs.ahd import knapsack
from agentic_esopt.envs.ahd import tsp
from agentic_esopt.envs.ahd.validation import check_desirability_matrix

ANCHOR_ROOT = "/work/shared/data/anchors"
needs_anchors = pytest.mark.skipif(
    not os.path.isdir(os.path.join(ANCHOR_ROOT, "ahd")), reason="anchor data not present")

# Small instances per task, so that every evaluation takes well under a second.
SMALL_SIZES = {"tsp_constructive": 12, "kp_constructive": 15, "tsp_aco": 10, "cvrp_aco": 10,
               "bpp_offline_aco": 60, "online_bpp": 50}
SMALL_ASP = [admissible_sets.AdmissibleSetting(7, 5, "all_vectors")]


def small_instances(name, n=2, seed=0):
    if name == "asp_constructive":
        return SMALL_ASP
    return TASKS[name].generate_instances(SMALL_SIZES[name], n, seed)


def options_for(name):
    return {"settings": FAST_SETTINGS} if name.endswith("_aco") else {}


def seed_heuristic(name):
    task = TASKS[name]
    return compile_heuristic(task.seed_heuristic_source, task.function_name)


def random_matrix(*args):
    size = len(args[0])
    return np.random.default_rng(123).random((size, size))


# --- registry and seeds ---------------------------------------------------------------


def test_registry_holds_the_seven_published_tasks():
    assert set(TASKS) == {"tsp_constructive", "kp_constructive", "asp_constructive", "tsp_aco",
                          "cvrp_aco", "bpp_offline_aco", "online_bpp"}
    assert not TASKS["kp_constructive"].minimise and not TASKS["asp_constructive"].minimise
    assert TASKS["tsp_constructive"].minimise and TASKS["online_bpp"].minimise


@pytest.mark.parametrize("name", sorted(TASKS))
def test_interface_shows_signature_and_docstring(name):
    task = TASKS[name]
    stub = task.interface()
    assert stub.startswith(f"def {task.function_name}(")
    assert task.docstring.splitlines()[0] in stub
    compile_heuristic("import numpy as np\n" + stub + "    return None\n", task.function_name)


@pytest.mark.parametrize("name", sorted(TASKS))
def test_seed_heuristic_is_finite_and_equals_baseline(name):
    task = TASKS[name]
    instances = small_instances(name)
    objective = task.evaluate(seed_heuristic(name), instances, **options_for(name))
    assert math.isfinite(objective)
    assert objective == task.baseline(instances, **options_for(name))
    assert objective == evaluate_heuristic(name, seed_heuristic(name), instances,
                                           **options_for(name))


def test_unknown_task_and_missing_function_are_errors():
    with pytest.raises(ValueError, match="unknown AHD task"):
        evaluate_heuristic("tsp", lambda *a: 0, [])
    with pytest.raises(ValueError, match="no function named"):
        compile_heuristic("def other():\n    return 1\n", "priority")


# --- generators -----------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(set(TASKS) - {"asp_constructive"}))
def test_generators_are_deterministic_in_the_seed(name):
    first, again, other = (small_instances(name, 3, seed) for seed in (5, 5, 6))
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first, other)
    assert len(first) == 3


def test_generated_distributions_match_the_published_settings():
    coordinates = tsp.generate_instances(30, 4, 0)
    assert coordinates.shape == (4, 30, 2) and coordinates.min() >= 0 and coordinates.max() < 1
    items = knapsack.generate_instances(50, 2, 0)
    assert items.shape == (2, 50, 2) and items.min() >= 0 and items.max() < 1
    assert knapsack.capacity_for(50) == 12.5 and knapsack.capacity_for(100) == 25.0
    routing = cvrp.generate_instances(40, 3, 0)
    assert routing.shape == (3, 41, 3)
    assert (routing[:, 0, 0] == 0).all()
    assert set(np.unique(routing[:, 1:, 0])) == set(range(1, 10))
    offline = bin_packing.generate_offline_instances(2000, 1, 0)
    assert offline.min() == 20 and offline.max() == 100
    online = bin_packing.generate_online_instances(20000, 1, 0)
    assert online.min() >= 1 and online.max() <= 100
    assert online.mean() == pytest.approx(45 * math.gamma(1 + 1 / 3), rel=0.02)


def test_generators_reject_bad_requests():
    with pytest.raises(ValueError, match="seed"):
        tsp.generate_instances(10, 2, -1)
    with pytest.raises(ValueError, match="size"):
        knapsack.generate_instances(0, 2, 0)
    with pytest.raises(ValueError, match="must be one of"):
        admissible_sets.generate_instances(13, 1, 0)


# --- TSP ------------------------------------------------------------------------------


def test_nearest_neighbour_on_a_square():
    # Nodes 2 and 3 tie at distance 1 from node 0; the lower id (first unvisited) wins.
    square = np.array([[0.0, 0.0], [1.0, 1.0], [1.0, 0.0], [0.0, 1.0]])
    distances = common.pairwise_distances(square)
    np.testing.assert_array_equal(
        tsp.construct_tour(seed_heuristic("tsp_constructive"), distances), [0, 2, 1, 3])
    assert TASKS["tsp_constructive"].baseline([square]) == pytest.approx(4.0)


def test_nearest_neighbour_is_not_optimal_on_a_line_with_detour():
    # x: 0, 1, -1.5, 2. NN: 0 -> 1 -> 2 (x=2) -> -1.5 -> 0 = 1 + 1 + 3.5 + 1.5 = 7.
    points = np.array([[0.0, 0.0], [1.0, 0.0], [-1.5, 0.0], [2.0, 0.0]])
    assert TASKS["tsp_constructive"].baseline([points]) == pytest.approx(7.0)


@needs_anchors
@pytest.mark.parametrize("size,reference", [(20, 4.480), (50, 6.959)])
def test_nearest_neighbour_matches_published_anchor_numbers(size, reference):
    task = TASKS["tsp_constructive"]
    instances = task.load_anchor_instances(ANCHOR_ROOT, size, "test")
    assert instances.shape == (1000, size, 2)
    assert round(task.baseline(instances), 2) == round(reference, 2)


@pytest.mark.parametrize("answer,reason", [
    (0, "not among"),            # the start node, already visited
    (99, "not among"),           # no such node
    (1.0, "must be an integer"),
    ("1", "must be an integer"),
    (True, "must be an integer"),
])
def test_tsp_invalid_choices_raise(answer, reason):
    instances = tsp.generate_instances(5, 1, 0)
    with pytest.raises(InvalidHeuristicOutput, match=reason) as error:
        tsp.evaluate_constructive(lambda *args: answer, instances)
    assert error.value.reason


def test_tsp_heuristic_cannot_modify_the_distance_matrix():
    def vandal(current_node, destination_node, unvisited_nodes, distance_matrix):
        distance_matrix[:] = 0.0
        return int(unvisited_nodes[0])

    with pytest.raises(ValueError, match="read-only"):
        tsp.evaluate_constructive(vandal, tsp.generate_instances(5, 1, 0))


# --- knapsack -------------------------------------------------------------------------


def test_value_per_weight_greedy_on_a_fixed_instance():
    # Capacity 25 (N != 50). Ratios 1.0, 1.5, 0.5, 1.0: take item 1 (w 12), then the
    # first of the best remaining ratio, item 0 (w 10); 3 left, nothing fits: 18 + 10.
    items = np.array([[10.0, 10.0], [12.0, 18.0], [8.0, 4.0], [9.0, 9.0]])
    seen = []
    greedy = seed_heuristic("kp_constructive")

    def recording(remaining_capacity, weights, values):
        seen.append((remaining_capacity, weights.tolist()))
        return greedy(remaining_capacity, weights, values)

    assert knapsack.pack(recording, items) == pytest.approx(28.0)
    assert seen == [(25.0, [10.0, 12.0, 8.0, 9.0]), (13.0, [10.0, 8.0, 9.0])]
    assert knapsack.pack(lambda *args: knapsack.STOP, items) == 0.0


@pytest.mark.parametrize("answer,reason", [(3, "valid answers"), (-2, "valid answers"),
                                           (np.float64(0.0), "must be an integer"),
                                           (None, "must be an integer")])
def test_knapsack_invalid_choices_raise(answer, reason):
    items = np.array([[10.0, 10.0], [12.0, 18.0], [8.0, 4.0]])
    with pytest.raises(InvalidHeuristicOutput, match=reason):
        knapsack.pack(lambda *args: answer, items)


# --- online bin packing ---------------------------------------------------------------


def test_best_fit_on_fixed_items():
    # Capacity 100. 60 -> bin 0 (40 left); 30 -> bin 0 (10 left); 50 -> bin 1 (50 left);
    # 40 -> bin 1 (10 left); 20 -> bin 2 (80 left); 70 -> bin 2 (10 left): 3 bins.
    seen = []
    best_fit = seed_heuristic("online_bpp")

    def recording(item, bins):
        seen.append((item, bins.tolist()))
        return best_fit(item, bins)

    items = np.array([60, 30, 50, 40, 20, 70])
    assert bin_packing.pack_online(recording, items) == 3
    assert seen[1] == (30.0, [40.0, 100.0, 100.0, 100.0, 100.0, 100.0])
    assert seen[4] == (20.0, [100.0, 100.0, 100.0, 100.0])  # bins 0, 1 have 10 left
    assert bin_packing.online_excess(best_fit, items) == 0.0
    assert bin_packing.online_excess(best_fit, np.array([60, 60, 60])) == 0.5  # 3 vs L1 = 2


@pytest.mark.parametrize("output,reason", [
    (lambda item, bins: np.zeros(len(bins) + 1), "shape"),
    (lambda item, bins: 1.0, "shape"),
    (lambda item, bins: np.full(len(bins), np.nan), "NaN"),
    (lambda item, bins: np.array(["a"] * len(bins)), "real numbers"),
])
def test_online_bpp_invalid_priorities_raise(output, reason):
    with pytest.raises(InvalidHeuristicOutput, match=reason):
        bin_packing.pack_online(output, np.array([30, 40]))


# --- admissible sets ------------------------------------------------------------------


def naive_greedy(priority, setting):
    """Reference greedy: re-checks the whole set with the definition at every step."""
    family = admissible_sets.FAMILIES[setting.family]
    tables = admissible_sets._family_tables(family)
    candidates = admissible_sets._enumerate_candidates(setting, tables)
    representatives = np.array(family.patterns)[candidates].reshape(len(candidates), -1)
    scores = [priority(tuple(el.tolist()), setting.n, setting.w) for el in representatives]
    chosen = np.zeros((0, setting.n), dtype=np.int64)
    for index in np.argsort(-np.array(scores), kind="stable"):
        trial = np.concatenate([chosen, admissible_sets._expand(family, candidates[[index]])])
        if admissible_sets.is_admissible(trial, setting.w):
            chosen = trial
    return chosen


@pytest.mark.parametrize("setting,seed", [
    (admissible_sets.AdmissibleSetting(7, 5, "all_vectors"), 1),
    (admissible_sets.AdmissibleSetting(7, 5, "all_vectors"), 2),
    (admissible_sets.AdmissibleSetting(12, 10, "cyclic_triples"), None),
    (admissible_sets.AdmissibleSetting(12, 10, "cyclic_triples"), 4),
])
def test_greedy_admissible_set_equals_reference_greedy(setting, seed):
    scores = {}
    rng = np.random.default_rng(seed)

    def priority(el, n, w):
        return 0.0 if seed is None else scores.setdefault(el, rng.random())

    built = admissible_sets.build_admissible_set(priority, setting)
    np.testing.assert_array_equal(built, naive_greedy(priority, setting))
    assert admissible_sets.is_admissible(built, setting.w)
    assert len(built) < math.comb(setting.n, setting.w)  # some candidates were refused


def test_admissibility_definition_on_hand_cases():
    assert admissible_sets.is_admissible([[1, 1, 0], [1, 0, 2], [0, 2, 1]], 2)
    # Every coordinate of (110, 101, 011) holds {1, 1, 0}: not admissible.
    assert not admissible_sets.is_admissible([[1, 1, 0], [1, 0, 1], [0, 1, 1]], 2)
    assert not admissible_sets.is_admissible([[1, 0], [2, 0]], 1)  # same support
    assert not admissible_sets.is_admissible([[1, 1], [2, 0]], 1)  # wrong weight


def test_weight_one_sets_take_every_support():
    setting = admissible_sets.AdmissibleSetting(6, 1, "all_vectors")
    assert admissible_sets.evaluate(lambda el, n, w: 0.0, [setting]) == 6.0


def test_asp_published_settings_and_invalid_priority():
    assert admissible_sets.generate_instances(12, 5, 0) == [(12, 7, "all_vectors")]
    assert admissible_sets.generate_instances(21, 1, 0) == [(21, 15, "cyclic_triples")]
    for answer, reason in ((float("nan"), "NaN"), ("high", "real number"), (None, "real")):
        with pytest.raises(InvalidHeuristicOutput, match=reason):
            admissible_sets.evaluate(lambda el, n, w, a=answer: a, SMALL_ASP)


# --- ACO ------------------------------------------------------------------------------


@pytest.mark.parametrize("name,size", [("tsp_aco", 20), ("cvrp_aco", 20)])
def test_aco_with_inverse_distance_beats_random_desirability(name, size):
    task = TASKS[name]
    instances = task.generate_instances(size, 2, 0)
    guided = task.baseline(instances, settings=FAST_SETTINGS)
    unguided = task.evaluate(random_matrix, instances, settings=FAST_SETTINGS)
    assert guided < 0.8 * unguided


def test_bin_packing_aco_with_fill_heuristic_beats_random_desirability():
    def fill_exactly(demand, capacity):
        pair_load = demand[:, None] + demand[None, :]
        return np.where(pair_load <= capacity, np.exp(-(capacity - pair_load) / 5.0), 0.0)

    instances = bin_packing.generate_offline_instances(60, 2, 0)
    guided = bin_packing.evaluate_offline_aco(fill_exactly, instances, FAST_SETTINGS)
    unguided = bin_packing.evaluate_offline_aco(random_matrix, instances, FAST_SETTINGS)
    assert guided < unguided
    assert guided >= np.mean([bin_packing.lower_bound(x, 150) for x in instances])


@pytest.mark.parametrize("name", ["tsp_aco", "cvrp_aco", "bpp_offline_aco"])
def test_aco_is_deterministic_given_the_seed_and_improves_with_iterations(name):
    task = TASKS[name]
    instances = small_instances(name)
    first = task.baseline(instances, settings=FAST_SETTINGS)
    assert task.baseline(instances, settings=FAST_SETTINGS) == first
    longer = FAST_SETTINGS._replace(n_iterations=4 * FAST_SETTINGS.n_iterations)
    assert task.baseline(instances, settings=longer) <= first  # same stream, more rounds
    reseeded = [task.baseline(instances, settings=FAST_SETTINGS._replace(seed=seed))
                for seed in range(1, 4)]
    assert any(value != first for value in reseeded)


def test_aco_finds_hand_checked_optima():
    square = np.array([[0.0, 0.0], [1.0, 1.0], [1.0, 0.0], [0.0, 1.0]])
    assert TASKS["tsp_aco"].baseline([square], settings=FAST_SETTINGS) == pytest.approx(4.0)
    # Two customers of demand 30 on either side of the depot: two separate trips.
    two_trips = np.array([[0, 0.0, 0.0], [30, 1.0, 0.0], [30, -1.0, 0.0]])
    assert TASKS["cvrp_aco"].baseline([two_trips], settings=FAST_SETTINGS) == pytest.approx(4.0)
    one_trip = np.array([[0, 0.0, 0.0], [5, 3.0, 4.0]])
    assert TASKS["cvrp_aco"].baseline([one_trip], settings=FAST_SETTINGS) == pytest.approx(10.0)
    assert TASKS["bpp_offline_aco"].baseline([np.array([100, 50, 100, 50])],
                                             settings=FAST_SETTINGS) == 2.0


@pytest.mark.parametrize("output,reason", [
    (lambda d: np.ones((3, 3)), "shape"),
    (lambda d: np.full(d.shape, np.nan), "NaN"),
    (lambda d: np.where(np.eye(len(d)) > 0, 0.0, np.inf), "inf"),
    (lambda d: -np.ones(d.shape), "no positive"),
    (lambda d: [["x"] * len(d)] * len(d), "real numbers"),
    (lambda d: None, "real numbers"),
])
def test_aco_invalid_desirability_raises(output, reason):
    with pytest.raises(InvalidHeuristicOutput, match=reason):
        tsp.evaluate_aco(output, tsp.generate_instances(6, 1, 0), FAST_SETTINGS)


def test_desirability_diagonal_is_ignored_and_negatives_floored():
    matrix = np.array([[np.nan, 2.0, -1.0], [4.0, np.inf, 0.0], [1.0, 1.0, 5.0]])
    np.testing.assert_allclose(check_desirability_matrix(matrix, 3),
                               [[0, 0.5, 1e-9], [1.0, 0, 1e-9], [0.25, 0.25, 0]])


def test_aco_settings_are_validated():
    with pytest.raises(ValueError, match="n_ants"):
        tsp.evaluate_aco(random_matrix, tsp.generate_instances(5, 1, 0),
                         aco.ACOSettings(n_ants=0, n_iterations=1))


# --- anchors --------------------------------------------------------------------------


@needs_anchors
def test_anchor_loader_shapes():
    assert TASKS["kp_constructive"].load_anchor_instances(ANCHOR_ROOT, 50, "test").shape == (
        1000, 50, 2)
    assert TASKS["cvrp_aco"].load_anchor_instances(ANCHOR_ROOT, 20, "test").shape == (64, 21, 3)
    assert TASKS["bpp_offline_aco"].load_anchor_instances(ANCHOR_ROOT, 120, "val").shape == (
        64, 120)
    with pytest.raises(FileNotFoundError, match="available"):
        TASKS["tsp_aco"].load_anchor_instances(ANCHOR_ROOT, 7, "test")


def test_anchor_loader_refuses_tasks_without_anchors_and_bad_splits(tmp_path):
    with pytest.raises(ValueError, match="no published anchor"):
        TASKS["online_bpp"].load_anchor_instances(str(tmp_path), 100, "test")
    with pytest.raises(ValueError, match="split"):
        TASKS["tsp_aco"].load_anchor_instances(str(tmp_path), 20, "dev")
