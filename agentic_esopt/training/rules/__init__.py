"""The update-rule registry: ``rules.make(config) -> Rule``, shaped like ``envs``.

An update rule turns a reward source's answers into new parameters. A rule module
defines ``Options`` (a frozen dataclass of its settings: the config's ``rule`` section
besides ``name``), ``make(config) -> Rule`` (see ``rules.base.Rule``) and, optionally,
``config_problems(sections) -> list[str]`` for settings that involve other sections.
Registering one is one line in ``_REGISTRY``, or ``register(name, module)`` for a rule
defined outside the package; modules are imported when first used.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agentic_esopt.registry import PluginError, Registry
from agentic_esopt.training.rules.base import Rule, StepResult, reward_statistics

_REGISTRY = Registry("update rule", "rule", {
    "es": "agentic_esopt.training.rules.es",
    "grpo": "agentic_esopt.training.rules.grpo",
    "none": "agentic_esopt.training.rules.none",
})
register, names, module = _REGISTRY.register, _REGISTRY.names, _REGISTRY.module
default_options, build_options = _REGISTRY.default_options, _REGISTRY.build_options


def config_problems(name: str, sections: Mapping[str, Any]) -> list[str]:
    """Problems of rule ``name`` with the other sections (``sections``: built records)."""
    check = getattr(module(name), "config_problems", None)
    return check(sections) if check else []


def check_state(name: str, state: Any) -> None:
    """Raises PluginError unless rule ``name``'s state has ``params`` and ``generation``
    (the loop evaluates, checkpoints and resumes by them)."""
    missing = [f"`{field}`" for field in ("params", "generation") if not hasattr(state, field)]
    if missing:
        raise PluginError(f"update rule {name!r}: init(params) returned a "
                          f"{type(state).__name__} without {' and '.join(missing)}; a rule's "
                          "state must be a pytree with `params` and `generation` attributes "
                          "(e.g. a flax.struct.dataclass)")


def make(config: Any) -> Rule:
    """The update rule of a ``TrainConfig`` (``config.rule_name``)."""
    return module(config.rule_name).make(config)


__all__ = ["Rule", "StepResult", "build_options", "check_state", "config_problems",
           "default_options", "make", "module", "names", "register", "reward_statistics"]
