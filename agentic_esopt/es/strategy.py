"""The ES engine: init / ask / perturb / tell over any parameter pytree.

An ES algorithm is an ``Algorithm``, a few hooks; ``make`` binds it to checked
``es.options.Settings`` and returns a ``Strategy`` of pure functions. Each generation
``ask`` returns the population (``draw``: G key-derived members, no weights; an algorithm
may sample its own way through ``Algorithm.ask``, as long as members stay keys, signs and
σ); the caller evaluates members θ + σ sign_i ε_i (``perturb``, or population-batched
inference with ``noise.population_factors``); ``tell`` shapes the rewards into weights w
(``Algorithm.shape``) and applies

    ĝ = s · Σ_i w_i sign_i ε_i            (s: ``Algorithm.scale``, e.g. 1/G)

through the settings' optax transformation, which receives −ĝ. How the step is applied
(leaf by leaf or in blocks of rows, O(one leaf) of noise whatever G is, rounding, float32
master weights, each leaf keeping its sharding) is the engine's (``es.update``), never the
algorithm's.

``tell`` consumes its state: the update donates it, so the new state reuses its buffers
(copy a state, or the params given to ``init``, that must outlive it).
"""

from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple

import flax.struct
import jax
import jax.numpy as jnp

from agentic_esopt.es import fitness as fitness_lib
from agentic_esopt.es import noise as noise_lib
from agentic_esopt.es import update as update_lib
from agentic_esopt.es.options import Options, Settings  # noqa: F401  (Options: its old home)

PyTree = Any


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


def raw_key(key: jax.Array | int) -> jax.Array:
    """Raw uint32 (2,) key data from an int seed, a typed key or raw key data."""
    if isinstance(key, int):
        key = jax.random.key(key)
    if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        return jax.random.key_data(key)
    return jnp.asarray(key, jnp.uint32)


def draw(settings: Settings, state: ESState) -> noise_lib.Population:
    """The generation's population: G members keyed by (run key, generation, member),
    antithetic pairs sharing a key with opposite signs, σ from the schedule."""
    keys, signs = noise_lib.generation_keys(state.key, state.generation,
                                            settings.population_size, settings.antithetic)
    return noise_lib.Population(keys=keys, signs=signs,
                                sigma=settings.sigma(state.generation).astype(jnp.float32),
                                generation=state.generation, noise=settings.noise,
                                rank=settings.rank, scope=settings.scope)


class Algorithm(NamedTuple):
    """The hooks that make an ES algorithm of the engine.

    Attributes:
      name: the algorithm's registry name (``es.strategies``), recorded in the spec so
        that ``es.strategies.from_spec`` rebuilds it.
      shape: rewards (G,) float32 -> per-member weights w (G,), recorded in the history.
      scale: the population -> the estimate's factor s (a scalar), e.g. 1/G or 1/(Gσ).
      ask: (settings, state) -> the generation's population (default ``draw``); jitted.
        Members must be key-derived (keys, signs, σ) so that ``tell`` and replay can
        regenerate their noise; a sign of 0 evaluates θ itself.
    """

    name: str
    shape: Callable[[jax.Array], jax.Array]
    scale: Callable[[noise_lib.Population], jax.Array | float]
    ask: Callable[[Settings, ESState], noise_lib.Population] = draw


def _update(settings: Settings, algorithm: Algorithm, optimizer: Any, mode: update_lib.Mode,
            state: ESState, population: noise_lib.Population,
            rewards: jax.Array) -> tuple[ESState, dict]:
    weights = algorithm.shape(rewards)
    params, opt_state, update_norm = update_lib.apply(
        optimizer, mode, state.params, state.opt_state, population, weights,
        settings.antithetic, algorithm.scale(population),
        update_lib.rounding_key(state.key, state.generation))
    metrics = dict(sigma=population.sigma,
                   learning_rate=settings.reported_learning_rate(state.generation),
                   update_norm=update_norm,
                   reward_mean=rewards.mean(), reward_std=rewards.std(),
                   reward_max=rewards.max(), reward_min=rewards.min(),
                   weights=weights)
    new_state = ESState(params=params, opt_state=opt_state,
                        generation=state.generation + 1, key=state.key)
    return new_state, metrics


def make(settings: Settings, algorithm: Algorithm,
         mode: update_lib.Mode | None = None) -> Strategy:
    """The ``Strategy`` of ``algorithm`` with ``settings``; ``mode`` overrides how steps
    are applied (default ``settings.mode``: SGD leaf by leaf, other optimizers whole)."""
    optimizer, mode = settings.transformation(), mode or settings.mode
    init_optimizer = jax.jit(functools.partial(update_lib.init_optimizer, optimizer, mode))
    update = jax.jit(functools.partial(_update, settings, algorithm, optimizer, mode),
                     donate_argnums=0)

    def init(key: jax.Array | int, params: PyTree) -> ESState:
        return ESState(params=params, opt_state=init_optimizer(params),
                       generation=jnp.zeros((), jnp.int32), key=raw_key(key))

    def perturb(state: ESState, population: noise_lib.Population, member: int) -> PyTree:
        return noise_lib.perturb(state.params, population, member)

    def tell(state: ESState, population: noise_lib.Population,
             rewards) -> tuple[ESState, dict]:
        rewards = fitness_lib.check_rewards(rewards, settings.population_size)
        return update(state, population, jnp.asarray(rewards))

    return Strategy(init=init, ask=jax.jit(functools.partial(algorithm.ask, settings)),
                    perturb=perturb, tell=tell, update=update,
                    spec=settings.spec(algorithm.name))
