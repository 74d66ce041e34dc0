"""The environment registry: ``envs.make(name, **options) -> TaskSource``.

An environment module defines ``Options`` (a frozen dataclass of its settings with a
``problems()`` method, see ``agentic_esopt.options``) and
``make_source(options, splits) -> TaskSource``. Registering it is one line in ``_MODULES``;
modules are imported when first used, so an environment's heavy or optional
dependencies (a browser, a sandbox) load only for runs that use it.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from types import ModuleType
from typing import Any

from agentic_esopt import options as options_lib
from agentic_esopt.envs.base import Splits, split_problems

# name -> the module (or a registered object) defining Options and make_source.
_MODULES = {
    "sudoku": "agentic_esopt.envs.sudoku",
    "ahd": "agentic_esopt.envs.ahd.source",
    "math_react": "agentic_esopt.envs.math_react",
    "miniwob": "agentic_esopt.envs.miniwob",
    "webarena_lite": "agentic_esopt.envs.webarena_lite",
}


def register(name: str, implementation: str | Any) -> None:
    """Registers an environment defined outside the package.

    Args:
      name: the name ``make`` and config files use.
      implementation: an importable module name, or any object (a module, a
        ``types.SimpleNamespace``), with ``Options`` and ``make_source``.
    """
    if name in _MODULES and _MODULES[name] is not implementation:
        raise ValueError(f"environment {name!r} is already registered")
    _MODULES[name] = implementation


def names() -> tuple[str, ...]:
    """The registered environment names."""
    return tuple(sorted(_MODULES))


def module(name: str) -> ModuleType | Any:
    """The module that implements environment ``name``."""
    if name not in _MODULES:
        raise ValueError(f"unknown environment {name!r}; choose one of {names()}")
    implementation = _MODULES[name]
    if isinstance(implementation, str):
        return importlib.import_module(implementation)
    return implementation


def default_options(name: str) -> dict[str, Any]:
    """Environment ``name``'s options with their defaults, as a plain dict."""
    return options_lib.as_dict(module(name).Options())


def build_options(name: str, values: Mapping[str, Any],
                  section: str = "env") -> tuple[Any, list[str]]:
    """``name``'s ``Options`` from ``values`` and every problem with them."""
    if name not in _MODULES:
        return None, [f"{section}.name: unknown environment {name!r}; choose one of {names()}"]
    return options_lib.build(module(name).Options, values, section)


def make_from_options(name: str, options: Any, splits: Splits = Splits()) -> Any:
    """The task source of environment ``name`` with already-built ``options``."""
    problems = split_problems(splits)
    if problems:
        raise ValueError("invalid splits:\n  " + "\n  ".join(problems))
    return module(name).make_source(options, splits)


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
