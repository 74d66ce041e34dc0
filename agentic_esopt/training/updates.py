"""Update rules: how rewards from a reward source become new parameters.

An update rule has ``init(params) -> state`` (a pytree with ``params`` and
``generation``, checkpointed by the trainer) and ``step(state, source, model, key,
trajectory_path) -> (state, StepResult)``: one generation. Rules are chosen by
``update.name``:

* ``es``: Agentic ESOpt. ask → every member's reward from the source → tell.
* ``none``: the unperturbed policy acts and nothing is learned (the baseline of a
  search without ES, e.g. EoH or Sample alone).
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from agentic_esopt import es
from agentic_esopt.agents import sources
from agentic_esopt.training import config as config_lib

PyTree = Any


class StepResult(NamedTuple):
    """What one generation produced besides the new state.

    Attributes:
      population: the ES population (None for rules without one).
      rewards: the reward source's output.
      metrics: the rule's own metrics (σ, learning rate, update norm, reward statistics;
        ES adds the per-member weights the history records).
    """

    population: es.Population | None
    rewards: sources.Rewards
    metrics: dict[str, float]


def reward_statistics(rewards: np.ndarray) -> dict[str, float]:
    """Mean, std, max and min of one generation's member rewards."""
    return dict(reward_mean=float(np.mean(rewards)), reward_std=float(np.std(rewards)),
                reward_max=float(np.max(rewards)), reward_min=float(np.min(rewards)))


@dataclasses.dataclass(frozen=True)
class ESRule:
    """Agentic ESOpt: the population around θ answers, ``tell`` moves θ."""

    strategy: es.Strategy
    run_key: jax.Array
    writes_history = True

    def init(self, params: PyTree) -> es.ESState:
        return self.strategy.init(self.run_key, params)

    def step(self, state: es.ESState, source: sources.RewardSource, model: Any,
             key: jax.Array, trajectory_path: str | None) -> tuple[es.ESState, StepResult]:
        population = self.strategy.ask(state)
        rewards = source.rewards(dataclasses.replace(model, params=state.params), population,
                                 int(state.generation), key, trajectory_path)
        state, metrics = self.strategy.tell(state, population, rewards.rewards)
        return state, StepResult(population, rewards, metrics)


@flax.struct.dataclass
class FrozenState:
    """The state of a rule that learns nothing: the parameters and the generation."""

    params: PyTree
    generation: jax.Array


@dataclasses.dataclass(frozen=True)
class FrozenRule:
    """The unperturbed policy acts; parameters never change."""

    writes_history = False

    def init(self, params: PyTree) -> FrozenState:
        return FrozenState(params, jnp.zeros((), jnp.int32))

    def step(self, state: FrozenState, source: sources.RewardSource, model: Any,
             key: jax.Array, trajectory_path: str | None) -> tuple[FrozenState, StepResult]:
        rewards = source.rewards(dataclasses.replace(model, params=state.params), None,
                                 int(state.generation), key, trajectory_path)
        state = state.replace(generation=state.generation + 1)
        return state, StepResult(None, rewards, reward_statistics(rewards.rewards))


def make_rule(config: config_lib.TrainConfig) -> ESRule | FrozenRule:
    """The update rule ``config.update.name`` names."""
    if config.update.name == "es":
        return ESRule(config_lib.make_strategy(config), config_lib.run_key(config))
    return FrozenRule()
