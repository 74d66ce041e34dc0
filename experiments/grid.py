"""Grids of training runs: run them (one model load, finished runs and the untrained
model's evaluation reused, interrupted runs resumed, failures recorded), then tabulate
them across seeds.

A grid is a list of ``Run``s, each a named cell (e.g. a point of a sweep, or a horizon
and a method), a seed and a checked ``TrainConfig``, run by the trainer in
``<workdir>/<cell>/seed<k>``. A finished run's small result files (``RESULT_FILES``:
config, summary, metrics, history; kilobytes, no checkpoints) are copied to
``<results>/<cell>/seed<k>``; a run whose result files are there already counts as
finished, so a grid continues from committed results on a fresh machine and its tables
are rebuilt from them. An unfinished ES run continues there too once parked
(``park``): its history and metrics go to its results folder, and the next ``run_all``
anywhere seeds its run folder with them, so the trainer replays the history (bitwise,
no rollouts) and goes on from the generation it had reached.

Across seeds, a cell's row gives each seed's value, their mean and the s.e. across seeds
(std with ddof=1 over √seeds): held-out success and mean reward before and after, the
change, and wall time per run. Two methods evaluated on the same puzzles compare by a
hierarchical bootstrap (``bootstrap_difference``). Sweep grids are parsed here too
(``grid_points``: ``'section.option=v1,v2;...'``, grids joined by ``|``).
"""

from __future__ import annotations

import ast
import contextlib
import itertools
import json
import math
import os
import shutil
import sys
import textwrap
import traceback
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import matplotlib
import numpy as np
from absl import flags, logging

from agentic_esopt import models, training
from agentic_esopt.agents import sources
from agentic_esopt.training import config as config_lib, metrics

matplotlib.use("Agg")
from matplotlib import pyplot  # pylint: disable=wrong-import-position

HISTORY = "history.jsonl"
RESULT_FILES = ("config.json", "summary.json", "metrics.jsonl", HISTORY)
FAILURE_FILE = "failure.txt"
NOT_RUN = "not run"  # The outcome of an unfinished run under --table_only.

TABLE_ONLY = flags.DEFINE_bool("table_only", False, "Tabulate the finished runs' result "
                               "files and run nothing (e.g. a grid's committed results).")
PARK = flags.DEFINE_bool("park", False, "Run nothing; copy each unfinished ES run's history "
                         "and metrics from the workdir to its results folder (kilobytes, to "
                         "commit), so that a fresh machine resumes it by replaying the "
                         "history instead of starting it again. Stop the grid first.")


class Run(NamedTuple):
    """One run of a grid: its cell's name (a path component), seed and config."""

    cell: str
    seed: int
    config: training.TrainConfig

    @property
    def name(self) -> str:
        return os.path.join(self.cell, f"seed{self.seed}")


def is_finished(directory: str) -> bool:
    """Whether ``directory`` holds a finished run's result files."""
    return all(os.path.isfile(os.path.join(directory, name))
               for name in ("config.json", "summary.json", "metrics.jsonl"))


def copy_results(source: str, target: str) -> None:
    """Copies a run's small result files (``RESULT_FILES``) from ``source`` to ``target``
    (nothing to do when they are one folder)."""
    if os.path.abspath(source) == os.path.abspath(target):
        return
    os.makedirs(target, exist_ok=True)
    for name in RESULT_FILES:
        if os.path.isfile(os.path.join(source, name)):
            shutil.copy2(os.path.join(source, name), os.path.join(target, name))


def park(runs: Sequence[Run], workdir: str, results: str) -> list[str]:
    """Copies each unfinished run's history, metrics and config from ``workdir`` to
    ``results`` (runs without a history, like GRPO's, cannot be replayed and stay);
    returns the names of the runs parked."""
    parked = []
    for run in runs:
        run_dir, result_dir = os.path.join(workdir, run.name), os.path.join(results, run.name)
        if not is_finished(result_dir) and os.path.isfile(os.path.join(run_dir, HISTORY)):
            copy_results(run_dir, result_dir)
            parked.append(run.name)
    return parked


def unpark(result_dir: str, run_dir: str) -> None:
    """Seeds a run folder without a history from a parked run's files."""
    if (os.path.isfile(os.path.join(result_dir, HISTORY))
            and not os.path.isfile(os.path.join(run_dir, HISTORY))):
        logging.info("resuming %s from the run parked in %s", run_dir, result_dir)
        copy_results(result_dir, run_dir)


