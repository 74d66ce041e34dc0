"""The rule that learns nothing: the unperturbed policy acts, parameters never change
(the baseline of a heuristic search without ES, e.g. EoH or Sample alone)."""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from agentic_esopt.agents import sources
from agentic_esopt.training.rules.base import (Rule, StepResult, forward_flops,
                                               reward_statistics)

PyTree = Any


@dataclasses.dataclass(frozen=True)
class Options:
    """The frozen rule has no options."""


@flax.struct.dataclass
class FrozenState:
    """The parameters and the generation."""

    params: PyTree
    generation: jax.Array


@dataclasses.dataclass(frozen=True)
class FrozenRule(Rule):
    """The unperturbed policy answers every generation; nothing is learned."""

    def init(self, params: PyTree) -> FrozenState:
        return FrozenState(params, jnp.zeros((), jnp.int32))

    def step(self, state: FrozenState, source: sources.RewardSource, model: Any,
             key: jax.Array, trajectory_path: str | None) -> tuple[FrozenState, StepResult]:
        rewards = source.rewards(dataclasses.replace(model, params=state.params), None,
                                 int(state.generation), key, trajectory_path)
        flops = forward_flops(state.params, rewards.metrics.get("forward_tokens", 0.0))
        state = state.replace(generation=state.generation + 1)
        return state, StepResult(None, rewards, {**reward_statistics(rewards.rewards),
                                                 "flops": flops})


def make(config: Any) -> FrozenRule:
    del config
    return FrozenRule()
