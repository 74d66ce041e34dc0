r"""ES vs GRPO on Sudoku at several horizons, and ES with cosine vs constant σ.

Every run is the trainer on one config (``--config`` and its dotted overrides set what the
runs share; default the main job's), in-process with one loaded model, in
``<workdir>/blanks<h>/<method>/seed<k>``; finished runs are reused and interrupted ones
resume. A horizon h is a board with h blanks and h turns. Methods:

* ``es``: the config's ES (cosine σ);
* ``grpo``: ``update.name=grpo`` with ``update.group_size`` = ``es.population_size``, so
  both see the same trajectories per generation (G × tasks_per_generation) and the same
  number of generations;
* ``es_constant``: ES with σ fixed at ``es.sigma_start`` (only at ``--sigma_horizon``).

The table gives, per horizon and method, the held-out success rate before and after
(episodes pooled over seeds, ± s.e.), each seed's final success, and the final minus the
initial success with its paired s.e. (the same puzzles). It is written to
``<workdir>/table.md`` / ``table.json`` with a plot ``success.png``, and printed.

  python -m experiments.es_vs_grpo --horizons=2,4,6 --seeds=0,1 --workdir=workdirs/es_vs_grpo
"""

import contextlib
import json
import os
import sys
import time

from absl import app, flags, logging
import matplotlib
import numpy as np
from ml_collections import config_flags

from agentic_esopt import models, training
from agentic_esopt.agents import sources
from agentic_esopt.training import metrics
from experiments import launch

matplotlib.use("Agg")
from matplotlib import pyplot  # pylint: disable=wrong-import-position

METHODS = ("es", "grpo", "es_constant")

_CONFIG = config_flags.DEFINE_config_file("config", "experiments/configs/cpu_default.py",
                                          "Config shared by every run.", lock_config=True)
_HORIZONS = flags.DEFINE_list("horizons", ["2", "4", "6"], "Blanks (= turns) per board.")
_SEEDS = flags.DEFINE_list("seeds", ["0", "1"], "Run seeds.")
_SIGMA_HORIZON = flags.DEFINE_integer("sigma_horizon", 4, "Horizon of the cosine vs "
                                                          "constant σ comparison (0 = none).")
_WORKDIR = flags.DEFINE_string("workdir", "workdirs/es_vs_grpo", "Grid directory.")


def _ints(values: list[str], what: str) -> list[int]:
    try:
        return [int(v) for v in values]
    except ValueError as error:
        raise app.UsageError(f"{what} must be integers, got {values}") from error


def method_changes(method: str, shared: training.TrainConfig) -> dict:
    """The config sections a method changes."""
    if method == "grpo":
        return dict(update={"name": "grpo", "group_size": shared.es.population_size})
    if method == "es_constant":
        return dict(es={"sigma_schedule": "constant", "sigma_end": shared.es.sigma_start})
    return {}


def grid_configs() -> list[tuple[int, str, training.TrainConfig]]:
    """(horizon, method, config) of every run, all checked before any compute."""
    shared = launch.train_config(_CONFIG.value)
    if shared.env_name != "sudoku":
        raise app.UsageError(f"the grid plays Sudoku; --config is {shared.env_name!r}")
    horizons = _ints(_HORIZONS.value, "--horizons")
    seeds = _ints(_SEEDS.value, "--seeds")
    if _SIGMA_HORIZON.value and _SIGMA_HORIZON.value not in horizons:
        raise app.UsageError(f"--sigma_horizon={_SIGMA_HORIZON.value} is not among "
                             f"--horizons={horizons}")
    runs, problems = [], []
    for horizon in horizons:
        methods = METHODS if horizon == _SIGMA_HORIZON.value else METHODS[:2]
        for method in methods:
            for seed in seeds:
                changes = method_changes(method, shared)
                try:
                    runs.append((horizon, method, shared.replace(
                        env={"mask_count": horizon}, rollout={"max_turns": horizon},
                        run={"seed": seed}, **changes)))
                except ValueError as error:
                    problems.append(str(error))
    if problems:
        raise app.UsageError("invalid grid:\n" + "\n".join(sorted(set(problems))))
    return runs