def remember_base_evaluation(base_evaluations: dict[str, dict], name: str,
                             config: training.TrainConfig, results: str) -> None:
    """Keeps finished run ``name``'s generation-0 evaluation for the later runs of its
    ``base_evaluation_fingerprint`` (the first such run's, marked ``reused_from``)."""
    first = evaluations(os.path.join(results, name))[0]
    if first["generation"] == 0:
        base_evaluations.setdefault(config_lib.base_evaluation_fingerprint(config),
                                    {"reused_from": name, **first})


def finished_runs(results: str) -> list[tuple[str, training.TrainConfig]]:
    """Every finished run under ``results``, at any depth and in any grid, as (its path
    relative to ``results``, its config); a run whose config this code no longer reads
    is left out."""
    found = []
    for directory, subdirectories, _ in os.walk(results):
        subdirectories.sort()
        if not is_finished(directory):
            continue
        subdirectories.clear()
        with open(os.path.join(directory, "config.json"), encoding="utf-8") as f:
            values = json.load(f)
        try:
            config = training.TrainConfig.from_dict(values)
        except ValueError as error:
            logging.info("not sharing %s's evaluation: %s", directory, error)
            continue
        found.append((os.path.relpath(directory, results), config))
    return found


def failed(outcome: str) -> bool:
    """Whether a ``run_all`` outcome is a failure (not "ok", not ``NOT_RUN``)."""
    return outcome not in ("ok", NOT_RUN)


def run_all(runs: Sequence[Run], workdir: str, results: str,
            train: Callable[..., Any] = training.train,
            run_missing: bool = True,
            describe_machine: Callable[[], dict] = training.machine.describe
            ) -> dict[str, str]:
    """Runs every run not finished yet (none when not ``run_missing``); returns each run's
    outcome.

    Before each run it trains, the grid describes the machine (``describe_machine``:
    which one, how fast it is now) and the run records that in each generation's metrics
    line, so runs' wall times taken on different machines can be told apart and compared.

    Runs share one loaded model per distinct ``model`` section, and the untrained model's
    evaluation: a run whose ``base_evaluation_fingerprint`` a finished run under
    ``results`` has (tuning points of one seed; ES and GRPO of one seed and horizon),
    whether or not that run is in ``runs``, logs that run's generation-0 evaluation
    instead of repeating it. A parked run (``park``) resumes
    from its parked files. A run that raises is
    recorded in ``<results>/<run>/failure.txt`` (its traceback) and the others go on;
    rerunning the grid retries it.

    Returns:
      run name -> "ok", ``NOT_RUN`` or the failure's one-line description.
    """
    outcomes, loaded = {}, {}
    base_evaluations = {}  # fingerprint -> a finished run's generation-0 eval record
    for name, config in finished_runs(results):
        remember_base_evaluation(base_evaluations, name, config, results)
    with contextlib.redirect_stdout(sys.stderr):
        for index, run in enumerate(runs):
            result_dir = os.path.join(results, run.name)
            if is_finished(result_dir):
                outcomes[run.name] = "ok"
                continue
            if not run_missing:
                outcomes[run.name] = NOT_RUN
                continue
            run_dir = os.path.join(workdir, run.name)
            logging.info("run %d/%d: %s", index + 1, len(runs), run_dir)
            try:
                key = (run.config.model.name, run.config.model.dtype)
                if key not in loaded:
                    loaded.clear()  # one model in memory at a time
                    loaded[key] = models.load(*key)
                unpark(result_dir, run_dir)
                fingerprint = config_lib.base_evaluation_fingerprint(run.config)
                train(run.config, run_dir, model=loaded[key],
                      base_evaluation=base_evaluations.get(fingerprint),
                      machine=describe_machine())
                copy_results(run_dir, result_dir)
                remember_base_evaluation(base_evaluations, run.name, run.config, results)
                failure = os.path.join(result_dir, FAILURE_FILE)
                if os.path.exists(failure):
                    os.remove(failure)
                outcomes[run.name] = "ok"
            except Exception as error:  # pylint: disable=broad-except
                logging.error("run %s failed: %s", run.name, error)
                os.makedirs(result_dir, exist_ok=True)
                with open(os.path.join(result_dir, FAILURE_FILE), "w", encoding="utf-8") as f:
                    f.write(traceback.format_exc())
                outcomes[run.name] = f"{type(error).__name__}: {error}".splitlines()[0]
    return outcomes


