"""Learning curves compared at equal budgets (``experiments.curves``)."""

import json

import numpy as np
import pytest
from scipy import stats

from experiments import curves


def points(successes, flops_per_point=10.0, solved=None):
    """A curve evaluated every ``flops_per_point`` FLOPs (episodes and seconds alike)."""
    return [dict(generation=i, episodes=i * flops_per_point, flops=i * flops_per_point,
                 seconds=i * flops_per_point, success=s,
                 solved=solved[i] if solved else [s, s], task_ids=["a", "b"])
            for i, s in enumerate(successes)]


def test_a_budget_reads_the_last_evaluation_within_it():
    curve = points([0.1, 0.3, 0.6])
    assert curves.at_budget(curve, "flops", 15.0)["success"] == 0.3
    assert curves.at_budget(curve, "flops", 20.0)["success"] == 0.6
    assert curves.at_budget(curve, "flops", 5.0)["success"] == 0.1


def test_area_under_the_curve_holds_each_evaluation_until_the_next():
    curve = points([0.0, 0.5, 1.0])
    # [0, 10): 0.0, [10, 20): 0.5, [20, 25]: 1.0 → (0 + 5 + 5) / 25.
    assert curves.area_under_curve(curve, "flops", 25.0) == pytest.approx(0.4)
    assert curves.area_under_curve(curve, "flops", 10.0) == pytest.approx(0.0)


def test_budget_to_reach_a_threshold_is_the_first_crossing_or_none():
    curve = points([0.1, 0.6, 0.4, 0.9])
    assert curves.budget_to_reach(curve, "flops", 0.5) == 10.0
    assert curves.budget_to_reach(curve, "flops", 0.95) is None


def test_the_seed_interval_is_a_student_t_interval_of_the_differences():
    differences = [0.1, -0.05, 0.2, 0.0, 0.15]
    low, high = curves.seed_t_interval(differences)
    half = stats.t.ppf(0.975, 4) * np.std(differences, ddof=1) / np.sqrt(5)
    assert (low, high) == pytest.approx((np.mean(differences) - half,
                                         np.mean(differences) + half))
    assert curves.seed_t_interval([0.3]) is None


def test_methods_compare_at_the_smaller_whole_run_budget():
    # ES runs to 40 FLOPs, GRPO to 20: compared at 20, where ES has 0.5 and GRPO 0.75.
    es = [points([0.0, 0.25, 0.5, 0.75, 1.0]), points([0.0, 0.5, 0.5, 1.0, 1.0])]
    grpo = [points([0.0, 0.5, 0.75]), points([0.0, 0.0, 0.25])]
    compared = curves.compare(es, grpo, "flops", threshold=0.5)
    assert compared["budget"] == [20.0, 20.0]
    assert compared["differences"] == pytest.approx([-0.25, 0.25])
    assert compared["signs"] == dict(better=1, tied=0, worse=1)
    assert compared["to_threshold"] == [20.0, 10.0]
    assert compared["baseline_to_threshold"] == [10.0, None]
    low, high = compared["t95"]
    assert low < 0 < high


def test_runs_on_different_puzzles_do_not_compare():
    es, grpo = points([0.0, 1.0]), points([0.0, 1.0])
    grpo[-1] = {**grpo[-1], "task_ids": ["c", "d"]}
    assert curves.compare([es], [grpo], "flops", 0.5) is None