def run_dir(horizon: int, method: str, config: training.TrainConfig) -> str:
    return os.path.join(_WORKDIR.value, f"blanks{horizon}", method, f"seed{config.run.seed}")


def evaluations(directory: str) -> tuple[dict, dict]:
    """The first and last evaluation records of a finished run."""
    evals = [r for r in metrics.read_metrics(os.path.join(directory, "metrics.jsonl"))
             if r["kind"] == "eval"]
    return evals[0], evals[-1]


def cell_row(horizon: int, method: str, directories: list[str]) -> dict:
    """One (horizon, method) row: pooled success before/after, per-seed finals, paired
    difference."""
    firsts, lasts = zip(*(evaluations(d) for d in directories))
    before = np.concatenate([r["episode_solved"] for r in firsts])
    after = np.concatenate([r["episode_solved"] for r in lasts])
    initial, initial_se = sources.mean_and_standard_error(before)
    final, final_se = sources.mean_and_standard_error(after)
    difference, difference_se = sources.mean_and_standard_error(after - before)
    return dict(horizon=horizon, method=method, seeds=len(directories),
                episodes=int(after.size), initial=initial, initial_se=initial_se,
                final=final, final_se=final_se, difference=difference,
                difference_se=difference_se,
                seed_finals=[float(r["success_rate"]) for r in lasts])


def table_markdown(rows: list[dict]) -> str:
    lines = ["| blanks | method | seeds | held-out success before | after | per-seed after "
             "| after − before (paired s.e.) |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        seeds = ", ".join(f"{s:.3f}" for s in r["seed_finals"])
        lines.append(f"| {r['horizon']} | {r['method']} | {r['seeds']} | "
                     f"{r['initial']:.3f} ± {r['initial_se']:.3f} | "
                     f"{r['final']:.3f} ± {r['final_se']:.3f} | {seeds} | "
                     f"{r['difference']:+.3f} ± {r['difference_se']:.3f} |")
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], path: str) -> None:
    figure, axes = pyplot.subplots(figsize=(5, 3.5))
    for method in METHODS:
        cells = [r for r in rows if r["method"] == method]
        if cells:
            axes.errorbar([r["horizon"] for r in cells], [r["final"] for r in cells],
                          [r["final_se"] for r in cells], marker="o", capsize=3, label=method)
    start = [r for r in rows if r["method"] == "es"]
    axes.errorbar([r["horizon"] for r in start], [r["initial"] for r in start],
                  [r["initial_se"] for r in start], linestyle="--", color="gray",
                  capsize=3, label="before training")
    axes.set_xticks(sorted({r["horizon"] for r in rows}))
    axes.set_xlabel("blanks (= turns)")
    axes.set_ylabel("held-out success rate")
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    pyplot.close(figure)


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    runs = grid_configs()
    start = time.monotonic()
    cells: dict[tuple[int, str], list[str]] = {}
    with contextlib.redirect_stdout(sys.stderr):
        shared = runs[0][2].model
        model = models.load(shared.name, dtype=shared.dtype)
        for index, (horizon, method, config) in enumerate(runs):
            directory = run_dir(horizon, method, config)
            logging.info("run %d/%d: %s", index + 1, len(runs), directory)
            training.train(config, directory, model=model)
            cells.setdefault((horizon, method), []).append(directory)
    rows = [cell_row(horizon, method, directories)
            for (horizon, method), directories in cells.items()]
    wall_s = time.monotonic() - start
    table = table_markdown(rows)
    os.makedirs(_WORKDIR.value, exist_ok=True)
    with open(os.path.join(_WORKDIR.value, "table.md"), "w", encoding="utf-8") as file:
        file.write(table)
    with open(os.path.join(_WORKDIR.value, "table.json"), "w", encoding="utf-8") as file:
        json.dump(dict(rows=rows, runs=len(runs), wall_s=wall_s), file, indent=2)
    plot(rows, os.path.join(_WORKDIR.value, "success.png"))
    print(table + f"\n{len(runs)} runs, wall time {wall_s:.0f} s", flush=True)


if __name__ == "__main__":
    launch.quiet_startup()
    app.run(main)
