"""The environment registry: ``envs.make(name, **options) -> TaskSource``.

An environment module defines ``Options`` (a frozen dataclass of its settings with a
``problems()`` method, see ``agentic_esopt.options``) and
``make_source(options, splits) -> TaskSource``. Registering it is one line in ``_REGISTRY``
(or ``register(name, module)`` from outside the package);
modules are imported when first used, so an environment's heavy or optional
dependencies (a browser, a sandbox) load only for runs that use it.
"""

from __future__ import annotations

from typing import Any

from agentic_esopt import options as options_lib
from agentic_esopt.registry import PluginError, Registry
from agentic_esopt.envs.base import Splits, TaskSource, split_problems

_REGISTRY = Registry("environment", "env", {
    "sudoku": "agentic_esopt.envs.sudoku",
    "ahd": "agentic_esopt.envs.ahd.source",
    "math_react": "agentic_esopt.envs.math_react",
    "miniwob": "agentic_esopt.envs.miniwob",
    "webarena_lite": "agentic_esopt.envs.webarena_lite",
    "reasoning_gym": "agentic_esopt.envs.reasoning_gym",
})
register, names, module = _REGISTRY.register, _REGISTRY.names, _REGISTRY.module
default_options, build_options = _REGISTRY.default_options, _REGISTRY.build_options


def check_tasks(name: str, source: TaskSource) -> None:
    """Raises PluginError unless every held-out task and generation 0's training tasks
    have an ``id`` (all the rollout engine needs of a task)."""
    for where, tasks in (("eval_tasks", source.eval_tasks),
                         ("train_tasks(0)", source.train_tasks(0))):
        for index, task in enumerate(tasks):
            if not hasattr(task, "id"):
                raise PluginError(
                    f"environment {name!r}: {where}[{index}] is a {type(task).__name__} "
                    f"({task!r:.40}) without an `id`; every task needs a stable string "
                    "`id` attribute (e.g. a frozen dataclass with an id field)")


def make_from_options(name: str, options: Any, splits: Splits = Splits()) -> Any:
    """The task source of environment ``name`` with already-built ``options``; a
    multi-turn one's tasks are checked (``check_tasks``)."""
    problems = split_problems(splits)
    if problems:
        raise ValueError("invalid splits:\n  " + "\n  ".join(problems))
    source = module(name).make_source(options, splits)
    if isinstance(source, TaskSource):
        check_tasks(name, source)
    return source


def make(name: str, *, seed: int = 0, tasks_per_generation: int = 4, eval_size: int = 32,
         eval_split: str = "eval", **options: Any) -> Any:
    """The task source of environment ``name`` (a ``TaskSource`` for multi-turn ones).

    Args:
      name: a registered environment (``names()``).
      seed, tasks_per_generation, eval_size, eval_split: see ``Splits``.
      **options: the environment's own options (its ``Options`` fields).

    Raises:
      ValueError: naming every unknown or invalid option.
    """
    built = options_lib.build_or_raise(module(name).Options, options, name)
    return make_from_options(name, built, Splits(seed, tasks_per_generation, eval_size,
                                                 eval_split))
