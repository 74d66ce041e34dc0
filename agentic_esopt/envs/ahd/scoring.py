"""Scores LLM-written heuristics on a task's instances, in the sandbox.

`run_candidate` hands one candidate to ``sandbox.run_python``. Inside the child, `prepare`
loads the task and its instances (trusted, before the child is locked down); then the
candidate's source is executed and the task's ``evaluate`` called on its function under
the sandbox's guard. A candidate fails, with a reason, on: syntax errors, a missing
function, exceptions (including ``SystemExit`` and the task's ``InvalidHeuristicOutput``),
a non-finite or non-numeric objective, and whatever fails a sandbox run (a blocked action,
a timeout, the CPU, memory or output limits, dying without a result).
"""

import builtins
import concurrent.futures
import dataclasses
import functools
import math
import numbers
import os
from typing import Any, Callable, Mapping, NamedTuple, Sequence

import numpy as np

from agentic_esopt import sandbox
from agentic_esopt.envs.ahd.tasks import TASKS


class InstanceSpec(NamedTuple):
    """Instances generated inside the child by ``task.generate_instances(size, n, seed)``."""

    size: int
    n: int
    seed: int


@dataclasses.dataclass(frozen=True)
class Result:
    """Outcome of one candidate.

    Attributes:
      valid: whether the candidate produced a finite objective without violations.
      objective: the task's objective (mean over instances) when valid, else None.
      error: why the candidate failed, else None.
      stdout_tail: the last few KiB of its stdout+stderr.
      wall_s: wall-clock seconds from start to reaping.
    """

    valid: bool
    objective: float | None
    error: str | None
    stdout_tail: str
    wall_s: float


def resolve_task(task_ref: str) -> Any:
    """The task object for a registry name or a ``"package.module:attribute"`` path."""
    if ":" in task_ref:
        return sandbox.resolve(task_ref)
    if task_ref not in TASKS:
        raise ValueError(f"unknown AHD task {task_ref!r}; known: {sorted(TASKS)}")
    return TASKS[task_ref]


def _check_call(source, function_name, task_name):
    if not isinstance(source, str):
        raise TypeError(f"source must be a str, got {type(source).__name__}")
    if not (isinstance(function_name, str) and function_name.isidentifier()):
        raise ValueError(f"function_name must be a Python identifier, got {function_name!r}")
    resolve_task(task_name)  # fails fast, in the caller, on a bad name


def run_candidate(source: str, function_name: str, task_name: str, instances_spec: Any,
                  *, evaluate_options: Mapping[str, Any] | None = None,
                  **limits: Any) -> Result:
    """Evaluates one candidate heuristic in the sandbox.

    Args:
      source: Python source that defines `function_name`.
      function_name: the heuristic's name in the task interface.
      task_name: a name in ``agentic_esopt.envs.ahd.tasks.TASKS`` or a
        ``"package.module:attribute"`` path to an object with the same
        ``generate_instances(size, n, seed)`` and ``evaluate(fn, instances)`` methods.
      instances_spec: an `InstanceSpec` (instances generated in the child) or the
        instances themselves (pickled to the child).
      evaluate_options: keyword arguments for ``task.evaluate`` (pickled), e.g.
        ``{"settings": aco.FAST_SETTINGS}`` for the ACO tasks.
      **limits: the limits of ``sandbox.run_python`` (``timeout_s``, ``memory_mb``, ...).

    Returns:
      The `Result`. Candidate failures never raise; bad arguments do.
    """
    _check_call(source, function_name, task_name)
    payload = dict(source=source, function_name=function_name, task=task_name,
                   instances=instances_spec, options=dict(evaluate_options or {}))
    run = sandbox.run_python(f"{__name__}:prepare", payload, prefix="ahd_sandbox_",
                             **limits)
    error = run.error if run.error is not None else run.value["error"]
    objective = None if error is not None else float(run.value["objective"])
    return Result(error is None, objective, error, run.stdout_tail, run.wall_s)


def evaluate_many(sources: Sequence[str], function_name: str, task_name: str,
                  instances_spec: Any, *, max_workers: int | None = None,
                  **options: Any) -> list[Result]:
    """`run_candidate` for each source, `max_workers` (default: CPU count) at a time.

    Args:
      sources, function_name, task_name, instances_spec: as for `run_candidate`.
      max_workers: candidates run at once (threads, each waiting on one child).
      **options: the keyword arguments of `run_candidate` (limits, evaluate_options).

    Returns:
      One `Result` per source, in order.
    """
    if not sources:
        return []
    max_workers = max_workers or os.cpu_count() or 1
    with concurrent.futures.ThreadPoolExecutor(max_workers=max_workers) as pool:
        futures = [pool.submit(run_candidate, source, function_name, task_name,
                               instances_spec, **options) for source in sources]
        return [future.result() for future in futures]


# ----------------------------------------------------------------------------- in the child


def prepare(payload: dict[str, Any]) -> Callable[[], dict[str, Any]]:
    """The child's trusted set-up: loads the task and its instances; returns the
    candidate's evaluation for the sandbox to call."""
    task = resolve_task(payload["task"])
    instances = payload["instances"]
    if isinstance(instances, InstanceSpec):
        instances = task.generate_instances(*instances)
    return functools.partial(_evaluate, payload["source"], payload["function_name"], task,
                             instances, payload["options"])


def _finite_objective(value):
    """(objective, None) for a finite real number, else (None, reason)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None, f"objective has type {type(value).__name__}, expected a real number"
    value = float(value)
    if not math.isfinite(value):
        return None, f"objective is not finite ({value})"
    return value, None


def _evaluate(source, function_name, task, instances, options):
    """Runs the candidate: ``{"objective", "error"}`` with exactly one of them set (its
    exceptions are the sandbox's to report)."""
    # Small models often use np without importing it; the prompt says np is available.
    namespace = {"__name__": "candidate", "__builtins__": builtins, "np": np, "math": math}
    exec(compile(source, "<candidate>", "exec"), namespace)  # pylint: disable=exec-used
    heuristic = namespace.get(function_name)
    if not callable(heuristic):
        defined = sorted(k for k, v in namespace.items() if callable(v) and k[0] != "_")
        return {"objective": None,
                "error": f"no function named {function_name!r} (defines: {defined})"}
    objective, error = _finite_objective(task.evaluate(heuristic, instances, **options))
    return {"objective": objective, "error": error}
