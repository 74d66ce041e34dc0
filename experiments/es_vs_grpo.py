r"""ES vs GRPO on Sudoku at several horizons, budgets matched in episodes and in compute.

Every run is the trainer on one config (``--config`` and its dotted overrides set what the
runs share; default the main job's), run by ``experiments.grid`` (one model load,
finished runs reused, interrupted ones resumed, failures recorded) in
``<workdir>/blanks<h>/<method>/seed<k>``. A horizon h is a board with h blanks and h
turns (``--turns_per_blank=3``: 3·h, as the reference plays). Within a seed every method
plays the same puzzles with the same sampling keys. Methods:

* ``es``: the config's ES (cosine σ), for ``--es_generations`` generations (default
  GRPO's steps) evaluated every ``--es_eval_every``;
* ``grpo``: ``rule.name=grpo`` with ``rule.group_size`` = ``es.population_size`` and
  learning rate ``--grpo_learning_rate``, so both see the same episodes per generation
  (G × tasks_per_generation) for the same number of generations;
* ``es_constant``: ES with σ fixed at ``es.sigma_start`` (only at ``--sigma_horizon``);
* ``es_compute`` (with ``--compute_matched``): ES given GRPO's measured training time: as
  many generations as GRPO's steps take at that horizon, at ES's time per generation
  (each method's undisturbed step time, ``grid.step_time``: the least of its seeds' median
  steps; configured once both have finished).

Per (horizon, method) the table gives, over seeds, the held-out success before and
after, each seed's final, the mean change ± its s.e. across seeds, wall time and
estimated FLOPs per run; for ES rows the share of generations whose members' rewards
all tied (no update), for GRPO the share of zero advantages; and for ES rows ES − GRPO
final success with a 95% hierarchical bootstrap interval (resample seeds, then puzzles
within each seed, the same for both methods). Along the learning curves
(``experiments.curves``: held-out success at each evaluation against episodes, estimated
FLOPs and training seconds), ES rows compare with GRPO seed by seed at equal episodes,
FLOPs, seconds and probe units (the smaller whole run's total; probe units divide each
generation's seconds by its machine's probe time, for seeds whose runs both recorded it,
and the seconds row counts the seeds whose two runs ran on one machine): a seed-level
t-interval on the paired differences (``minus_grpo_seed_t95``, at equal FLOPs), the
bootstrap, the signs, areas under the curves and the budget to reach ``--threshold``. Written to ``table.md`` /
``table.json`` with plots ``success.png`` and ``curves.png`` in ``--results`` (default:
the workdir), and printed. ``--methods`` runs some of the fixed-budget methods, in its
order (a session that must finish a GRPO run starts with ``--methods=grpo``); the table
then covers those, and the whole grid's command with ``--table_only`` rebuilds it.

  python -m experiments.es_vs_grpo --horizons=2,4,6 --seeds=0,1,2 --compute_matched \
      --workdir=workdirs/es_vs_grpo --results=experiments/results/es_vs_grpo
"""

import math
import os

import numpy as np
from absl import app, flags

from agentic_esopt import training
from experiments import curves, grid, launch

METHODS = ("es", "grpo", "es_constant", "es_compute")

_CONFIG = launch.define_config("experiments/configs/cpu_default.py",
                               "Config shared by every run.")
_HORIZONS = flags.DEFINE_list("horizons", ["2", "4", "6"], "Blanks (= turns) per board.")
_METHODS = flags.DEFINE_list("methods", ["es", "es_constant", "grpo"], "The fixed-budget "
                             "methods to run, in this order (e.g. grpo first in a session: "
                             "a GRPO run cannot be parked); the table covers these.")
_SEEDS = flags.DEFINE_list("seeds", ["0", "1", "2"], "Run seeds.")
_TURNS_PER_BLANK = flags.DEFINE_float("turns_per_blank", 1.0, "Turns per blank, rounded up "
                                     "per board (the reference plays three).")
_SIGMA_HORIZON = flags.DEFINE_integer("sigma_horizon", 4, "Horizon of the cosine vs "
                                                          "constant σ comparison (0 = none).")
_GRPO_LEARNING_RATE = flags.DEFINE_float("grpo_learning_rate", None, "GRPO's learning rate "
                                         "(default: the rule's).")
_COMPUTE_MATCHED = flags.DEFINE_bool("compute_matched", False, "Add es_compute runs: ES "
                                     "with GRPO's measured wall time per run.")
