r"""A sweep: the product of a grid's values × seeds, each point a training run.

  python -m experiments.sweep --config=experiments/configs/cpu_default.py \
      --grid='es.noise=full,lowrank;es.population_size=8,16,32' --seeds=0,1,2 \
      --workdir=workdirs/sweep [--results=experiments/results/sweep]

``--grid`` lists axes separated by ``;``, each ``section.option=v1,v2,...`` (values as
Python literals, else strings), or several options moving together,
``es.population_size+rollout.tasks_per_generation=8+4,16+2`` (equal episodes). ``|`` joins
grids into one list of points, an empty grid being the shared config itself:
``--grid='|es.rank=4|es.antithetic=false'`` is an ablation, the base and one change at a
time, each run once. ``--config`` and its dotted overrides set what every run shares.

Every run is checked before any compute, then run by ``experiments.grid``: one model
load, finished runs reused (also from ``--results``, e.g. committed result files),
interrupted runs resumed, a failed run recorded without stopping the others. The table
(``table.md``, ``table.json``) and plot (``success.png``) go to ``--results`` (default:
the workdir): per grid point, held-out success and mean reward before and after, each
seed's value, the mean over seeds ± the s.e. across seeds, wall time per run, and each
later point's final success minus the first point's (the ablation's base) with a 95%
hierarchical bootstrap interval.
"""

import os

from absl import app, flags

from agentic_esopt import training
from experiments import grid, launch

_CONFIG = launch.define_config("experiments/configs/cpu_default.py",
                               "Config shared by every run.")
_GRID = flags.DEFINE_string("grid", "", "Axes 'section.option=v1,v2;section.option=...' "
                                        "(empty: the config alone); '|' joins grids.")
_SEEDS = flags.DEFINE_list("seeds", ["0", "1", "2"], "Run seeds.")
_WORKDIR = flags.DEFINE_string("workdir", "workdirs/sweep", "Folder of the runs.")
_RESULTS = flags.DEFINE_string("results", None, "Folder of the finished runs' result "
                                                "files, table and plot (default: workdir).")


def grid_runs(shared: training.TrainConfig, grid_points: list[dict], seeds: list[int]
              ) -> list[grid.Run]:
    """Every run of the grid's points, all checked (UsageError listing every problem)."""
    runs, problems = [], []
    for point in grid_points:
        for seed in seeds:
            try:
                runs.append(grid.Run(grid.cell_name(point), seed,
                                     grid.configure(shared, point, seed)))
            except ValueError as error:
                problems.append(f"{grid.cell_name(point)}: {error}")
    if problems:
        raise app.UsageError("invalid grid:\n" + "\n".join(sorted(set(problems))))
    return runs


def difference_text(difference: dict | None) -> str:
    """"+0.031 [−0.047, +0.109]": a ``grid.paired_difference``, empty for None."""
    if not difference:
        return ""
    low, high = difference["ci95"]
    return f"{difference['mean']:+.3f} [{low:+.3f}, {high:+.3f}]"


def table_markdown(rows: list[dict]) -> str:
    first = rows[0]["cell"]
    lines = ["| point | seeds | success before | after | per-seed after | after − before "
             f"| after − {first}'s (95% CI) | mean reward before | after | update norm "
             "| generation (s) | wall time / run (s) | FLOPs / run |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if not r["seeds"]:
            status = f"failed: {'; '.join(r['failures'])}" if r["failures"] else "not run"
            lines.append(f"| {r['cell']} | 0 | {status} |" + " |" * 10)
            continue
        flops = "" if r["flops"] is None else f"{r['flops']:.2e}"
        norm = grid.mean_se(r, "update_norm", 2) if "update_norm" in r else ""
        lines.append(f"| {r['cell']} | {r['seeds']} | {grid.mean_se(r, 'success_before')} | "
                     f"{grid.mean_se(r, 'success_after')} | "
                     f"{grid.seeds_text(r, 'success_after')} | "
                     f"{r['success_change']:+.3f} ± {r['success_change_se']:.3f} | "
                     f"{difference_text(r.get('minus_first'))} | "
                     f"{grid.mean_se(r, 'reward_before')} | {grid.mean_se(r, 'reward_after')} | "
                     f"{norm} | {r['step_time_s']:.1f} | {r['wall_time_s']:.0f} | {flops} |")
    timed = [f"{r['cell']}: {grid.mean_se(r, 'steps_per_s', 2)} environment steps/s, "
             f"{grid.mean_se(r, 'policy_share', 2)} of the time in the model's calls"
             for r in rows if "steps_per_s" in r]
    rollouts = ["", "Training rollouts (mean ± s.e. across seeds): " + "; ".join(timed) + "."]
    return "\n".join(lines + (rollouts if timed else [])) + f"\n\n{grid.TABLE_NOTE}\n"


def tabulate(grid_points: list[dict], runs: list[grid.Run], outcomes: dict[str, str],
             cells: dict[str, list[str]]) -> list[dict]:
    """One row per grid point over its finished seeds (``cells``; failed seeds listed);
    every point after the first gets ``minus_first`` (``grid.paired_difference`` against
    the first point, the base of an ablation)."""
    rows = []
    first = cells.get(grid.cell_name(grid_points[0]), [])
    for index, point in enumerate(grid_points):
        cell = grid.cell_name(point)
        failures = [f"seed {r.seed}: {outcomes[r.name]}" for r in runs
                    if r.cell == cell and grid.failed(outcomes[r.name])]
        row = grid.cell_row(cells[cell]) if cell in cells else dict(seeds=0, seed_finals=[])
        if index and cell in cells:
            row["minus_first"] = grid.paired_difference(cells[cell], first)
        rows.append(dict(point=point, cell=cell, failures=failures, **row))
    return rows


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    shared = launch.train_config(_CONFIG.value)
    try:
        seeds = [int(s) for s in _SEEDS.value]
    except ValueError as error:
        raise app.UsageError(f"--seeds must be integers, got {_SEEDS.value}") from error
    try:
        grid_points = grid.grid_points(_GRID.value)
    except ValueError as error:
        raise app.UsageError(str(error)) from error
    runs = grid_runs(shared, grid_points, seeds)
    results = _RESULTS.value or _WORKDIR.value
    outcomes = grid.run_as_flagged(runs, _WORKDIR.value, results)
    cells = grid.finished_cells(runs, outcomes, results)
    rows = tabulate(grid_points, runs, outcomes, cells)
    table = table_markdown(rows)
    grid.write_table(results, rows, table, grid=_GRID.value, seeds=seeds)
    plotted = [r for r in rows if r["seeds"]]
    if plotted:
        title = _GRID.value or "sweep"
        grid.plot_cells(plotted, [r["cell"] for r in plotted],
                        os.path.join(results, "success.png"), title)
        grid.plot_curves(cells, os.path.join(results, "curves.png"), title)
    print(table, flush=True)


if __name__ == "__main__":
    launch.run(main)
