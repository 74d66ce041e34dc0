"""The text-environment protocol shared by every environment and the rollout engine.

An environment is a host-side Python object, text in and text out. Each episode owns one
instance, made by an ``EnvFactory``, so members and episodes never share mutable state.
Each environment defines its own frozen dataclass of a task; all the engine needs from a
task is its ``id``.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Protocol


class Task(Protocol):
    """What the rollout engine needs from any environment's task record."""

    @property
    def id(self) -> str:
        """A stable identifier, unique within a task set."""


class StepResult(NamedTuple):
    """What ``step`` returns; unpacks as ``(observation, reward, done, info)``.

    ``info`` must be JSON-serialisable (trajectories are written as JSONL); by convention
    it carries ``"solved": bool`` on the final step.
    """

    observation: str
    reward: float
    done: bool
    info: dict[str, Any]


class Environment(Protocol):
    """One episode of a text environment.

    ``reset`` starts the episode on ``task`` and returns the first observation. The episode
    lasts at most ``min(the environment's own turn limit, max_turns)`` steps: the step
    that reaches the limit returns ``done=True`` with the terminal reward. Malformed actions
    are feedback in the observation, never exceptions.
    """

    def reset(self, task: Any, *, max_turns: int | None = None) -> str:
        """Starts an episode on ``task``; returns the first observation."""

    def step(self, action_text: str) -> StepResult:
        """Applies one action given as free text."""


EnvFactory = Callable[[], Environment]
