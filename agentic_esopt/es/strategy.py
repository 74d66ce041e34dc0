"""The Agentic ESOpt strategy: init / ask / perturb / tell over any parameter pytree.

Each generation: ``ask`` derives G member keys (no weights); the caller evaluates members
θ + σ ε_i (``perturb``, or population-batched inference with ``noise.population_factors``);
``tell`` shapes the rewards and applies the estimate

    ĝ = (1/G) Σ_i w_i ε_i            (optionally divided by σ)

through an optax transformation; the default ``optax.sgd(learning_rate)`` gives the paper's
θ ← θ + α/G Σ_i w_i ε_i. ``tell`` regenerates each member's noise leaf by leaf inside a
loop, so it never holds more than one leaf of noise whatever G is.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple

import flax.struct
import jax
import jax.numpy as jnp
import optax

from agentic_esopt import options as options_lib
from agentic_esopt.es import fitness as fitness_lib
from agentic_esopt.es import noise as noise_lib
from agentic_esopt.es import schedules

PyTree = Any
OPTIMIZERS = ("sgd", "adam", "adamw")


@flax.struct.dataclass
class ESState:
    """Optimiser state: parameters, optax state, generation index and raw run key (2,)."""

    params: PyTree
    opt_state: PyTree
    generation: jax.Array
    key: jax.Array


class Strategy(NamedTuple):
    """Pure functions of an ES strategy, plus the spec that rebuilds it.

    ``tell`` validates rewards on the host, then calls ``update``, the jitted update with
    no host-side checks (usable under ``jax.jit`` / ``.lower`` for memory analysis).
    """

    init: Callable[[jax.Array, PyTree], ESState]
    ask: Callable[[ESState], noise_lib.Population]
    perturb: Callable[[ESState, noise_lib.Population, int], PyTree]
    tell: Callable[[ESState, noise_lib.Population, Any], tuple[ESState, dict]]
    update: Callable[[ESState, noise_lib.Population, jax.Array], tuple[ESState, dict]]
    spec: dict


def _build_optimizer(name: str, learning_rate: schedules.Schedule,
                     weight_decay: float) -> optax.GradientTransformation:
    if name == "sgd":
        return optax.sgd(learning_rate)
    if name == "adam":
        return optax.adam(learning_rate)
    if name == "adamw":
        return optax.adamw(learning_rate, weight_decay=weight_decay)
    raise ValueError(f"unknown optimizer {name!r}; choose one of {OPTIMIZERS} or pass an "
                     "optax.GradientTransformation")


def raw_key(key: jax.Array | int) -> jax.Array:
    """Raw uint32 (2,) key data from an int seed, a typed key or raw key data."""
    if isinstance(key, int):
        key = jax.random.key(key)
    if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        return jax.random.key_data(key)
    return jnp.asarray(key, jnp.uint32)


def _estimate_leaf(path_string: str, leaf: jax.Array, keys: jax.Array, coeffs: jax.Array,
                   noise: str, rank: int) -> jax.Array:
    """Σ_j coeffs_j ε_j for one leaf, regenerating one member's noise per loop step."""
    if noise == "lowrank" and noise_lib.is_matrix(path_string, leaf.shape):
        return _estimate_lowrank_leaf(path_string, leaf.shape, keys, coeffs, rank)

    def add_member(j, total):
        return total + coeffs[j] * noise_lib.leaf_noise(keys[j], path_string, leaf.shape,
                                                        noise, rank)

    return jax.lax.fori_loop(0, keys.shape[0], add_member,
                             jnp.zeros(leaf.shape, jnp.float32))


