"""GRPO as an update rule: G sampled episodes per task, group advantages, AdamW on the
clipped loss over every turn (the mathematics is ``training.grpo``).

Its settings are the ``rule`` section (``--config.rule.name=grpo
--config.rule.learning_rate=1e-6 ...``); tasks per step are
``rollout.tasks_per_generation`` and the sampling temperature is ``rollout.temperature``.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from agentic_esopt import options as options_lib
from agentic_esopt.agents import sources
from agentic_esopt.models import sampling
from agentic_esopt.training import config as config_lib
from agentic_esopt.training import grpo
from agentic_esopt.training.rules.base import (Rule, StepResult, forward_flops,
                                               reward_statistics)

PyTree = Any


@dataclasses.dataclass(frozen=True)
class Options:
    """GRPO's settings (the ``rule`` section besides ``name``)."""

    group_size: int = options_lib.field(8, "Sampled episodes per task (G); tasks per step "
                                           "are rollout.tasks_per_generation.")
    learning_rate: float = options_lib.field(1e-6, "AdamW learning rate.")
    weight_decay: float = options_lib.field(0.0, "AdamW decoupled weight decay.")
    clip_epsilon: float = options_lib.field(0.2, "Ratio clip ε, ρ ∈ [1-ε, 1+ε].")
    kl_beta: float = options_lib.field(1e-3, "Weight β of the k3 KL estimate against the "
                                             "frozen initial parameters.")
    minibatch_size: int = options_lib.field(8, "Turns (prompt + reply sequences) per "
                                               "optimiser step.")
    epochs: int = options_lib.field(1, "Passes over a step's turns.")
    max_grad_norm: float = options_lib.field(1.0, "Clip the gradient's global norm "
                                                  "(0 = off).")
    remat: bool = options_lib.field(True, "Recompute layer activations in the backward "
                                          "pass (gradient checkpointing).")

    def problems(self) -> list[str]:
        problems: list[str] = []
        check = options_lib.checker(problems)
        check(self.group_size >= 2, f"group_size must be >= 2 (advantages compare samples "
                                    f"of a task), got {self.group_size}")
        check(self.learning_rate > 0, f"learning_rate must be > 0, got {self.learning_rate}")
        check(self.weight_decay >= 0, f"weight_decay must be >= 0, got {self.weight_decay}")
        check(self.clip_epsilon > 0, f"clip_epsilon must be > 0, got {self.clip_epsilon}")
        check(self.kl_beta >= 0, f"kl_beta must be >= 0, got {self.kl_beta}")
        check(self.minibatch_size >= 1,
              f"minibatch_size must be >= 1, got {self.minibatch_size}")
        check(self.epochs >= 1, f"epochs must be >= 1, got {self.epochs}")
        check(self.max_grad_norm >= 0,
              f"max_grad_norm must be >= 0, got {self.max_grad_norm}")
        return problems


def config_problems(sections: Mapping[str, Any]) -> list[str]:
    """GRPO samples a group per task, on one process."""
    problems: list[str] = []
    check = options_lib.checker(problems)
    check(sections["rollout"].temperature > 0,
          "rule.name=grpo samples a group per task: rollout.temperature must be > 0")
    distributed = sections["distributed"]
    check((distributed.num_processes or 1) == 1 and not distributed.auto,
          "rule.name=grpo runs on one process (its turns are not gathered across hosts)")
    return problems


@dataclasses.dataclass(frozen=True)
class GRPORule(Rule):
    """GRPO (see the module docstring).

    Attributes:
      options: the ``rule`` section.
      temperature: the rollout temperature (that of the log-probabilities).
      shuffle_key: seeds each step's mini-batch order (folded with the generation).
    """

    options: Options
    temperature: float
    shuffle_key: jax.Array
    search_members = None  # GRPO trains on multi-turn episodes' tokens.

    @functools.cached_property
    def optimizer(self) -> optax.GradientTransformation:
        return grpo.make_optimizer(self.options.learning_rate, self.options.weight_decay,
                                   self.options.max_grad_norm)

    def flops(self, params: PyTree, rollout_tokens: int, examples) -> float:
        """Estimated FLOPs of a step: the rollouts' forward passes, then per epoch over
        every turn the reference's forward pass and the loss's forward and backward
        passes (backward = 2 × forward), and with ``remat`` the forward pass the backward
        pass recomputes."""
        turn_tokens = sum(len(turn.prompt_ids) + len(turn.reply_ids) for turn, _ in examples)
        passes = 4 + int(self.options.remat)
        return forward_flops(params, rollout_tokens + passes * self.options.epochs * turn_tokens)

    def init(self, params: PyTree) -> grpo.GRPOState:
        """The policy starts as a copy of ``params``, which stay the frozen reference."""
        return grpo.GRPOState(params=jax.tree.map(jnp.copy, params),
                              opt_state=self.optimizer.init(params), reference=params,
                              generation=jnp.zeros((), jnp.int32))

    def step(self, state: grpo.GRPOState, source: sources.EpisodeRewards, model: Any,
             key: jax.Array, trajectory_path: str | None
             ) -> tuple[grpo.GRPOState, StepResult]:
        generation, group_size = int(state.generation), self.options.group_size
        trajectories, rollout_tokens = source.samples(
            dataclasses.replace(model, params=state.params), group_size, generation, key,
            trajectory_path)
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
                   "flops": self.flops(state.params, rollout_tokens, examples),
                   "zero_advantage_fraction": float(np.mean(advantages == 0))}
        state = state.replace(params=params, opt_state=opt_state,
                              generation=state.generation + 1)
        return state, StepResult(None, sources.Rewards(
            rewards, [t.task_id for t in first_sample], sources.training_metrics(trajectories)),
                                 metrics)


def make(config: Any) -> GRPORule:
    """The GRPO rule of a ``TrainConfig``."""
    return GRPORule(config.rule, config.rollout.temperature,
                    config_lib.stream_key(config, config_lib.GRPO_SHUFFLE_STREAM))
