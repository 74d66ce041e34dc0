"""An update rule defined outside the package: hill climbing with one perturbed member.

Each generation plays θ + σ ε (ε ~ N(0, I) from the generation's key) on the
generation's tasks and keeps it when its reward is at least the best so far. Registered
by ``config.py`` beside this file.
"""

import dataclasses
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from agentic_esopt import options
from agentic_esopt.training import rules


@dataclasses.dataclass(frozen=True)
class Options:
    """The ``rule`` section's fields besides ``name``."""

    sigma: float = options.field(1e-3, "Scale σ of the perturbation.")

    def problems(self) -> list[str]:
        return [] if self.sigma > 0 else [f"sigma must be > 0, got {self.sigma}"]


@flax.struct.dataclass
class State:
    """What the loop checkpoints: ``params`` and ``generation`` are required."""

    params: Any
    generation: jax.Array
    best: jax.Array  # The best reward so far.


def perturbed(params: Any, sigma: float, key: jax.Array) -> Any:
    """θ + σ ε, one normal draw per leaf."""
    leaves, treedef = jax.tree.flatten(params)
    keys = jax.random.split(key, len(leaves))
    return treedef.unflatten([leaf + sigma * jax.random.normal(k, leaf.shape, leaf.dtype)
                              for leaf, k in zip(leaves, keys)])


class HillClimb(rules.Rule):
    def __init__(self, options: Options):
        self.options = options

    def init(self, params: Any) -> State:
        return State(params, jnp.zeros((), jnp.int32), jnp.full((), -jnp.inf))

    def step(self, state, source, model, key, trajectory_path):
        candidate = perturbed(state.params, self.options.sigma, jax.random.fold_in(key, 1))
        rewards = source.rewards(dataclasses.replace(model, params=candidate), None,
                                 int(state.generation), key, trajectory_path)
        reward = float(rewards.rewards[0])  # One member: the candidate.
        if reward >= float(state.best):
            state = state.replace(params=candidate, best=jnp.asarray(reward))
        metrics = {**rules.reward_statistics(rewards.rewards), "best": float(state.best)}
        return (state.replace(generation=state.generation + 1),
                rules.StepResult(None, rewards, metrics))


def make(config: Any) -> HillClimb:
    return HillClimb(config.rule)
