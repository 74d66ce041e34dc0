"""Update rules: how rewards from a reward source become new parameters.

An update rule has ``init(params) -> state`` (a pytree with ``params`` and
``generation``, checkpointed by the trainer) and ``step(state, source, model, key,
trajectory_path) -> (state, StepResult)``: one generation. Rules are chosen by
``update.name``:

* ``es``: Agentic ESOpt. ask → every member's reward from the source → tell.
* ``grpo``: the policy-gradient baseline: G sampled episodes per task → group advantages
  → AdamW on the clipped loss over every turn (``training.grpo``).
* ``none``: the unperturbed policy acts and nothing is learned (the baseline of a
  search without ES, e.g. EoH or Sample alone).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, NamedTuple

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

import optax

from agentic_esopt import es
from agentic_esopt.agents import sources
from agentic_esopt.models import sampling
from agentic_esopt.training import config as config_lib
from agentic_esopt.training import grpo

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


@dataclasses.dataclass(frozen=True)
class GRPORule:
    """GRPO: G sampled episodes per task, group advantages, AdamW on every turn.

    Attributes:
      options: the ``update`` section (group size, AdamW, ε, β, mini-batches, remat).
      temperature: the rollout temperature (that of the log-probabilities).
      shuffle_key: seeds each step's mini-batch order (folded with the generation).
    """

    options: config_lib.UpdateOptions
    temperature: float
    shuffle_key: jax.Array
    writes_history = False

    @functools.cached_property
    def optimizer(self) -> optax.GradientTransformation:
        return grpo.make_optimizer(self.options.learning_rate, self.options.weight_decay,
                                   self.options.max_grad_norm)

    def init(self, params: PyTree) -> grpo.GRPOState:
        """The policy starts as a copy of ``params``, which stay the frozen reference."""
        return grpo.GRPOState(params=jax.tree.map(jnp.copy, params),
                              opt_state=self.optimizer.init(params), reference=params,
                              generation=jnp.zeros((), jnp.int32))

    def step(self, state: grpo.GRPOState, source: sources.EpisodeRewards, model: Any,
             key: jax.Array, trajectory_path: str | None
             ) -> tuple[grpo.GRPOState, StepResult]:
        generation, group_size = int(state.generation), self.options.group_size
        trajectories = source.samples(dataclasses.replace(model, params=state.params),
                                      group_size, generation, key, trajectory_path)
        advantages = grpo.trajectory_advantages(trajectories, group_size)
        examples = grpo.turn_examples(trajectories, advantages)
        hyper = grpo.Hyper(self.temperature, self.options.clip_epsilon, self.options.kl_beta,
                           self.options.remat)
        params, opt_state, metrics = grpo.learn(
            model.config, hyper, self.optimizer, state.params, state.opt_state,
            state.reference, examples, self.options.minibatch_size, self.options.epochs,
            sampling.pad_id(model.config, model.tokenizer),
            jax.random.fold_in(self.shuffle_key, generation))
        rewards = np.array([t.total_reward for t in trajectories], np.float64)
        first_sample = trajectories[:len(trajectories) // group_size]
        metrics = {**reward_statistics(rewards), **metrics,
                   "learning_rate": self.options.learning_rate,
                   "num_examples": float(len(examples)),
                   "zero_advantage_fraction": float(np.mean(advantages == 0))}
        state = state.replace(params=params, opt_state=opt_state,
                              generation=state.generation + 1)
        return state, StepResult(None, sources.Rewards(
            rewards, [t.task_id for t in first_sample], sources.training_metrics(trajectories)),
                                 metrics)


def make_rule(config: config_lib.TrainConfig) -> ESRule | GRPORule | FrozenRule:
    """The update rule ``config.update.name`` names."""
    if config.update.name == "es":
        return ESRule(config_lib.make_strategy(config), config_lib.run_key(config))
    if config.update.name == "grpo":
        return GRPORule(config.update, config.rollout.temperature,
                        config_lib.stream_key(config, config_lib.GRPO_SHUFFLE_STREAM))
    return FrozenRule()