def run_as_flagged(runs: Sequence[Run], workdir: str, results: str) -> dict[str, str]:
    """``run_all``, or with --table_only nothing run, or with --park the unfinished runs
    parked (``park``) and nothing run."""
    if PARK.value:
        parked = park(runs, workdir, results)
        logging.info("parked %d unfinished runs in %s: %s", len(parked), results, parked)
    return run_all(runs, workdir, results, run_missing=not (TABLE_ONLY.value or PARK.value))


def evaluations(directory: str) -> tuple[dict, dict]:
    """The first and last held-out evaluation records of a finished run."""
    evals = [r for r in metrics.read_metrics(os.path.join(directory, "metrics.jsonl"))
             if r["kind"] == "eval"]
    return evals[0], evals[-1]


def train_records(directory: str) -> list[dict]:
    """A finished run's per-generation training records."""
    return [r for r in metrics.read_metrics(os.path.join(directory, "metrics.jsonl"))
            if r["kind"] == "train"]


def final_solved(directory: str) -> tuple[list[str], np.ndarray]:
    """(task ids, solved per episode) of a run's last evaluation."""
    last = evaluations(directory)[1]
    return last["episode_task_ids"], np.asarray(last["episode_solved"], np.float64)


def paired_difference(directories: Sequence[str], baseline: Sequence[str]
                      ) -> dict[str, Any] | None:
    """Final held-out success of ``directories``' runs − ``baseline``'s over the seeds both
    finished: ``mean`` (mean over those seeds) and ``ci95`` (``bootstrap_difference``);
    None when no seed is shared or a seed's puzzles differ."""
    pairs = [(d, b) for d in directories for b in baseline
             if os.path.basename(d) == os.path.basename(b)]
    if not pairs:
        return None
    runs, baseline_runs = zip(*((final_solved(d), final_solved(b)) for d, b in pairs))
    if any(r[0] != b[0] for r, b in zip(runs, baseline_runs)):
        return None
    solved, baseline_solved = [r[1] for r in runs], [b[1] for b in baseline_runs]
    mean = float(np.mean([r.mean() - b.mean() for r, b in zip(solved, baseline_solved)]))
    return dict(mean=mean, ci95=list(bootstrap_difference(solved, baseline_solved)))


def run_values(directory: str) -> dict[str, float]:
    """One run's numbers: held-out success and mean reward before and after, its wall
    time (the trainer's, evaluations included), for an ES run its mean update norm over
    generations and, for a run whose rollouts were timed, their environment steps per
    second and the model's share of their time."""
    first, last = evaluations(directory)
    with open(os.path.join(directory, "summary.json"), encoding="utf-8") as f:
        summary = json.load(f)
    rollouts = summary.get("rollouts") or {}
    norms = [r["update_norm"] for r in train_records(directory) if "update_norm" in r]
    return dict(success_before=first["success_rate"], success_after=last["success_rate"],
                reward_before=first["mean_reward"], reward_after=last["mean_reward"],
                success_change=last["success_rate"] - first["success_rate"],
                reward_change=last["mean_reward"] - first["mean_reward"],
                wall_time_s=summary["wall_time_s"],
                **(dict(update_norm=float(np.mean(norms))) if norms else {}),
                **{k: rollouts[k] for k in ("steps_per_s", "policy_share")
                   if rollouts.get(k) is not None})


def across_seeds(values: Sequence[float]) -> tuple[float, float]:
    """Mean over seeds and the s.e. across seeds (0 for one seed)."""
    return sources.mean_and_standard_error(values)


def run_flops(directory: str) -> float | None:
    """A run's estimated training FLOPs (the sum of its records' ``flops``), None for a
    run recorded before they were."""
    records = train_records(directory)
    if not records or "flops" not in records[0]:
        return None
    return float(sum(r["flops"] for r in records))


def cell_row(directories: Sequence[str]) -> dict[str, Any]:
    """A cell's row over its seeds' finished runs: for each quantity of ``run_values``,
    ``<name>`` (mean over seeds), ``<name>_se`` (s.e. across seeds) and ``<name>_seeds``
    (each seed's value; a quantity only when every run has it); ``seed_finals`` is each
    seed's final held-out success;
    ``step_time_s`` the undisturbed time of a generation (``step_time``) and ``flops`` the
    mean estimated training FLOPs per run (None if a run has none)."""
    per_run = [run_values(d) for d in directories]
    row: dict[str, Any] = dict(seeds=len(per_run))
    for name in (n for n in per_run[0] if all(n in v for v in per_run)):
        seeds = [v[name] for v in per_run]
        row[name], row[f"{name}_se"] = across_seeds(seeds)
        row[f"{name}_seeds"] = seeds
    row["seed_finals"] = row["success_after_seeds"]
    row["step_time_s"] = step_time(directories)
    flops = [run_flops(d) for d in directories]
    row["flops"] = None if None in flops else float(np.mean(flops))
    return row


