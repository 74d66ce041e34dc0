r"""A grid of AHD runs (methods × tasks × sizes × seeds) and the matched-baseline table.

Every run is the trainer on the AHD config (``--config`` and its dotted overrides set
what the runs share), in-process with one loaded model, in
``<workdir>/<task>_<size>/<method>/seed<k>``; finished runs are reused and interrupted
ones resume. A method is a search (``eoh``, ``sample``) alone (``update.name=none``) or
with ES (``eoh_es``, ``sample_es``); each generation answers one batch of the same size
either way, so methods compare at the same LLM-call budget. Then, for each (task, size)
and search, the table compares search+ES with the search alone (mean ± std over seeds of
the best heuristic's held-out objective; win/tie/loss per seed in the task's
direction). It is printed and written to ``<workdir>/table.md`` and ``table.json``.

  python -m experiments.ahd_grid --tasks=tsp_constructive:20,kp_constructive:50 \
      --methods=sample,sample_es --seeds=0,1 --config.run.generations=2 \
      --config.rollout.max_new_tokens=192 --workdir=workdirs/ahd_grid
"""

import contextlib
import json
import math
import os
import sys
import time
from typing import Any, Sequence

import numpy as np
from absl import app, flags, logging
from ml_collections import config_flags

from agentic_esopt import models, training
from agentic_esopt.envs.ahd.tasks import TASKS
from experiments import launch

METHODS = ("eoh", "eoh_es", "sample", "sample_es")
SEARCHES = ("eoh", "sample")

_CONFIG = config_flags.DEFINE_config_file("config", "experiments/configs/ahd.py",
                                          "Config shared by every run of the grid.",
                                          lock_config=True)
_TASKS = flags.DEFINE_list("tasks", ["tsp_constructive", "kp_constructive"],
                           "Tasks, each 'name' or 'name:size'.")
_METHODS = flags.DEFINE_list("methods", list(METHODS), f"Methods, from {METHODS}.")
_SEEDS = flags.DEFINE_list("seeds", ["0", "1"], "Run seeds.")
_WORKDIR = flags.DEFINE_string("workdir", "workdirs/ahd_grid", "Grid directory.")


def _as_int(text: str, what: str) -> int:
    try:
        return int(text)
    except ValueError as error:
        raise app.UsageError(f"{what} must be an integer, got {text!r}") from error


def task_sizes() -> list[tuple[str, int | None]]:
    """(task, size) pairs from --tasks."""
    pairs = []
    for entry in _TASKS.value:
        name, _, size = entry.partition(":")
        pairs.append((name, _as_int(size, f"the size in {entry!r}") if size else None))
    return pairs


def grid_configs() -> list[tuple[str, training.TrainConfig]]:
    """(method, config) of every run, all checked before any compute."""
    unknown = sorted(set(_METHODS.value) - set(METHODS))
    if unknown:
        raise app.UsageError(f"unknown method {unknown[0]!r}; choose from {METHODS}")
    shared = launch.train_config(_CONFIG.value)
    runs, problems = [], []
    for (task, size) in task_sizes():
        for method in _METHODS.value:
            for seed in _SEEDS.value:
                try:
                    runs.append((method, shared.replace(
                        env={"task": task, "size": size, "search": method.removesuffix("_es")},
                        update={"name": "es" if method.endswith("_es") else "none"},
                        run={"seed": _as_int(seed, "--seeds entries")})))
                except ValueError as error:
                    problems.append(str(error))
    if not runs or problems:
        raise app.UsageError("invalid grid:\n" + "\n".join(sorted(set(problems)) or
                                                           ["no runs"]))
    return runs


def run_dir(method: str, config: training.TrainConfig) -> str:
    return os.path.join(_WORKDIR.value, f"{config.env.task}_{config.env.problem_size()}",
                        method, f"seed{config.run.seed}")


def run_summary(method: str, config: training.TrainConfig, final_eval: dict) -> dict:
    """One run's row for ``matched_table``."""
    return dict(task=config.env.task, size=config.env.problem_size(), method=method,
                seed=config.run.seed, minimise=TASKS[config.env.task].minimise,
                best_eval_objective=final_eval["best_eval_objective"],
                baseline_eval_objective=final_eval["baseline_eval_objective"],
                calls=final_eval["calls"])


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


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    runs = grid_configs()
    start = time.monotonic()
    with contextlib.redirect_stdout(sys.stderr):
        shared = runs[0][1].model
        model = models.load(shared.name, dtype=shared.dtype)
        summaries = []
        for index, (method, config) in enumerate(runs):
            directory = run_dir(method, config)
            logging.info("run %d/%d: %s", index + 1, len(runs), directory)
            result = training.train(config, directory, model=model)
            summaries.append(run_summary(method, config, result.summary["final_eval"]))
    rows = matched_table(summaries)
    table = table_markdown(rows)
    wall_s = time.monotonic() - start
    os.makedirs(_WORKDIR.value, exist_ok=True)
    with open(os.path.join(_WORKDIR.value, "table.md"), "w", encoding="utf-8") as file:
        file.write(table)
    with open(os.path.join(_WORKDIR.value, "table.json"), "w", encoding="utf-8") as file:
        json.dump(dict(rows=rows, runs=summaries, wall_s=wall_s), file, indent=2)
    print(table + f"\n{len(runs)} runs, wall time {wall_s:.0f} s", flush=True)


if __name__ == "__main__":
    launch.quiet_startup()
    app.run(main)
