"""AHD as a registered task source: a heuristic-design task, its sandboxed evaluator on
the search instances, and held-out scoring (``envs.make("ahd", task=..., size=...)``).

The search itself (EoH / Sample) lives in ``agents.eoh``; ``agents.sources.SearchRewards``
turns its batches into ES generations.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any, Callable, Sequence

from agentic_esopt import options as options_lib
from agentic_esopt.envs import base
from agentic_esopt.envs.ahd import aco, scoring
from agentic_esopt.envs.ahd.tasks import TASKS

SEARCHES = ("eoh", "sample")
TRAIN_INSTANCES_SEED = 0  # search instances: the same for every method and seed
EVAL_INSTANCES_SEED = 1   # held-out generated instances (without anchor_data)
ANCHOR_SPLIT = "test"


@dataclasses.dataclass(frozen=True)
class Options:
    """Heuristic-design settings (``envs.make("ahd", **options)``)."""

    task: str = options_lib.field("tsp_constructive", f"AHD task, one of {sorted(TASKS)}.")
    size: int | None = options_lib.field(None, "Problem size (default: the task's training "
                                               "size).")
    search: str = options_lib.field("eoh", f"Search method, one of {SEARCHES}.")
    eoh_population: int = options_lib.field(4, "Heuristics EoH keeps between generations.")
    samples_per_member: int = options_lib.field(1, "Sample prompts per member and batch.")
    train_size: int = options_lib.field(8, "Generated instances every heuristic is scored "
                                           "on during the search.")
    anchor_data: str | None = options_lib.field(None, "Anchor data root (e.g. "
                                                      "../shared/data/anchors): evaluate on "
                                                      "its published test instances.")
    timeout_s: float = options_lib.field(10.0, "Wall-clock limit per heuristic evaluation.")
    fast_aco: bool = options_lib.field(False, "ACO tasks: few ants and iterations.")

    def problem_size(self) -> int:
        return TASKS[self.task].default_size if self.size is None else self.size

    def problems(self) -> list[str]:
        problems: list[str] = []
        check = options_lib.checker(problems)
        check(self.task in TASKS, f"task: unknown {self.task!r}; choose one of {sorted(TASKS)}")
        check(self.size is None or self.size >= 1, f"size must be >= 1, got {self.size}")
        check(self.search in SEARCHES, f"search: unknown {self.search!r}; choose one of "
                                       f"{SEARCHES}")
        check(self.eoh_population >= 1, f"eoh_population must be >= 1, got "
                                        f"{self.eoh_population}")
        check(self.samples_per_member >= 1, f"samples_per_member must be >= 1, got "
                                            f"{self.samples_per_member}")
        check(self.train_size >= 1, f"train_size must be >= 1, got {self.train_size}")
        check(self.timeout_s > 0, f"timeout_s must be > 0, got {self.timeout_s}")
        if self.anchor_data is not None and self.task in TASKS and not problems:
            problems.extend(self._anchor_problems())
        return problems

    def _anchor_problems(self) -> list[str]:
        task = TASKS[self.task]
        if task.anchor_name is None:
            return [f"anchor_data: task {self.task!r} has no published anchor instances"]
        stem = os.path.join(self.anchor_data, "ahd", "datasets", task.anchor_name,
                            f"{ANCHOR_SPLIT}{self.problem_size()}_dataset")
        if not (os.path.exists(stem + ".npy") or os.path.exists(stem + ".npz")):
            return [f"anchor_data has no {stem}.np[yz]"]
        return []


@dataclasses.dataclass(frozen=True)
class AHDSource(base.Closeable):
    """What a heuristic search needs from a task.

    It holds no process between calls (each evaluation's sandbox ends with it), so
    ``close`` has nothing to release.

    Attributes:
      task: the ``AHDTask`` (prompt fields, direction, evaluator).
      options: the settings it was made from.
      evaluate: ``evaluate(codes) -> sandbox results`` on the search instances.
      score: ``score(code) -> {"valid", "objective", "error"}`` on the held-out instances.
      eval_description: which held-out instances ``score`` uses.
    """

    task: Any
    options: Options
    evaluate: Callable[[Sequence[str]], Sequence[scoring.Result]]
    score: Callable[[str], dict[str, Any]]
    eval_description: str

    def baseline_objective(self) -> float | None:
        """The task's seed heuristic scored on the held-out instances."""
        return self.score(self.task.seed_heuristic_source)["objective"]


def sandbox_options(options: Options) -> dict[str, Any]:
    """Sandbox limits (and ACO settings) for scoring a program."""
    limits: dict[str, Any] = dict(timeout_s=options.timeout_s)
    if options.fast_aco and options.task.endswith("_aco"):
        limits["evaluate_options"] = {"settings": aco.FAST_SETTINGS}
    return limits


def eval_instances(options: Options, eval_size: int) -> Any:
    """The first ``eval_size`` published test instances with ``anchor_data``, else a
    ``scoring.InstanceSpec`` of ``eval_size`` instances generated from
    ``EVAL_INSTANCES_SEED``."""
    if options.anchor_data is None:
        return scoring.InstanceSpec(options.problem_size(), eval_size, EVAL_INSTANCES_SEED)
    task = TASKS[options.task]
    return task.load_anchor_instances(options.anchor_data, options.problem_size(),
                                      ANCHOR_SPLIT)[:eval_size]


def score_program(code: str, options: Options, instances: Any) -> dict[str, Any]:
    """Scores one program in the sandbox: ``{"valid", "objective", "error"}``."""
    task = TASKS[options.task]
    result = scoring.run_candidate(code, task.function_name, task.name, instances,
                                   **sandbox_options(options))
    return dict(valid=result.valid, objective=result.objective, error=result.error)


def make_source(options: Options, splits: base.Splits) -> AHDSource:
    """The task, its search evaluator and held-out scoring (``splits.eval_size``
    instances; the training split is the generated search instances)."""
    task = TASKS[options.task]
    instances = eval_instances(options, splits.eval_size)
    evaluate = functools.partial(
        scoring.evaluate_many, function_name=task.function_name, task_name=task.name,
        instances_spec=scoring.InstanceSpec(options.problem_size(), options.train_size,
                                            TRAIN_INSTANCES_SEED),
        **sandbox_options(options))
    description = (f"{options.anchor_data} {ANCHOR_SPLIT}[:{splits.eval_size}]"
                   if options.anchor_data else
                   f"generated seed={EVAL_INSTANCES_SEED} n={splits.eval_size}")
    return AHDSource(task, options, evaluate,
                     functools.partial(score_program, options=options, instances=instances),
                     description)