def finished_cells(runs: Sequence[Run], outcomes: dict[str, str],
                   results: str) -> dict[str, list[str]]:
    """Each cell's finished runs' result folders, cells in the runs' order."""
    cells: dict[str, list[str]] = {}
    for run in runs:
        if outcomes[run.name] == "ok":
            cells.setdefault(run.cell, []).append(os.path.join(results, run.name))
    return cells


TABLE_NOTE = ("mean ± s.e. across seeds; update norm: each ES run's mean over generations "
              "of its step's norm; generation: the least of the seeds' median "
              "generation (or step) times, so time beside other jobs does not count.")


def mean_se(row: dict, name: str, digits: int = 3) -> str:
    """"mean ± s.e." of a row's quantity."""
    return f"{row[name]:.{digits}f} ± {row[f'{name}_se']:.{digits}f}"


def seeds_text(row: dict, name: str) -> str:
    return ", ".join(f"{v:.3f}" for v in row[f"{name}_seeds"])


def step_time(directories: Sequence[str]) -> float:
    """The wall time of one training generation (or step) of these runs when nothing
    else slowed them: each run's median step (robust to a spell when another job shared
    the machine), then the least of those (a run that shared it throughout)."""
    return min(float(np.median([r["wall_time_s"] for r in train_records(d)]))
               for d in directories)


def compute_matched_generations(directories: Sequence[str], other: Sequence[str],
                                steps: int) -> int:
    """How many generations at ``other``'s time per generation ``steps`` of
    ``directories``' runs take (``step_time``; evaluations are left out)."""
    return math.floor(steps * step_time(directories) / step_time(other))


def write_table(workdir: str, rows: list[dict], markdown: str, **extra: Any) -> None:
    """``<workdir>/table.json`` (``{"rows": rows, **extra}``) and ``table.md``."""
    os.makedirs(workdir, exist_ok=True)
    with open(os.path.join(workdir, "table.md"), "w", encoding="utf-8") as f:
        f.write(markdown)
    with open(os.path.join(workdir, "table.json"), "w", encoding="utf-8") as f:
        json.dump(dict(rows=rows, **extra), f, indent=2)


def plot_cells(rows: list[dict], labels: list[str], path: str, title: str) -> None:
    """Final held-out success per cell: mean ± s.e. across seeds, each seed a dot, and
    the mean before training as a tick."""
    figure, axes = pyplot.subplots(figsize=(max(4.0, 0.9 * len(rows) + 2), 3.6))
    positions = np.arange(len(rows))
    axes.errorbar(positions, [r["success_after"] for r in rows],
                  [r["success_after_se"] for r in rows], fmt="o", capsize=4,
                  label="after (mean ± s.e. across seeds)")
    for position, row in zip(positions, rows):
        seeds = row["success_after_seeds"]
        axes.scatter(np.full(len(seeds), position + 0.12), seeds, s=10, color="gray")
    axes.scatter(positions, [r["success_before"] for r in rows], marker="_", s=200,
                 color="black", label="before")
    axes.set_xticks(positions, labels, rotation=30, ha="right", fontsize=8)
    axes.set_ylabel("held-out success rate")
    axes.set_title(title, fontsize=9)
    axes.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    pyplot.close(figure)


