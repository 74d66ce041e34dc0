r"""A grid of AHD runs (methods × tasks × sizes × seeds) and the matched-baseline table.

Every run is the trainer on the AHD config (``--config`` and its dotted overrides set
what the runs share), in-process with one loaded model, in
``<workdir>/<task>_<size>/<method>/seed<k>``; finished runs are reused and interrupted
ones resume. A method is a search (``eoh``, ``sample``) alone (``rule.name=none``) or
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
import os
import sys
import time

from absl import app, flags, logging

from agentic_esopt import models, training
from agentic_esopt.envs.ahd.tasks import TASKS
from experiments import ahd_table, launch

METHODS = ("eoh", "eoh_es", "sample", "sample_es")

_CONFIG = launch.define_config("experiments/configs/ahd.py",
                               "Config shared by every run of the grid.")
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
                        rule={"name": "es" if method.endswith("_es") else "none"},
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
    """One run's row for ``ahd_table.matched_table``."""
    return dict(task=config.env.task, size=config.env.problem_size(), method=method,
                seed=config.run.seed, minimise=TASKS[config.env.task].minimise,
                best_eval_objective=final_eval["best_eval_objective"],
                baseline_eval_objective=final_eval["baseline_eval_objective"],
                calls=final_eval["calls"])


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
    rows = ahd_table.matched_table(summaries)
    table = ahd_table.table_markdown(rows)
    wall_s = time.monotonic() - start
    os.makedirs(_WORKDIR.value, exist_ok=True)
    with open(os.path.join(_WORKDIR.value, "table.md"), "w", encoding="utf-8") as file:
        file.write(table)
    with open(os.path.join(_WORKDIR.value, "table.json"), "w", encoding="utf-8") as file:
        json.dump(dict(rows=rows, runs=summaries, wall_s=wall_s), file, indent=2)
    print(table + f"\n{len(runs)} runs, wall time {wall_s:.0f} s", flush=True)


if __name__ == "__main__":
    launch.run(main)
