"""The paper's algorithm, Agentic ESOpt: z-scored rewards and ĝ = (1/G) Σ_i w_i ε_i.

With the default ``optax.sgd(learning_rate)`` a generation is θ ← θ + α/G Σ_i w_i ε_i.
Beyond the reference: another fitness shaping, division of the estimate by σ, and any
optax transformation on it.
"""

from __future__ import annotations

import functools

import jax
import optax

from agentic_esopt.es import fitness as fitness_lib
from agentic_esopt.es import noise as noise_lib
from agentic_esopt.es import schedules
from agentic_esopt.es import strategy as strategy_lib


def _scale(scale_by_sigma: bool, population: noise_lib.Population) -> jax.Array | float:
    """1/G, or 1/(Gσ) with ``scale_by_sigma``."""
    scale = 1.0 / population.size
    return scale / population.sigma if scale_by_sigma else scale


def agentic_esopt(population_size: int,
                  sigma: float | schedules.Schedule,
                  learning_rate: float | schedules.Schedule | None,
                  noise: str = "full",
                  rank: int = 1,
                  antithetic: bool = False,
                  fitness: str = "zscore",
                  scope: str = "full",
                  optimizer: str | optax.GradientTransformation | None = None,
                  weight_decay: float = 0.0,
                  scale_by_sigma: bool = False,
                  rounding: str = "nearest",
                  master_weights: bool = False,
                  update_block_bytes: int = strategy_lib.UPDATE_BLOCK_BYTES
                  ) -> strategy_lib.Strategy:
    """Builds the Agentic ESOpt strategy.

    Args:
      population_size: G >= 2, the number of perturbed members per generation.
      sigma: perturbation scale, a float or an ``es.schedules`` schedule over generations.
      learning_rate: α, a float or schedule; None only with a custom optax optimizer.
      noise: "full" (Gaussian ε per leaf) or "lowrank" (E = A Bᵀ/√r for matrices).
      rank: r for low-rank noise.
      antithetic: members 2k and 2k+1 share ε with opposite signs (G must be even).
      fitness: reward shaping, one of ``fitness.SHAPERS``.
      scope: "full", "all_linear" or a regex over leaf paths: the leaves perturbed.
      optimizer: None or "sgd" (the paper), "adam", "adamw", or an optax transformation
        that already includes its learning rate. It receives −ĝ as the gradient.
      weight_decay: for "adamw".
      scale_by_sigma: divide the estimate by σ (the reference does not).
      rounding: "nearest" or "stochastic" (unbiased), how updated low-precision leaves
        round (``strategy.ROUNDINGS``).
      master_weights: keep float32 copies of low-precision leaves in the optimizer state.
      update_block_bytes: SGD updates leaves in place in blocks of rows of at most this
        many float32 bytes (0: whole leaves); bitwise the same, so not in the spec.

    Returns:
      A ``Strategy`` of pure functions.

    Raises:
      ValueError: listing every problem of the settings (``strategy.settings_problems``).
    """
    sigma = schedules.as_schedule(sigma)
    optimizer = optimizer or "sgd"
    problems = strategy_lib.settings_problems(
        population_size=population_size, noise=noise, rank=rank, antithetic=antithetic,
        scope=scope, sigma_schedule=sigma.kind, sigma_start=sigma.start,
        sigma_end=sigma.end, sigma_warmup=sigma.warmup,
        learning_rate=(None if learning_rate is None
                       else schedules.as_schedule(learning_rate).start),
        optimizer=optimizer, weight_decay=weight_decay, fitness=fitness, rounding=rounding,
        master_weights=master_weights, update_block_bytes=update_block_bytes)
    if problems:
        raise ValueError("invalid ES settings:\n  " + "\n  ".join(problems))
    custom = isinstance(optimizer, optax.GradientTransformation)
    learning_rate = schedules.as_schedule(learning_rate or 0.0)  # Only reported if custom.
    algorithm = strategy_lib.Algorithm(
        shape=fitness_lib.get(fitness),
        scale=functools.partial(_scale, scale_by_sigma),
        optimizer=(optimizer if custom else
                   strategy_lib.named_optimizer(optimizer, learning_rate, weight_decay)),
        learning_rate=learning_rate,
        spec=dict(fitness=fitness, optimizer="custom" if custom else optimizer,
                  weight_decay=weight_decay, scale_by_sigma=scale_by_sigma,
                  rounding=rounding, master_weights=master_weights),
        elementwise=optimizer == "sgd",  # Adam stays whole-tree: see es.strategy.
        rounding=rounding, master_weights=master_weights, block_bytes=update_block_bytes)
    sampling = strategy_lib.Sampling(population_size, sigma, noise, rank, antithetic, scope)
    return strategy_lib.make(sampling, algorithm)


def from_spec(spec: dict, optimizer: optax.GradientTransformation | None = None
              ) -> strategy_lib.Strategy:
    """Rebuilds a strategy from its ``spec`` (custom optimizers must be passed again)."""
    kwargs = dict(spec)
    kwargs["sigma"] = schedules.Schedule.from_spec(spec["sigma"])
    kwargs["learning_rate"] = schedules.Schedule.from_spec(spec["learning_rate"])
    if spec["optimizer"] == "custom":
        if optimizer is None:
            raise ValueError("this strategy used a custom optax optimizer: pass it again")
        kwargs["optimizer"] = optimizer
    return agentic_esopt(**kwargs)


def from_options(options: strategy_lib.Options, generations: int) -> strategy_lib.Strategy:
    """The strategy ``options`` describe, its σ schedule spanning ``generations``."""
    sigma = schedules.Schedule(options.sigma_schedule, options.sigma_start, options.sigma_end,
                               generations, options.sigma_warmup)
    return agentic_esopt(population_size=options.population_size, sigma=sigma,
                         learning_rate=options.learning_rate, noise=options.noise,
                         rank=options.rank, antithetic=options.antithetic,
                         fitness=options.fitness, scope=options.scope,
                         optimizer=options.optimizer, weight_decay=options.weight_decay,
                         scale_by_sigma=options.scale_by_sigma, rounding=options.rounding,
                         master_weights=options.master_weights,
                         update_block_bytes=options.update_block_bytes)
