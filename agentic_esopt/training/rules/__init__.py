"""The update-rule registry: ``rules.make(config) -> Rule``, shaped like ``envs``.

An update rule turns a reward source's answers into new parameters. A rule module
defines ``Options`` (a frozen dataclass of its settings: the config's ``rule`` section
besides ``name``), ``make(config) -> Rule`` (see ``rules.base.Rule``) and, optionally,
``config_problems(sections) -> list[str]`` for settings that involve other sections.
Registering one is one line in ``_MODULES``, or ``register`` for a rule defined outside
the package; modules are imported when first used.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from types import ModuleType
from typing import Any

from agentic_esopt import options as options_lib
from agentic_esopt.training.rules.base import Rule, StepResult, reward_statistics

# name -> the module (or a registered object) defining Options and make.
_MODULES: dict[str, Any] = {
    "es": "agentic_esopt.training.rules.es",
    "grpo": "agentic_esopt.training.rules.grpo",
    "none": "agentic_esopt.training.rules.none",
}


def register(name: str, implementation: str | Any) -> None:
    """Registers an update rule defined outside the package.

    Args:
      name: the name config files use (``rule.name``).
      implementation: an importable module name, or any object (a module, a
        ``types.SimpleNamespace``) with ``Options`` and ``make``.
    """
    if name in _MODULES and _MODULES[name] is not implementation:
        raise ValueError(f"update rule {name!r} is already registered")
    _MODULES[name] = implementation


def names() -> tuple[str, ...]:
    """The registered rule names."""
    return tuple(sorted(_MODULES))


def module(name: str) -> ModuleType | Any:
    """The module that implements rule ``name``."""
    if name not in _MODULES:
        raise ValueError(f"unknown update rule {name!r}; choose one of {names()}")
    implementation = _MODULES[name]
    if isinstance(implementation, str):
        return importlib.import_module(implementation)
    return implementation


def default_options(name: str) -> dict[str, Any]:
    """Rule ``name``'s options with their defaults, as a plain dict."""
    return options_lib.as_dict(module(name).Options())


def build_options(name: str, values: Mapping[str, Any],
                  section: str = "rule") -> tuple[Any, list[str]]:
    """``name``'s ``Options`` from ``values`` and every problem with them."""
    if name not in _MODULES:
        return None, [f"{section}.name: unknown update rule {name!r}; choose one of "
                      f"{names()}"]
    return options_lib.build(module(name).Options, values, section)


def config_problems(name: str, sections: Mapping[str, Any]) -> list[str]:
    """Problems of rule ``name`` with the other sections (``sections``: built records)."""
    check = getattr(module(name), "config_problems", None)
    return check(sections) if check else []


def make(config: Any) -> Rule:
    """The update rule of a ``TrainConfig`` (``config.rule_name``)."""
    return module(config.rule_name).make(config)


__all__ = ["Rule", "StepResult", "build_options", "config_problems", "default_options",
           "make", "module", "names", "register", "reward_statistics"]
