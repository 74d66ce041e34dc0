"""The ES strategy registry, shaped like ``envs``: ``names()``, ``get(name)``, ``register``.

A strategy is one module: its algorithm's hooks (``es.strategy.Algorithm``) and a factory
that returns ``es.strategy.make(sampling, algorithm)``. A factory takes
``(population_size, sigma, learning_rate)`` first and its other settings by keyword.
Registering one is one line in ``_FACTORIES``, or ``register`` from outside the package.
"""

from __future__ import annotations

from typing import Callable

from agentic_esopt.es import strategy as strategy_lib
from agentic_esopt.es.strategies import agentic_esopt

Factory = Callable[..., strategy_lib.Strategy]

# name -> the factory building that strategy.
_FACTORIES: dict[str, Factory] = {"agentic_esopt": agentic_esopt.agentic_esopt}


def register(name: str, factory: Factory) -> None:
    """Registers the strategy ``factory`` builds under ``name``."""
    if name in _FACTORIES and _FACTORIES[name] is not factory:
        raise ValueError(f"ES strategy {name!r} is already registered")
    _FACTORIES[name] = factory


def names() -> tuple[str, ...]:
    """The registered strategy names."""
    return tuple(sorted(_FACTORIES))


def get(name: str) -> Factory:
    """The factory of strategy ``name``."""
    if name not in _FACTORIES:
        raise ValueError(f"unknown ES strategy {name!r}; choose one of {names()}")
    return _FACTORIES[name]


__all__ = ["Factory", "agentic_esopt", "get", "names", "register"]
