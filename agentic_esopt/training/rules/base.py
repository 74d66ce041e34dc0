"""What every update rule shares: the step result and the hooks the loop calls.

A rule has ``init(params) -> state`` (a pytree with ``params`` and ``generation``, which
the loop checkpoints) and ``step(state, source, model, key, trajectory_path) -> (state,
StepResult)``, one generation. The optional hooks have defaults here: ``check_params``
(refuse parameters the rule cannot train), ``search_members`` (members that answer a
heuristic-search batch; None if the rule needs multi-turn episodes) and ``history`` (a
record of the run that resume can replay, ES's ``history.jsonl``).
"""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol

import jax
import numpy as np

from agentic_esopt.agents import sources

PyTree = Any


class StepResult(NamedTuple):
    """What one generation produced besides the new state.

    Attributes:
      population: the ES population (None for rules without one).
      rewards: the reward source's output.
      metrics: the rule's own metrics (σ, learning rate, update norm, reward statistics,
        estimated ``flops``).
    """

    population: Any
    rewards: sources.Rewards
    metrics: dict[str, Any]


def parameter_count(params: PyTree) -> int:
    """Numbers in a parameter tree (N of the 2·N FLOPs per token estimate)."""
    return sum(int(np.prod(leaf.shape)) for leaf in jax.tree.leaves(params))


def forward_flops(params: PyTree, tokens: float) -> float:
    """Estimated FLOPs of a forward pass over ``tokens`` tokens: 2·N per token."""
    return 2.0 * parameter_count(params) * tokens


def reward_statistics(rewards: np.ndarray) -> dict[str, float]:
    """Mean, std, max and min of one generation's member rewards."""
    return dict(reward_mean=float(np.mean(rewards)), reward_std=float(np.std(rewards)),
                reward_max=float(np.max(rewards)), reward_min=float(np.min(rewards)))


class HistoryRecorder(Protocol):
    """Appends each generation to a run's history."""

    def append(self, result: StepResult, wall_time_s: float) -> None:
        """Records one generation."""


class History(Protocol):
    """A rule's own record of a run, from which resume can rebuild the state."""

    def read(self) -> tuple[dict | None, list[dict], Exception | None]:
        """(header, intact generation records, the damage found or None)."""

    def replay(self, initial: Any, header: dict, records: list[dict]) -> Any:
        """The state after ``records``, rebuilt from the initial state."""

    def recorder(self, header: dict | None, records: list[dict],
                 config: dict) -> HistoryRecorder:
        """A recorder continuing after ``records`` (a new history if ``header`` is None)."""


class Rule:
    """The base of update rules: ``init`` and ``step`` to implement, hooks to override."""

    search_members: int | None = 1

    def init(self, params: PyTree) -> Any:
        raise NotImplementedError

    def step(self, state: Any, source: sources.RewardSource, model: Any, key: jax.Array,
             trajectory_path: str | None) -> tuple[Any, StepResult]:
        raise NotImplementedError

    def check_params(self, params: PyTree) -> None:
        """Raises ValueError if the rule cannot train ``params``."""
        del params

    def history(self, path: str) -> History | None:
        """The rule's history kept at ``path``; None for rules that keep none."""
        del path
        return None
