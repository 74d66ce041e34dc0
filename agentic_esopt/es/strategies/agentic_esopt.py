"""The paper's algorithm, Agentic ESOpt: z-scored rewards and ĝ = (1/G) Σ_i w_i ε_i.

With the default ``optax.sgd(learning_rate)`` a generation is θ ← θ + α/G Σ_i w_i ε_i.
Beyond the reference: another fitness shaping, division of the estimate by σ, and any
optax transformation on it.
"""

from __future__ import annotations

import functools
from typing import Any

import jax

from agentic_esopt.es import fitness as fitness_lib
from agentic_esopt.es import noise as noise_lib
from agentic_esopt.es import options as options_lib
from agentic_esopt.es import schedules
from agentic_esopt.es import strategy as strategy_lib


def _scale(scale_by_sigma: bool, population: noise_lib.Population) -> jax.Array | float:
    """1/G, or 1/(Gσ) with ``scale_by_sigma``."""
    scale = 1.0 / population.size
    return scale / population.sigma if scale_by_sigma else scale


def agentic_esopt(population_size: int, sigma: float | schedules.Schedule,
                  learning_rate: float | schedules.Schedule | None,
                  **keywords: Any) -> strategy_lib.Strategy:
    """Builds the Agentic ESOpt strategy.

    Args:
      population_size: G >= 2, the number of perturbed members per generation.
      sigma: perturbation scale, a float or an ``es.schedules`` schedule over generations.
      learning_rate: α, a float or schedule; None only with a custom optax optimizer.
      **keywords: the other settings, ``es.options.Settings`` (noise, rank, antithetic,
        fitness, scope, optimizer, weight_decay, scale_by_sigma, rounding,
        master_weights, update_block_bytes).

    Raises:
      ValueError: listing every problem of the settings (``options.settings_problems``).
    """
    settings = options_lib.Settings.of(population_size, sigma, learning_rate, **keywords)
    return strategy_lib.make(settings, strategy_lib.Algorithm(
        "agentic_esopt", shape=fitness_lib.get(settings.fitness),
        scale=functools.partial(_scale, settings.scale_by_sigma)))