def write_run(directory, seconds, machines=None, probes=None):
    """A finished ES run (G = 2, one task a generation) with one generation per entry of
    ``seconds``, each on ``machines[i]`` with probe time ``probes[i]`` where given, and
    evaluations before and after."""
    directory.mkdir(parents=True)
    config = {"rollout": {"tasks_per_generation": 1}, "rule": {"name": "es"},
              "es": {"population_size": 2}}
    (directory / "config.json").write_text(json.dumps(config))
    evaluation = dict(kind="eval", success_rate=0.5, episode_solved=[1.0, 0.0],
                      episode_task_ids=["a", "b"])
    records = [{**evaluation, "generation": 0}]
    for generation, wall in enumerate(seconds):
        where = {} if machines is None else {"machine": machines[generation],
                                             "probe_s": probes[generation]}
        records.append(dict(kind="train", generation=generation, wall_time_s=wall, **where))
    records.append({**evaluation, "generation": len(seconds)})
    (directory / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(directory)


def test_probe_units_put_runs_timed_on_machines_of_different_speeds_on_one_clock(tmp_path):
    # A generation resumed on a machine twice as fast (half the probe time) takes half the
    # seconds, and the same probe units.
    slow_then_fast = write_run(tmp_path / "a", [10.0, 5.0], ["m1", "m2"], [2.0, 1.0])
    points = curves.curve(slow_then_fast)
    assert [p["seconds"] for p in points] == [0.0, 15.0]
    assert [p["probe_units"] for p in points] == [0.0, 10.0]
    assert curves.machines(slow_then_fast) == {"m1", "m2"}
    unprobed = write_run(tmp_path / "b", [10.0, 10.0])
    assert [p["probe_units"] for p in curves.curve(unprobed)] == [None, None]
    assert curves.machines(unprobed) is None


def test_runs_are_on_one_machine_only_when_all_their_generations_are(tmp_path):
    first = write_run(tmp_path / "a", [1.0, 1.0], ["m1", "m1"], [1.0, 1.0])
    same = write_run(tmp_path / "b", [1.0], ["m1"], [1.0])
    other = write_run(tmp_path / "c", [1.0], ["m2"], [1.0])
    unknown = write_run(tmp_path / "d", [1.0])
    assert curves.on_one_machine(first, same)
    assert not curves.on_one_machine(first, other)
    assert not curves.on_one_machine(first, unknown)


def test_an_axis_compares_only_the_seeds_whose_runs_both_have_it():
    es = [points([0.0, 0.5, 1.0]), points([0.0, 1.0, 1.0])]
    grpo = [points([0.0, 0.25, 0.5]), points([0.0, 0.5, 0.5])]
    for curve in (es[0], grpo[0]):
        for point in curve:
            point["probe_units"] = point["seconds"] / 2
    for curve in (es[1], grpo[1]):  # seed 1: GRPO ran before runs recorded probe times
        for point in curve:
            point["probe_units"] = None if curve is grpo[1] else point["seconds"]
    compared = curves.compare(es, grpo, "probe_units", threshold=0.5)
    assert compared["seeds"] == 1 and compared["differences"] == pytest.approx([0.5])
    assert compared["t95"] is None  # one seed gives no interval
    assert curves.compare(es, grpo, "seconds", threshold=0.5)["seeds"] == 2
    assert curves.compare(es[1:], grpo[1:], "probe_units", threshold=0.5) is None


def test_the_bracket_credits_each_method_in_turn_with_its_next_evaluation():
    # ES runs to 30 FLOPs; GRPO is evaluated at 0 and 40: at the common budget (30) GRPO
    # reads its untrained 0.0, and credited with its next evaluation, 0.75.
    es = [points([0.0, 0.25, 0.5, 0.625])]
    grpo = [[dict(p, flops=40.0 * i) for i, p in enumerate(points([0.0, 0.75]))]]
    compared = curves.compare(es, grpo, "flops", threshold=0.5)
    assert compared["budget"] == [30.0] and compared["differences"] == [0.625]
    bracket = compared["bracket"]
    assert bracket["baseline_credited"]["differences"] == [0.625 - 0.75]
    assert bracket["method_credited"]["differences"] == [0.625]  # ES's last point is 30
    assert curves.at_or_beyond(grpo[0], "flops", 30.0)["success"] == 0.75
    assert curves.at_or_beyond(grpo[0], "flops", 50.0)["success"] == 0.75  # none: the last
