"""The matched-baseline table of AHD runs: a search alone vs the same search with ES."""

import math
from typing import Any, Sequence

import numpy as np

SEARCHES = ("eoh", "sample")


def _stats(values: Sequence[float | None]) -> dict[str, Any]:
    found = [v for v in values if v is not None]
    return dict(mean=float(np.mean(found)) if found else None,
                std=float(np.std(found)) if found else None,
                found=len(found), runs=len(values))


def _compare(with_es: float | None, without: float | None, minimise: bool) -> int:
    """+1 if `with_es` is better, -1 if worse, 0 for a tie (a found heuristic beats none)."""
    if with_es is None or without is None:
        return (with_es is not None) - (without is not None)
    if math.isclose(with_es, without, rel_tol=1e-9, abs_tol=1e-12):
        return 0
    better = with_es < without if minimise else with_es > without
    return 1 if better else -1


def matched_table(summaries: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Search vs search+ES per (task, size), from ``run_summary`` rows.

    Each row: the best held-out objective's mean ± std (population std) over the seeds
    that found a valid heuristic, for the search alone and with ES, and the win/tie/loss
    counts of search+ES against the search over the seeds both ran (in the task's
    direction; a run that found a heuristic beats one that found none).
    """
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for summary in summaries:
        groups.setdefault((summary["task"], summary["size"]), []).append(summary)
    rows = []
    for (task, size), runs in sorted(groups.items()):
        minimise = runs[0]["minimise"]
        for base in SEARCHES:
            by_seed = {m: {r["seed"]: r["best_eval_objective"] for r in runs
                           if r["method"] == m} for m in (base, base + "_es")}
            if not by_seed[base] or not by_seed[base + "_es"]:
                continue
            seeds = sorted(set(by_seed[base]) & set(by_seed[base + "_es"]))
            outcomes = [_compare(by_seed[base + "_es"][s], by_seed[base][s], minimise)
                        for s in seeds]
            baselines = [r["baseline_eval_objective"] for r in runs
                         if r["baseline_eval_objective"] is not None]
            rows.append(dict(
                task=task, size=size, method=base, minimise=minimise,
                baseline=baselines[0] if baselines else None,
                without_es=_stats(list(by_seed[base].values())),
                with_es=_stats(list(by_seed[base + "_es"].values())),
                wins=outcomes.count(1), ties=outcomes.count(0), losses=outcomes.count(-1),
                seeds=seeds))
    return rows


def _mean_std(stats: dict[str, Any]) -> str:
    if stats["mean"] is None:
        return f"none found (0/{stats['runs']})"
    return f"{stats['mean']:.4f} ± {stats['std']:.4f} ({stats['found']}/{stats['runs']})"


def table_markdown(rows: Sequence[dict[str, Any]]) -> str:
    """``matched_table`` rows as a markdown table."""
    lines = ["| task | size | goal | baseline | method | best: method | best: method+ES | "
             "W/T/L (+ES vs method) |",
             "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        baseline = "n/a" if row["baseline"] is None else f"{row['baseline']:.4f}"
        lines.append(
            f"| {row['task']} | {row['size']} | {'min' if row['minimise'] else 'max'} | "
            f"{baseline} | {row['method']} | {_mean_std(row['without_es'])} | "
            f"{_mean_std(row['with_es'])} | {row['wins']}/{row['ties']}/{row['losses']} |")
    return "\n".join(lines) + "\n"