def plot_curves(cells: dict[str, list[str]], path: str, title: str) -> None:
    """Training reward (the population's mean, averaged over seeds) per cell, against
    the generation and against the training seconds (each seed's cumulative step times,
    averaged): quality per generation and per second side by side."""
    figure, (by_step, by_time) = pyplot.subplots(1, 2, figsize=(13, 3.8), sharey=True)
    for index, (label, directories) in enumerate(cells.items()):
        runs = [train_records(d) for d in directories]
        steps = min(len(records) for records in runs)
        reward = np.mean([[r["reward_mean"] for r in records[:steps]] for records in runs],
                         axis=0)
        seconds = np.mean([np.cumsum([r["wall_time_s"] for r in records[:steps]])
                           for records in runs], axis=0)
        style = dict(marker=".", label=label, color=pyplot.cm.tab10(index % 10),
                     linestyle=("-", "--", ":")[index // 10 % 3])
        by_step.plot(np.arange(1, steps + 1), reward, **style)
        by_time.plot(seconds, reward, **style)
    by_step.set_xlabel("generation")
    by_time.set_xlabel("training seconds (mean over seeds)")
    by_step.set_ylabel("training reward (population mean)")
    figure.legend(*by_step.get_legend_handles_labels(), loc="center right", fontsize=7,
                  handlelength=3.5)
    figure.suptitle(textwrap.fill(title, 160), fontsize=8)
    figure.tight_layout(rect=(0, 0, 0.75, 1))
    figure.savefig(path, dpi=120)
    pyplot.close(figure)


def _value(text: str):
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def parse_grid(text: str) -> list[tuple[tuple[str, ...], list[tuple]]]:
    """The axes of ``'a.b=1,2;c.d+e.f=x+3,y+4'``: ``[(keys, value tuples), ...]``.

    ``;`` separates axes and ``,`` an axis's values; an axis of several keys joined by
    ``+`` moves them together (each value then holds one part per key, joined by ``+``),
    e.g. ``es.population_size+rollout.tasks_per_generation=8+4,16+2`` keeps G × tasks
    fixed. ValueError if malformed.
    """
    axes = []
    for axis in filter(None, (a.strip() for a in text.split(";"))):
        key_text, equals, values = axis.partition("=")
        keys = tuple(k.strip() for k in key_text.split("+"))
        if not equals or not values or any(k.count(".") != 1 for k in keys):
            raise ValueError(f"--grid axis {axis!r} is not 'section.option=v1,v2,...'")
        if "run.seed" in keys:
            raise ValueError("seeds are --seeds, not a grid axis")
        parts = [tuple(_value(p.strip()) for p in v.split("+")) for v in values.split(",")]
        if any(len(part) != len(keys) for part in parts):
            raise ValueError(f"--grid axis {axis!r}: each value needs {len(keys)} parts "
                             "joined by '+'")
        axes.append((keys, parts))
    keys = [key for axis_keys, _ in axes for key in axis_keys]
    if len(set(keys)) != len(keys):
        raise ValueError(f"--grid names an option twice: {keys}")
    return axes


def points(axes: list[tuple[tuple[str, ...], list[tuple]]]) -> list[dict]:
    """Every combination of the axes' values, as {key: value}."""
    return [{key: value for (keys, _), part in zip(axes, combination)
             for key, value in zip(keys, part)}
            for combination in itertools.product(*(parts for _, parts in axes))]


def grid_points(text: str) -> list[dict]:
    """The points of a ``--grid``: ``|`` joins grids (each ``parse_grid``'s product) into
    one list, in order, without repeats; an empty grid is the shared config's own point
    ``{}``. E.g. ``'|es.rank=4|es.noise=full'``: the base and two one-factor changes (an
    ablation), ``{}``, ``{"es.rank": 4}``, ``{"es.noise": "full"}``. ValueError if malformed.
    """
    unique: dict[str, dict] = {}
    for part in text.split("|"):
        for point in points(parse_grid(part)):
            unique.setdefault(cell_name(point), point)
    return list(unique.values())


def cell_name(point: dict) -> str:
    """A point's folder name, e.g. ``es.noise=full+es.population_size=8``."""
    if not point:
        return "base"
    return "+".join(f"{key}={value}" for key, value in point.items()).replace("/", "_")


def configure(shared: training.TrainConfig, point: dict, seed: int) -> training.TrainConfig:
    """``shared`` with a point's overrides and the seed."""
    sections: dict[str, dict] = {"run": {"seed": seed}}
    for key, value in point.items():
        section, option = key.split(".")
        sections.setdefault(section, {})[option] = value
    return shared.replace(**sections)


def bootstrap_difference(first: list[np.ndarray], second: list[np.ndarray],
                         samples: int = 2000, seed: int = 0
                         ) -> tuple[float, float]:
    """95% interval of mean(first) − mean(second) by a hierarchical bootstrap: resample
    seeds, then episodes within each seed, the same indices for both (paired puzzles).

    Args:
      first, second: per seed, per-episode outcomes on the same puzzles in the same order.
    """
    rng = np.random.default_rng(seed)
    differences = np.asarray(first) - np.asarray(second)  # (seeds, episodes)
    num_seeds, num_episodes = differences.shape
    seeds = rng.integers(0, num_seeds, (samples, num_seeds))
    episodes = rng.integers(0, num_episodes, (samples, num_seeds, num_episodes))
    means = differences[seeds[..., None], episodes].mean(axis=(1, 2))
    low, high = np.percentile(means, [2.5, 97.5])
    return float(low), float(high)