def _estimate_lowrank_leaf(path_string: str, shape: tuple[int, ...], keys: jax.Array,
                           coeffs: jax.Array, rank: int) -> jax.Array:
    """Σ_j coeffs_j A_j B_jᵀ/√r as matmuls over chunks of members.

    A chunk's factors hold at most one leaf's worth of numbers, so memory stays O(leaf)
    while each step is one (in × chunk·r) @ (chunk·r × out) matmul.
    """
    *_, n_in, n_out = shape
    size = keys.shape[0]
    chunk = max(1, min(size, (n_in * n_out) // ((n_in + n_out) * rank)))
    num_chunks = -(-size // chunk)
    padding = num_chunks * chunk - size
    keys = jnp.concatenate([keys, jnp.broadcast_to(keys[:1], (padding, 2))])
    coeffs = jnp.concatenate([coeffs, jnp.zeros((padding,), coeffs.dtype)])
    keys = keys.reshape(num_chunks, chunk, 2)
    coeffs = coeffs.reshape(num_chunks, chunk) / jnp.sqrt(jnp.float32(rank))

    def add_chunk(j, total):
        factors = jax.vmap(lambda k: noise_lib.lowrank_factors(
            noise_lib.leaf_key(k, path_string), shape, rank))(keys[j])
        a, b = factors
        a = a * coeffs[j].reshape((-1,) + (1,) * (a.ndim - 1))
        return total + jnp.einsum("c...ir,c...or->...io", a, b)

    return jax.lax.fori_loop(0, num_chunks, add_chunk, jnp.zeros(shape, jnp.float32))


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
                  scale_by_sigma: bool = False) -> Strategy:
    """Builds the Agentic ESOpt strategy.

    Args:
      population_size: G, the number of perturbed members per generation.
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

    Returns:
      A ``Strategy`` of pure functions.
    """
    if population_size < 1:
        raise ValueError(f"population_size must be >= 1, got {population_size}")
    if antithetic and population_size % 2:
        raise ValueError(f"antithetic sampling needs an even population_size, got "
                         f"{population_size}")
    if noise not in noise_lib.NOISE_MODES:
        raise ValueError(f"unknown noise {noise!r}; choose one of {noise_lib.NOISE_MODES}")
    if rank < 1:
        raise ValueError(f"rank must be >= 1, got {rank}")
    shape_rewards = fitness_lib.get(fitness)
    noise_lib.validate_scope(scope)
    sigma = schedules.as_schedule(sigma)
    custom_optimizer = isinstance(optimizer, optax.GradientTransformation)
    if custom_optimizer:
        lr_schedule = schedules.as_schedule(learning_rate or 0.0)
        transform = optimizer
    else:
        if learning_rate is None:
            raise ValueError("learning_rate is required unless optimizer is an optax "
                             "transformation")
        lr_schedule = schedules.as_schedule(learning_rate)
        transform = _build_optimizer(optimizer or "sgd", lr_schedule, weight_decay)

    spec = dict(population_size=population_size, sigma=sigma.spec,
                learning_rate=lr_schedule.spec, noise=noise, rank=rank,
                antithetic=antithetic, fitness=fitness, scope=scope,
                optimizer="custom" if custom_optimizer else (optimizer or "sgd"),
                weight_decay=weight_decay, scale_by_sigma=scale_by_sigma)

    @jax.jit
    def init_optimizer(params: PyTree) -> PyTree:
        # Jitted, so the float32 view of the params is never materialised when the
        # optimizer keeps no per-parameter state (plain SGD).
        return transform.init(jax.tree.map(lambda p: p.astype(jnp.float32), params))

    def init(key: jax.Array | int, params: PyTree) -> ESState:
        opt_state = init_optimizer(params)
        return ESState(params=params, opt_state=opt_state,
                       generation=jnp.zeros((), jnp.int32), key=raw_key(key))

    @jax.jit
    def ask(state: ESState) -> noise_lib.Population:
        keys, signs = noise_lib.generation_keys(state.key, state.generation,
                                                population_size, antithetic)
        return noise_lib.Population(keys=keys, signs=signs,
                                    sigma=sigma(state.generation).astype(jnp.float32),
                                    generation=state.generation, noise=noise, rank=rank,
                                    scope=scope)

    def perturb(state: ESState, population: noise_lib.Population, member: int) -> PyTree:
        return noise_lib.perturb(state.params, population, member)

    def estimate(params: PyTree, population: noise_lib.Population,
                 weights: jax.Array) -> PyTree:
        coeffs = weights * population.signs
        keys = population.keys
        if antithetic:  # Pairs share ε: one noise draw per pair.
            coeffs = coeffs.reshape(-1, 2).sum(axis=1)
            keys = keys[::2]
        scale = 1.0 / population_size
        if scale_by_sigma:
            scale = scale / population.sigma

        def leaf_estimate(path, leaf):
            path_string = jax.tree_util.keystr(path)
            if not noise_lib.in_scope(scope, path_string, leaf):
                return jnp.zeros(leaf.shape, jnp.float32)
            return scale * _estimate_leaf(path_string, leaf, keys, coeffs, noise, rank)

        return jax.tree_util.tree_map_with_path(leaf_estimate, params)

    @jax.jit
    def update(state: ESState, population: noise_lib.Population, rewards: jax.Array):
        weights = shape_rewards(rewards)
        grad_estimate = estimate(state.params, population, weights)
        descent = jax.tree.map(jnp.negative, grad_estimate)
        steps, opt_state = transform.update(descent, state.opt_state, state.params)
        params = optax.apply_updates(state.params, steps)
        metrics = dict(sigma=population.sigma,
                       learning_rate=lr_schedule(state.generation),
                       update_norm=optax.tree.norm(steps),
                       reward_mean=rewards.mean(), reward_std=rewards.std(),
                       reward_max=rewards.max(), reward_min=rewards.min(),
                       weights=weights)
        new_state = ESState(params=params, opt_state=opt_state,
                            generation=state.generation + 1, key=state.key)
        return new_state, metrics

    def tell(state: ESState, population: noise_lib.Population,
             rewards) -> tuple[ESState, dict]:
        rewards = fitness_lib.check_rewards(rewards, population_size)
        return update(state, population, jnp.asarray(rewards))

    return Strategy(init=init, ask=ask, perturb=perturb, tell=tell, update=update, spec=spec)


def from_spec(spec: dict, optimizer: optax.GradientTransformation | None = None) -> Strategy:
    """Rebuilds a strategy from its ``spec`` (custom optimizers must be passed again)."""
    kwargs = dict(spec)
    kwargs["sigma"] = schedules.Schedule.from_spec(spec["sigma"])
    kwargs["learning_rate"] = schedules.Schedule.from_spec(spec["learning_rate"])
    if spec["optimizer"] == "custom":
        if optimizer is None:
            raise ValueError("this strategy used a custom optax optimizer: pass it again")
        kwargs["optimizer"] = optimizer
    return agentic_esopt(**kwargs)


@dataclasses.dataclass(frozen=True)
class Options:
    """The ES settings of a run (a config file's ``es`` section)."""

    population_size: int = options_lib.field(8, "G, perturbed members per generation.")
    noise: str = options_lib.field("full", "Perturbation noise: 'full' or 'lowrank'.")
    rank: int = options_lib.field(1, "Rank r of low-rank noise.")
    antithetic: bool = options_lib.field(False, "Antithetic pairs (+ε, −ε); needs an even "
                                                "population.")
    sigma_schedule: str = options_lib.field("cosine", "σ schedule: constant, linear or "
                                                      "cosine.")
    sigma_start: float = options_lib.field(1e-3, "σ at the start (after warmup).")
    sigma_end: float = options_lib.field(2.5e-4, "σ at the last generation (== sigma_start "
                                                 "for constant).")
    sigma_warmup: int = options_lib.field(0, "Generations of linear σ warmup from 0.")
    learning_rate: float = options_lib.field(5e-4, "α, the ES learning rate.")
    optimizer: str = options_lib.field("sgd", "Optimizer on the ES estimate: sgd (the "
                                              "paper's), adam or adamw.")
    weight_decay: float = options_lib.field(0.0, "Decoupled weight decay (adamw only).")
    scale_by_sigma: bool = options_lib.field(False, "Divide the estimate by σ (the paper "
                                                    "does not).")
    fitness: str = options_lib.field("zscore", "Reward shaping: zscore, centered_rank or "
                                               "identity.")
    scope: str = options_lib.field("full", "Perturbed parameters: 'full', 'all_linear' or "
                                           "a regex over parameter paths.")

    def problems(self) -> list[str]:
        """Every problem with these settings (the trainer checks σ warmup < generations)."""
        problems: list[str] = []
        check = options_lib.checker(problems)
        check(self.population_size >= 2,
              f"population_size must be >= 2, got {self.population_size}")
        check(not (self.antithetic and self.population_size % 2),
              f"antithetic sampling needs an even population_size, got {self.population_size}")
        check(self.noise in noise_lib.NOISE_MODES,
              f"noise: unknown {self.noise!r}; choose one of {noise_lib.NOISE_MODES}")
        check(self.rank >= 1, f"rank must be >= 1, got {self.rank}")
        check(not (self.rank > 1 and self.noise == "full"),
              f"rank={self.rank} only applies to noise='lowrank'; use rank=1 with full noise")
        check(self.sigma_schedule in schedules.KINDS,
              f"sigma_schedule: unknown {self.sigma_schedule!r}; choose one of "
              f"{schedules.KINDS}")
        check(self.sigma_start > 0, f"sigma_start must be > 0, got {self.sigma_start}")
        check(self.sigma_end >= 0, f"sigma_end must be >= 0, got {self.sigma_end}")
        check(not (self.sigma_schedule == "constant" and self.sigma_end != self.sigma_start),
              f"sigma_end: a constant σ schedule has no end value; set sigma_end = "
              f"sigma_start ({self.sigma_start}), got {self.sigma_end}")
        check(self.sigma_warmup >= 0, f"sigma_warmup must be >= 0, got {self.sigma_warmup}")
        check(self.learning_rate > 0, f"learning_rate must be > 0, got {self.learning_rate}")
        check(self.optimizer in OPTIMIZERS,
              f"optimizer: unknown {self.optimizer!r}; choose one of {OPTIMIZERS}")
        check(self.weight_decay >= 0, f"weight_decay must be >= 0, got {self.weight_decay}")
        check(not (self.weight_decay > 0 and self.optimizer != "adamw"),
              f"weight_decay only applies to optimizer='adamw', got {self.optimizer!r}")
        check(self.fitness in fitness_lib.SHAPERS,
              f"fitness: unknown {self.fitness!r}; choose one of {tuple(fitness_lib.SHAPERS)}")
        try:
            noise_lib.validate_scope(self.scope)
        except ValueError as error:
            problems.append(f"scope: {error}")
        return problems


def from_options(options: Options, generations: int) -> Strategy:
    """The strategy ``options`` describe, its σ schedule spanning ``generations``."""
    sigma = schedules.Schedule(options.sigma_schedule, options.sigma_start, options.sigma_end,
                               generations, options.sigma_warmup)
    return agentic_esopt(population_size=options.population_size, sigma=sigma,
                         learning_rate=options.learning_rate, noise=options.noise,
                         rank=options.rank, antithetic=options.antithetic,
                         fitness=options.fitness, scope=options.scope,
                         optimizer=options.optimizer, weight_decay=options.weight_decay,
                         scale_by_sigma=options.scale_by_sigma)
