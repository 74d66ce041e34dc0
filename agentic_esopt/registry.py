"""Name → implementation registries whose modules are imported when first used.

Environments (``envs.registry``) and update rules (``training.rules``) are each a module
with an ``Options`` record and a factory; a ``Registry`` maps their names to importable
module names (or to objects registered from outside the package), so a run loads only
the implementations it uses and their heavy dependencies.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from agentic_esopt import options as options_lib


class PluginError(ValueError):
    """An implementation (environment, update rule) that breaks its contract, found when
    a run is built or first uses it; the message names what is wrong and what is
    expected (launchers print it as one line)."""


class Registry:
    """Implementations of one kind (``kind``: "environment", "update rule"), by name;
    ``section`` is the config section that names one and holds its options."""

    def __init__(self, kind: str, section: str, modules: Mapping[str, str]):
        self.kind, self.section = kind, section
        self._implementations: dict[str, Any] = dict(modules)

    def register(self, name: str, implementation: str | Any) -> None:
        """Registers ``implementation``: an importable module name, or any object (a
        module, a ``types.SimpleNamespace``) with the attributes the kind needs."""
        if name in self._implementations and self._implementations[name] is not implementation:
            raise ValueError(f"{self.kind} {name!r} is already registered")
        self._implementations[name] = implementation

    def names(self) -> tuple[str, ...]:
        """The registered names."""
        return tuple(sorted(self._implementations))

    def module(self, name: str) -> Any:
        """The implementation registered as ``name`` (imported on first use)."""
        if name not in self._implementations:
            raise ValueError(f"unknown {self.kind} {name!r}; choose one of {self.names()}")
        implementation = self._implementations[name]
        if isinstance(implementation, str):
            return importlib.import_module(implementation)
        return implementation

    def default_options(self, name: str) -> dict[str, Any]:
        """``name``'s options with their defaults, as a plain dict."""
        return options_lib.as_dict(self.module(name).Options())

    def build_options(self, name: str, values: Mapping[str, Any],
                      section: str | None = None) -> tuple[Any, list[str]]:
        """``name``'s ``Options`` from ``values`` and every problem with them (prefixed
        with ``section``, default the registry's)."""
        section = section or self.section
        if name not in self._implementations:
            return None, [f"{section}.name: unknown {self.kind} {name!r}; choose one of "
                          f"{self.names()}"]
        options_cls = self.module(name).Options
        fields = options_lib.field_types(options_cls)
        unknown = sorted(set(values) - set(fields))
        if len(unknown) < 2:  # One unknown key: a typo, named with its closest field.
            return options_lib.build(options_cls, values, section)
        _, problems = options_lib.build(
            options_cls, {key: value for key, value in values.items() if key in fields},
            section)
        return None, [f"{section}: {self.kind} {name!r} has no options {', '.join(unknown)} "
                      f"(the section was written for another {self.kind}); {name!r} takes: "
                      f"{', '.join(sorted(fields)) or 'no options'}", *problems]
