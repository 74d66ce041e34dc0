"""Random search keeping the best member: a (1 + λ) evolution strategy.

Member 0 of every population is θ itself (sign 0), re-evaluated beside G − 1 perturbed
members; ``tell`` moves θ to the best of them, θ ← θ + α σ sign_b ε_b (α = 1 lands on
it; ``scale_by_sigma`` drops σ), and keeps θ when member 0 is best (ties go to it). The
engine's key-derived noise, memory, rounding and the es rule's history and replay work
unchanged; fitness shaping is monotone, so it never changes which member is best.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp

from agentic_esopt.es import noise as noise_lib
from agentic_esopt.es import options as options_lib
from agentic_esopt.es import schedules
from agentic_esopt.es import strategy as strategy_lib


def ask(settings: options_lib.Settings, state: strategy_lib.ESState) -> noise_lib.Population:
    """``strategy.draw``'s population with member 0 unperturbed (the incumbent θ)."""
    population = strategy_lib.draw(settings, state)
    return population.replace(signs=population.signs.at[0].set(0.0))


def best(rewards: jax.Array) -> jax.Array:
    """One-hot weights of the best member (the first of equals: the incumbent)."""
    return jax.nn.one_hot(jnp.argmax(rewards), rewards.shape[0], dtype=jnp.float32)


def _scale(scale_by_sigma: bool, population: noise_lib.Population) -> jax.Array | float:
    """σ (the step onto the best member), or 1 with ``scale_by_sigma``."""
    return 1.0 if scale_by_sigma else population.sigma


def random_search(population_size: int, sigma: float | schedules.Schedule,
                  learning_rate: float | schedules.Schedule | None,
                  **keywords: Any) -> strategy_lib.Strategy:
    """Builds random search keeping the best member (see the module docstring).

    Args:
      population_size: G >= 2: the incumbent and G − 1 perturbed members.
      sigma: perturbation scale, a float or an ``es.schedules`` schedule.
      learning_rate: α, the fraction of the way to the best member (with SGD).
      **keywords: the other settings, ``es.options.Settings``.
    """
    settings = options_lib.Settings.of(population_size, sigma, learning_rate, **keywords)
    return strategy_lib.make(settings, strategy_lib.Algorithm(
        "random_search", shape=best, scale=functools.partial(_scale, settings.scale_by_sigma),
        ask=ask))