_ES_GENERATIONS = flags.DEFINE_integer("es_generations", None, "Generations of the es and "
                                      "es_constant runs (default: run.generations, GRPO's "
                                      "steps); fixed in advance, e.g. from FLOPs per episode.")
_ES_EVAL_EVERY = flags.DEFINE_integer("es_eval_every", None, "Held-out evaluation period "
                                      "of the es runs (default: run.eval_every).")
_THRESHOLD = flags.DEFINE_float("threshold", 0.5, "Held-out success whose first crossing "
                                "the table reports in FLOPs (and episodes, seconds).")
_WORKDIR = flags.DEFINE_string("workdir", "workdirs/es_vs_grpo", "Folder of the runs.")
_RESULTS = flags.DEFINE_string("results", None, "Folder of the finished runs' result "
                                                "files, table and plot (default: workdir).")


def _ints(values: list[str], what: str) -> list[int]:
    try:
        return [int(v) for v in values]
    except ValueError as error:
        raise app.UsageError(f"{what} must be integers, got {values}") from error


def method_changes(method: str, shared: training.TrainConfig) -> dict:
    """The config sections a method changes."""
    if method == "grpo":
        rule = {"name": "grpo", "group_size": shared.es.population_size}
        if _GRPO_LEARNING_RATE.value is not None:
            rule["learning_rate"] = _GRPO_LEARNING_RATE.value
        return dict(rule=rule)
    run = {key: flag.value for key, flag in (("generations", _ES_GENERATIONS),
                                              ("eval_every", _ES_EVAL_EVERY))
           if flag.value is not None}
    if method == "es_constant":
        return dict(es={"sigma_schedule": "constant", "sigma_end": shared.es.sigma_start},
                    run=run)
    return dict(run=run)


def make_run(shared: training.TrainConfig, horizon: int, method: str, seed: int,
             **changes) -> grid.Run:
    method_sections = method_changes(method, shared)
    run = {**method_sections.pop("run", {}), **changes.pop("run", {}), "seed": seed}
    turns = math.ceil(_TURNS_PER_BLANK.value * horizon)
    config = shared.replace(env={"mask_count": horizon}, rollout={"max_turns": turns},
                            run=run, **method_sections, **changes)
    return grid.Run(os.path.join(f"blanks{horizon}", method), seed, config)


def grid_runs(shared: training.TrainConfig, methods: list[str], horizons: list[int],
              seeds: list[int]) -> list[grid.Run]:
    """Every run of ``methods`` (in that order; by default the cheap ES runs first, so a
    grid cut short still has whole ES cells) whose budget is fixed in advance, all checked
    before any compute."""
    runs, problems = [], []
    for method in methods:
        for horizon in horizons:
            if method == "es_constant" and horizon != _SIGMA_HORIZON.value:
                continue
            for seed in seeds:
                try:
                    runs.append(make_run(shared, horizon, method, seed))
                except ValueError as error:
                    problems.append(str(error))
    if problems:
        raise app.UsageError("invalid grid:\n" + "\n".join(sorted(set(problems))))
    return runs


def compute_matched_runs(shared, horizons, seeds, results: str) -> list[grid.Run]:
    """ES runs with as many generations as GRPO's training time per run buys at ES's time
    per generation (``grid.step_time`` of the finished es and grpo runs), per
    horizon; evaluations cost both methods the same and are left out."""
    runs = []
    for horizon in horizons:
        grpo_dirs, es_dirs = (
            [os.path.join(results, f"blanks{horizon}", method, f"seed{seed}")
             for seed in seeds] for method in ("grpo", "es"))
        if not all(grid.is_finished(d) for d in grpo_dirs + es_dirs):
            continue
        generations = max(shared.run.generations, grid.compute_matched_generations(
            grpo_dirs, es_dirs, shared.run.generations))
        runs += [make_run(shared, horizon, "es_compute", seed,
                          run={"generations": generations,
                               "eval_every": generations}) for seed in seeds]
    return runs


def zero_spread_share(directories: list[str], method: str) -> float:
    """ES: the share of generations whose members' rewards all tied; GRPO: the mean
    share of zero advantages."""
    records = [r for d in directories for r in grid.train_records(d)]
    if method == "grpo":
        return float(np.mean([r["zero_advantage_fraction"] for r in records]))
    return float(np.mean([r["reward_std"] == 0 for r in records]))


