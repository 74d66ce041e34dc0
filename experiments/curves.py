"""Learning curves of finished runs, and two methods compared along them.

A run's curve is its held-out success at each evaluation, against the training budget
spent before it: episodes played, estimated training FLOPs (the rules' ``flops``),
training seconds (the generations' wall time; evaluations cost every method the same and
are left out) and, for runs whose generations recorded their machine's probe time
(``training.machine``), probe units: each generation's seconds divided by its machine's
probe seconds, which puts runs timed on machines of different speeds on one clock. Two
methods run on the same seed compare at a common budget on one of these axes, the
smaller of the two whole runs' totals: each method's success is that of its last
evaluation within the budget (``at_budget``: no extrapolation, no interpolation), so
neither is credited with a point it did not reach. A run evaluated long before the
budget and just past it is then read at the earlier point, so each comparison also gives
the ``bracket`` the evaluations allow: the difference with the baseline credited with its
next evaluation and with the method credited with its own.

Across seeds the primary statistic is a seed-level t-interval on the per-seed paired
differences (``seed_t_interval``); the hierarchical bootstrap over seeds then puzzles
(``grid.bootstrap_difference``) and the signs of the differences come beside it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from scipy import stats

from experiments import grid

pyplot = grid.pyplot  # grid chose the Agg backend

AXES = ("episodes", "flops", "seconds")  # every run's curve has these
COMPARED = (*AXES, "probe_units")  # probe units only where both runs were probed


def episodes_per_generation(config: dict) -> int:
    """Episodes one training generation (or GRPO step) of a run's config plays."""
    tasks = config["rollout"]["tasks_per_generation"]
    if config["rule"]["name"] == "grpo":
        return config["rule"]["group_size"] * tasks
    return config["es"]["population_size"] * tasks


def curve(directory: str) -> list[dict[str, Any]]:
    """A finished run's points: at each evaluation its ``generation``, the ``episodes``,
    ``flops``, ``seconds`` and ``probe_units`` (None unless every generation recorded its
    machine's ``probe_s``) of training before it, ``success`` and the per-episode
    ``solved`` outcomes (with ``task_ids``)."""
    with open(os.path.join(directory, "config.json"), encoding="utf-8") as f:
        per_generation = episodes_per_generation(json.load(f))
    records = grid.train_records(directory)
    flops = np.cumsum([0.0] + [r.get("flops", np.nan) for r in records])
    seconds = np.cumsum([0.0] + [r["wall_time_s"] for r in records])
    probe_units = (np.cumsum([0.0] + [r["wall_time_s"] / r["probe_s"] for r in records])
                   if all("probe_s" in r for r in records) else None)
    evaluations = [r for r in grid.metrics.read_metrics(
        os.path.join(directory, "metrics.jsonl")) if r["kind"] == "eval"]
    return [dict(generation=e["generation"], episodes=e["generation"] * per_generation,
                 flops=float(flops[e["generation"]]),
                 seconds=float(seconds[e["generation"]]),
                 probe_units=None if probe_units is None else float(
                     probe_units[e["generation"]]),
                 success=e["success_rate"], solved=e["episode_solved"],
                 task_ids=e["episode_task_ids"])
            for e in evaluations]


def machines(directory: str) -> set[str] | None:
    """The machines a finished run's generations ran on (None unless every generation
    recorded its ``machine``)."""
    records = grid.train_records(directory)
    if not all("machine" in r for r in records):
        return None
    return {r["machine"] for r in records}


def on_one_machine(first: str, second: str) -> bool:
    """Whether every generation of both finished runs ran on one machine (False where a
    run did not record its machines)."""
    first_machines, second_machines = machines(first), machines(second)
    return (first_machines is not None and second_machines is not None
            and len(first_machines | second_machines) == 1)


def at_budget(points: Sequence[dict], axis: str, budget: float) -> dict:
    """The last point whose ``axis`` is within ``budget`` (the first point, at zero,
    always is)."""
    within = [p for p in points if p[axis] <= budget * (1 + 1e-9)]
    return within[-1] if within else points[0]


def at_or_beyond(points: Sequence[dict], axis: str, budget: float) -> dict:
    """The first point whose ``axis`` reaches ``budget`` (the last point if none does)."""
    return next((p for p in points if p[axis] >= budget * (1 - 1e-9)), points[-1])


def common_budget(first: Sequence[dict], second: Sequence[dict], axis: str) -> float:
    """The budget both whole runs reached on ``axis``: the smaller of their totals."""
    return min(first[-1][axis], second[-1][axis])


def area_under_curve(points: Sequence[dict], axis: str, budget: float) -> float:
    """Mean held-out success over [0, ``budget``] on ``axis``, success held at each
    evaluation's value until the next one (a step function, as ``at_budget`` reads it)."""
    xs = [p[axis] for p in points if p[axis] < budget] + [budget]
    values = [p["success"] for p in points if p[axis] < budget]
    return float(np.sum(np.diff(xs) * np.asarray(values)) / budget)


def budget_to_reach(points: Sequence[dict], axis: str, threshold: float) -> float | None:
    """``axis`` at the first evaluation whose success reaches ``threshold`` (None: never)."""
    return next((p[axis] for p in points if p["success"] >= threshold), None)


