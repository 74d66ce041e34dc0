"""The ES strategy registry, shaped like ``envs``: ``names()``, ``get(name)``, ``register``.

A strategy is one module: its hooks (``es.strategy.Algorithm``: weights, scale and, if
it wants, its own sampling) and a factory ``factory(population_size, sigma,
learning_rate, **keywords) -> es.strategy.make(settings, algorithm)`` taking the one
keyword set of ``es.options.Settings``. That set also comes from a config's ``es``
section (``from_options``) and from a recorded spec (``from_spec``). Registering one is
one line in ``_FACTORIES``, or ``register`` from outside the package.
"""

from __future__ import annotations

from typing import Callable

import optax

from agentic_esopt.es import options as options_lib
from agentic_esopt.es import strategy as strategy_lib
from agentic_esopt.es.strategies import agentic_esopt, random_search

Factory = Callable[..., strategy_lib.Strategy]

# name -> the factory building that strategy.
_FACTORIES: dict[str, Factory] = {"agentic_esopt": agentic_esopt.agentic_esopt,
                                  "random_search": random_search.random_search}


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


def from_options(options: options_lib.Options, generations: int) -> strategy_lib.Strategy:
    """The strategy an ``es`` section describes, its σ schedule spanning ``generations``."""
    return get(options.strategy)(**options_lib.keywords(options, generations))


def from_spec(spec: dict, optimizer: optax.GradientTransformation | None = None
              ) -> strategy_lib.Strategy:
    """Rebuilds a strategy from its ``spec`` (a history's header; one without a name is
    Agentic ESOpt's; custom optimizers must be passed again)."""
    name = spec.get("strategy", options_lib.DEFAULT_STRATEGY)
    return get(name)(**options_lib.spec_keywords(spec, optimizer))


__all__ = ["Factory", "agentic_esopt", "from_options", "from_spec", "get", "names",
           "random_search", "register"]