def tabulate(runs: list[grid.Run], outcomes: dict[str, str], results: str) -> list[dict]:
    """One row per (horizon, method) over its finished seeds."""
    cells = grid.finished_cells(runs, outcomes, results)
    rows = []
    for cell, directories in cells.items():
        horizon, method = int(cell.split(os.sep)[0][len("blanks"):]), cell.split(os.sep)[1]
        run_curves = [curves.curve(d) for d in directories]
        row = dict(horizon=horizon, method=method, **grid.cell_row(directories),
                   zero_spread_share=zero_spread_share(directories, method),
                   curve=curves.mean_curve(run_curves))
        if method != "grpo":
            grpo = cells.get(os.path.join(f"blanks{horizon}", "grpo"), [])
            difference = grid.paired_difference(directories, grpo)
            row["minus_grpo_ci95"] = difference and difference["ci95"]
            row.update(along_curves(directories, grpo))
        rows.append(row)
    return sorted(rows, key=lambda r: (r["horizon"], METHODS.index(r["method"])))


def along_curves(directories: list[str], grpo: list[str]) -> dict:
    """ES − GRPO along the learning curves of the seeds both finished, at equal episodes,
    FLOPs, seconds and probe units (``curves.compare``); ``minus_grpo_seed_t95`` is the
    seed-level interval at equal FLOPs; ``one_machine_seeds`` counts the seeds whose two
    runs ran on one machine (where equal seconds need no probe)."""
    pairs = [(d, g) for d in directories for g in grpo
             if os.path.basename(d) == os.path.basename(g)]
    if not pairs:
        return dict(minus_grpo_seed_t95=None, along_curves=None, one_machine_seeds=0)
    es_curves, grpo_curves = ([curves.curve(d) for d in side] for side in zip(*pairs))
    compared = {axis: curves.compare(es_curves, grpo_curves, axis, _THRESHOLD.value)
                for axis in curves.COMPARED}
    flops = compared["flops"]
    return dict(minus_grpo_seed_t95=flops and flops["t95"], along_curves=compared,
                one_machine_seeds=sum(curves.on_one_machine(d, g) for d, g in pairs))


def _interval(interval: list[float] | None) -> str:
    return "" if not interval else f"[{interval[0]:+.3f}, {interval[1]:+.3f}]"


def _budget_text(values: list[float | None], axis: str) -> str:
    if any(v is None for v in values):
        return f"{sum(v is not None for v in values)}/{len(values)} reached"
    return f"{np.mean(values):.0f}" if axis in ("seconds", "probe_units") else (
        f"{np.mean(values):.3g}")