def seed_t_interval(differences: Sequence[float], level: float = 0.95
                    ) -> list[float] | None:
    """``level`` t-interval of the mean of per-seed differences (None under two seeds)."""
    values = np.asarray(differences, np.float64)
    if len(values) < 2:
        return None
    half = stats.t.ppf(0.5 + level / 2, len(values) - 1) * values.std(ddof=1) / np.sqrt(
        len(values))
    return [float(values.mean() - half), float(values.mean() + half)]


def mean_curve(curves: Sequence[Sequence[dict]]) -> list[dict[str, float]]:
    """Seeds' curves averaged point by point (seeds share their evaluation schedule)."""
    length = min(len(c) for c in curves)
    return [{name: float(np.mean([c[i][name] for c in curves]))
             for name in ("generation", *AXES, "success")} for i in range(length)]


def plot(rows: Sequence[dict], path: str, title: str) -> None:
    """Each row's mean curve: held-out success against FLOPs and against seconds."""
    figure, panels = pyplot.subplots(1, 2, figsize=(12, 3.8), sharey=True)
    for index, row in enumerate(rows):
        points = row["curve"]
        style = dict(marker=".", color=pyplot.cm.tab10(index % 10),
                     label=f"{row['horizon']} blanks, {row['method']}",
                     linestyle="-" if row["method"] == "grpo" else "--")
        for panel, axis in zip(panels, ("flops", "seconds")):
            panel.plot([p[axis] for p in points], [p["success"] for p in points], **style)
    for panel, label in zip(panels, ("estimated training FLOPs", "training seconds")):
        panel.set_xlabel(f"{label} (mean over seeds)")
    panels[0].set_ylabel("held-out success (mean over seeds)")
    panels[1].legend(fontsize=7)
    figure.suptitle(title, fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    pyplot.close(figure)


def _differences(values: Sequence[float]) -> dict[str, Any]:
    return dict(differences=list(values), mean=float(np.mean(values)),
                t95=seed_t_interval(values))


def bracket(method: Sequence[Sequence[dict]], baseline: Sequence[Sequence[dict]],
            axis: str, budgets: Sequence[float]) -> dict[str, dict]:
    """What each pair's evaluations allow the difference at its budget to be:
    ``baseline_credited`` reads the baseline at its first evaluation at or beyond the
    budget and the method at its last within it, ``method_credited`` the reverse (each:
    per-seed ``differences``, ``mean``, ``t95``). Where neither curve falls between
    evaluations, the difference at the budget lies between the two; they lie far apart
    where a run was evaluated just past the budget and long before it."""
    def read(method_at: Callable, baseline_at: Callable) -> dict[str, Any]:
        return _differences([method_at(m, axis, b)["success"] - baseline_at(g, axis, b)[
            "success"] for m, g, b in zip(method, baseline, budgets)])
    return dict(baseline_credited=read(at_budget, at_or_beyond),
                method_credited=read(at_or_beyond, at_budget))


def compare(method: Sequence[Sequence[dict]], baseline: Sequence[Sequence[dict]],
            axis: str, threshold: float) -> dict[str, Any] | None:
    """``method`` − ``baseline`` over paired seeds' curves at their common budget on
    ``axis``, over the pairs whose curves both have ``axis`` (``seeds``): per-seed
    differences, their mean, the seed-level t-interval (``t95``), the hierarchical
    bootstrap (``bootstrap95``), the signs, each method's area under the curve up to the
    budget, the budget each needs to reach ``threshold`` and the ``bracket`` the
    evaluations allow. None when no pair has ``axis`` or the seeds' puzzles differ."""
    pairs = [(at_budget(m, axis, b), at_budget(g, axis, b), m, g) for m, g in
             zip(method, baseline) if m[-1][axis] is not None and g[-1][axis] is not None
             for b in [common_budget(m, g, axis)]]
    if not pairs or any(m["task_ids"] != g["task_ids"] for m, g, _, _ in pairs):
        return None
    differences = [m["success"] - g["success"] for m, g, _, _ in pairs]
    budgets = [common_budget(m, g, axis) for _, _, m, g in pairs]
    return dict(
        seeds=len(pairs), budget=budgets, **_differences(differences),
        bracket=bracket([m for _, _, m, _ in pairs], [g for _, _, _, g in pairs], axis,
                        budgets),
        bootstrap95=list(grid.bootstrap_difference(
            [np.asarray(m["solved"], np.float64) for m, _, _, _ in pairs],
            [np.asarray(g["solved"], np.float64) for _, g, _, _ in pairs])),
        signs=dict(better=int(np.sum(np.asarray(differences) > 0)),
                   tied=int(np.sum(np.asarray(differences) == 0)),
                   worse=int(np.sum(np.asarray(differences) < 0))),
        auc=[area_under_curve(m, axis, b) for (_, _, m, _), b in zip(pairs, budgets)],
        baseline_auc=[area_under_curve(g, axis, b) for (_, _, _, g), b in zip(pairs, budgets)],
        to_threshold=[budget_to_reach(m, axis, threshold) for _, _, m, _ in pairs],
        baseline_to_threshold=[budget_to_reach(g, axis, threshold) for _, _, _, g in pairs])
