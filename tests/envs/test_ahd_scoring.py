"""AHD candidates scored in the sandbox: exact objectives, invalid outputs with reasons."""

import os
import tempfile
import time

import ahd_toy_task
import pytest

from agentic_esopt.envs.ahd import aco
from agentic_esopt.envs.ahd import scoring
from agentic_esopt.envs.ahd import tasks

TOY = "ahd_toy_task:TOY_TASK"  # tests/envs is on sys.path, which the child inherits
SPEC = scoring.InstanceSpec(size=2, n=3, seed=1)
MEAN = "def score(xs):\n    return sum(xs) / len(xs)\n"


def run_toy(source, **limits):
    limits.setdefault("timeout_s", 3)
    return scoring.run_candidate(source, "score", TOY, SPEC, **limits)


def test_legit_candidate_scores_its_true_objective():
    result = run_toy(MEAN)
    namespace = {}
    exec(MEAN, namespace)  # pylint: disable=exec-used
    task = ahd_toy_task.TOY_TASK
    expected = task.evaluate(namespace["score"], task.generate_instances(*SPEC))
    assert result.valid and result.error is None
    assert result.objective == expected == 3.0


def test_registry_task_scores_like_in_process_and_rejects_illegal_choices():
    task = tasks.TASKS["tsp_constructive"]
    spec = scoring.InstanceSpec(size=8, n=2, seed=0)
    visited = ("def select_next_node(current_node, destination_node, unvisited_nodes, "
               "distance_matrix):\n    return current_node\n")
    wrong_type = visited.replace("return current_node", "return 'north'")
    legit, illegal, typed = scoring.evaluate_many(
        [task.seed_heuristic_source, visited, wrong_type], task.function_name, task.name,
        spec, timeout_s=60)
    assert legit.valid and legit.objective == task.baseline(task.generate_instances(*spec))
    assert "InvalidHeuristicOutput" in illegal.error and "not among" in illegal.error
    assert "InvalidHeuristicOutput" in typed.error and "integer" in typed.error


def test_evaluate_options_reach_the_task():
    task = tasks.TASKS["tsp_aco"]
    instances = task.generate_instances(6, 1, 0)
    result = scoring.run_candidate(task.seed_heuristic_source, task.function_name, task.name,
                                   instances, timeout_s=60,
                                   evaluate_options={"settings": aco.FAST_SETTINGS})
    assert result.valid
    assert result.objective == task.baseline(instances, settings=aco.FAST_SETTINGS)


def test_concrete_instances_are_passed_through():
    result = scoring.run_candidate(MEAN, "score", TOY, [1.0, 2.0, 6.0], timeout_s=3)
    assert result.valid and result.objective == 3.0


@pytest.mark.parametrize("source, reason", [
    ("def score(xs)\n    return 1.0\n", "SyntaxError"),
    ("def score(xs):\n    return float('nan')\n", "not finite"),
    ("def score(xs):\n    return '3.0'\n", "objective has type str"),
    ("def score(xs):\n    return True\n", "objective has type bool"),
    ("THRESHOLD = 3\n", "no function named 'score'"),
    ("def scor(xs):\n    return 1.0\n", "defines: ['scor']"),
    ("import sys\ndef score(xs):\n    sys.exit(0)\n", "SystemExit"),
    ("import os\ndef score(xs):\n    os.fork()\n", "sandbox violation: os.fork is not allowed"),
    ("def score(xs):\n    while True:\n        pass\n", "timed out"),
])
def test_invalid_candidate_fails_with_a_reason(source, reason):
    result = run_toy(source, timeout_s=2)
    assert not result.valid and result.objective is None
    assert reason in result.error, result.error


def test_stdout_is_kept():
    result = run_toy("def score(xs):\n    print('hello from the candidate')\n    return 1.0\n")
    assert result.valid and "hello from the candidate" in result.stdout_tail


def test_evaluate_many_keeps_order_and_runs_in_parallel():
    sources = [f"import time\ndef score(xs):\n    time.sleep(1)\n    return {i}.0\n"
               for i in range(4)]
    start = time.monotonic()
    results = scoring.evaluate_many(sources, "score", TOY, SPEC, max_workers=4, timeout_s=8)
    assert [r.objective for r in results] == [0.0, 1.0, 2.0, 3.0]
    assert time.monotonic() - start < 3.9
    assert scoring.evaluate_many([], "score", TOY, SPEC) == []


def test_temporary_directories_are_removed():
    before = set(os.listdir(tempfile.gettempdir()))
    run_toy("open('left_behind.txt', 'w').write('x')\n" + MEAN)
    created = set(os.listdir(tempfile.gettempdir())) - before
    assert not [name for name in created if name.startswith("ahd_sandbox_")]


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="identifier"):
        scoring.run_candidate(MEAN, "not a name", TOY, SPEC)
    with pytest.raises(TypeError, match="source must be a str"):
        scoring.run_candidate(b"x", "score", TOY, SPEC)
    with pytest.raises(AttributeError):
        scoring.run_candidate(MEAN, "score", "ahd_toy_task:NO_SUCH_TASK", SPEC)
    with pytest.raises(ValueError, match="unknown AHD task 'tsp'; known: .*tsp_constructive"):
        scoring.run_candidate(MEAN, "score", "tsp", SPEC)
    with pytest.raises(ValueError, match="timeout_s must be positive"):
        run_toy(MEAN, timeout_s=0)
