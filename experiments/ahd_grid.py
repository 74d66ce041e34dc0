r"""A grid of AHD runs (methods x tasks x sizes x seeds) and the matched-baseline table.

Every run goes in-process through `coevolution.run` with one loaded model, in
``<workdir>/<task>_<size>/<method>/seed<k>``; finished runs with the same settings are
reused and interrupted ones resume. Then, for each (task, size) and base method, the
table compares method+ES with the method (mean ± std over seeds of the best heuristic's
evaluation objective, and win/tie/loss per seed in the task's direction). It is printed
and written to ``<workdir>/table.md`` and ``<workdir>/table.json``.

  python -m experiments.ahd_grid --tasks=tsp_constructive:20,kp_constructive:50 \
      --methods=sample,sample_es,eoh,eoh_es --seeds=0,1 --budget=8 \
      --max_new_tokens=192 --workdir=workdirs/ahd_grid
"""

import contextlib
import json
import os
import sys
import time

from absl import app, flags, logging

from agentic_esopt import models
from agentic_esopt.agents import coevolution

GRID_FIELDS = ("task", "size", "method", "seed")

for _name, _type, _default, _help in coevolution.field_specs():
    if _name not in GRID_FIELDS:
        {bool: flags.DEFINE_boolean, int: flags.DEFINE_integer, float: flags.DEFINE_float,
         str: flags.DEFINE_string}[_type](_name, _default, _help)
flags.DEFINE_list("tasks", ["tsp_constructive", "kp_constructive"],
                  "Tasks, each 'name' or 'name:size' (a size here overrides --sizes).")
flags.DEFINE_list("sizes", [], "Problem sizes for tasks given without one (default: each "
                               "task's training size).")
flags.DEFINE_list("methods", list(coevolution.METHODS), "Methods to run.")
flags.DEFINE_list("seeds", ["0", "1"], "Run seeds.")
flags.DEFINE_string("workdir", "workdirs/ahd_grid", "Grid directory (one folder per run).")
FLAGS = flags.FLAGS


def _as_int(text: str, what: str) -> int:
    try:
        return int(text)
    except ValueError as error:
        raise app.UsageError(f"{what} must be an integer, got {text!r}") from error


def task_sizes() -> list[tuple[str, int | None]]:
    """(task, size) pairs from --tasks and --sizes."""
    sizes = [_as_int(s, "--sizes entries") for s in FLAGS.sizes] or [None]
    pairs = []
    for entry in FLAGS.tasks:
        name, _, size = entry.partition(":")
        pairs += ([(name, _as_int(size, f"the size in {entry!r}"))] if size
                  else [(name, s) for s in sizes])
    return pairs


def grid_configs() -> list[coevolution.AHDConfig]:
    """Every run's config, all checked before any compute."""
    shared = {name: FLAGS[name].value for name, *_ in coevolution.field_specs()
              if name not in GRID_FIELDS}
    configs = [coevolution.AHDConfig(task=task, size=size, method=method,
                                     seed=_as_int(seed, "--seeds entries"), **shared)
               for task, size in task_sizes() for method in FLAGS.methods
               for seed in FLAGS.seeds]
    found = sorted({p for config in configs for p in coevolution.problems(config)})
    if not configs or found:
        raise app.UsageError("invalid grid:\n  " + "\n  ".join(found or ["no runs"]))
    return configs


def run_dir(config: coevolution.AHDConfig) -> str:
    return os.path.join(FLAGS.workdir, f"{config.task}_{config.problem_size()}",
                        config.method, f"seed{config.seed}")


def finished_summary(directory: str, config: coevolution.AHDConfig) -> dict | None:
    """The summary of a finished run in `directory` with exactly `config`, else None."""
    paths = [os.path.join(directory, name)
             for name in (coevolution.RUN_FILE, coevolution.SUMMARY_FILE)]
    if not all(os.path.exists(path) for path in paths):
        return None
    with open(paths[0], encoding="utf-8") as run_file, \
            open(paths[1], encoding="utf-8") as summary_file:
        saved, summary = json.load(run_file), json.load(summary_file)
    return summary if saved == config.to_dict() else None


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    configs = grid_configs()
    start = time.monotonic()
    with contextlib.redirect_stdout(sys.stderr):
        model = models.load(FLAGS.model, dtype=FLAGS.dtype)
        summaries = []
        for index, config in enumerate(configs):
            directory = run_dir(config)
            summary = finished_summary(directory, config)
            if summary is None:
                logging.info("run %d/%d: %s", index + 1, len(configs), directory)
                summary = coevolution.run(config, directory, model)
            summaries.append(summary)
    rows = coevolution.matched_table(summaries)
    table = coevolution.table_markdown(rows)
    wall_s = time.monotonic() - start
    os.makedirs(FLAGS.workdir, exist_ok=True)
    with open(os.path.join(FLAGS.workdir, "table.md"), "w", encoding="utf-8") as file:
        file.write(table)
    with open(os.path.join(FLAGS.workdir, "table.json"), "w", encoding="utf-8") as file:
        json.dump(dict(rows=rows, runs=summaries, wall_s=wall_s), file, indent=2)
    print(table + f"\n{len(configs)} runs, wall time {wall_s:.0f} s", flush=True)


if __name__ == "__main__":
    app.run(main)