def curves_markdown(rows: list[dict], threshold: float) -> str:
    """ES − GRPO at equal episodes, FLOPs and seconds, with areas under the curves and
    the budgets needed to reach ``threshold``."""
    lines = ["| blanks | method | budget | seeds | common budget (mean) | ES − GRPO (mean) | "
             "seed-level t 95% | bootstrap 95% | seeds better / tied / worse | "
             "bracket: GRPO, ES credited with its next evaluation | "
             "AUC ES vs GRPO | budget to reach the threshold ES vs GRPO |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        for axis, c in (r.get("along_curves") or {}).items():
            if c is None:
                continue
            signs = c["signs"]
            seeds = (f"{c['seeds']} ({r['one_machine_seeds']} on one machine)"
                     if axis == "seconds" else f"{c['seeds']}")
            lines.append(
                f"| {r['horizon']} | {r['method']} | {axis} | {seeds} | "
                f"{_budget_text(c['budget'], axis)} | {c['mean']:+.3f} | "
                f"{_interval(c['t95'])} | {_interval(c['bootstrap95'])} | "
                f"{signs['better']} / {signs['tied']} / {signs['worse']} | "
                f"{c['bracket']['baseline_credited']['mean']:+.3f} "
                f"{_interval(c['bracket']['baseline_credited']['t95'])}, "
                f"{c['bracket']['method_credited']['mean']:+.3f} | "
                f"{np.mean(c['auc']):.3f} vs {np.mean(c['baseline_auc']):.3f} | "
                f"{_budget_text(c['to_threshold'], axis)} vs "
                f"{_budget_text(c['baseline_to_threshold'], axis)} |")
    return ("\n".join(lines) + f"\n\nAlong the learning curves (threshold {threshold}): "
            "each seed's ES and GRPO runs compared at the smaller of their whole runs' "
            "totals, each at its last held-out evaluation within it; FLOPs are the estimates "
            "each run recorded (GRPO's count remat's recomputed forward pass in runs from "
            "2026-12-05 on), seconds the training generations' wall time (evaluations left "
            "out), probe units those seconds each divided by the probe time its machine "
            "recorded (training.machine; runs from 2026-12-07 on), over the seeds whose two "
            "runs both recorded it. The bracket reads GRPO at its first evaluation at or "
            "beyond the budget and ES at its last within it (mean, seed-level t 95%), then "
            "the reverse: where neither curve falls between evaluations the difference at "
            "the budget lies between the two.\n")


def table_markdown(rows: list[dict]) -> str:
    lines = ["| blanks | method | seeds | success before | after | per-seed after | "
             "after − before (s.e. across seeds) | per-seed change | ES − GRPO (95% CI) | "
             "tied / zero-advantage share | generation (s) | wall time / run (s) | FLOPs / run |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        interval = r.get("minus_grpo_ci95")
        interval = "" if not interval else f"[{interval[0]:+.3f}, {interval[1]:+.3f}]"
        flops = "" if r["flops"] is None else f"{r['flops']:.2e}"
        lines.append(f"| {r['horizon']} | {r['method']} | {r['seeds']} | "
                     f"{grid.mean_se(r, 'success_before')} | {grid.mean_se(r, 'success_after')} "
                     f"| {grid.seeds_text(r, 'success_after')} | "
                     f"{r['success_change']:+.3f} ± {r['success_change_se']:.3f} | "
                     f"{grid.seeds_text(r, 'success_change')} | {interval} | "
                     f"{r['zero_spread_share']:.2f} | {r['step_time_s']:.1f} | "
                     f"{r['wall_time_s']:.0f} ± {r['wall_time_s_se']:.0f} | {flops} |")
    return "\n".join(lines) + f"\n\n{grid.TABLE_NOTE}\n"


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    shared = launch.train_config(_CONFIG.value)
    if shared.env_name != "sudoku":
        raise app.UsageError(f"the grid plays Sudoku; --config is {shared.env_name!r}")
    if _TURNS_PER_BLANK.value <= 0:
        raise app.UsageError(f"--turns_per_blank must be > 0, got {_TURNS_PER_BLANK.value}")
    fixed_budget = _METHODS.default
    methods = _METHODS.value
    if not methods or set(methods) - set(fixed_budget) or len(set(methods)) < len(methods):
        raise app.UsageError(f"--methods must be some of {fixed_budget} (es_compute comes "
                             f"with --compute_matched), each once, got {methods}")
    horizons = _ints(_HORIZONS.value, "--horizons")
    seeds = _ints(_SEEDS.value, "--seeds")
    if _SIGMA_HORIZON.value and _SIGMA_HORIZON.value not in horizons:
        raise app.UsageError(f"--sigma_horizon={_SIGMA_HORIZON.value} is not among "
                             f"--horizons={horizons}")
    results = _RESULTS.value or _WORKDIR.value
    runs = grid_runs(shared, methods, horizons, seeds)
    outcomes = grid.run_as_flagged(runs, _WORKDIR.value, results)
    if _COMPUTE_MATCHED.value:
        matched = compute_matched_runs(shared, horizons, seeds, results)
        outcomes.update(grid.run_as_flagged(matched, _WORKDIR.value, results))
        runs += matched
    rows = tabulate(runs, outcomes, results)
    table = table_markdown(rows) + "\n" + curves_markdown(rows, _THRESHOLD.value)
    failures = {name: outcome for name, outcome in outcomes.items() if grid.failed(outcome)}
    not_run = sum(outcome == grid.NOT_RUN for outcome in outcomes.values())
    grid.write_table(results, rows, table, runs=len(runs), failures=failures)
    if rows:
        grid.plot_cells(rows, [f"{r['horizon']} {r['method']}" for r in rows],
                        os.path.join(results, "success.png"), "ES vs GRPO")
        curves.plot(rows, os.path.join(results, "curves.png"),
                    "ES vs GRPO: held-out success along the runs")
    print(table + f"\n{len(runs)} runs, {len(failures)} failed, {not_run} not run",
          flush=True)


if __name__ == "__main__":
    launch.run(main)
