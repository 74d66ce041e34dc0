"""The text-environment protocol shared by every environment and the rollout engine.

An environment is a host-side Python object, text in and text out. Each episode owns one
instance, made by an ``EnvFactory``, so members and episodes never share mutable state.
Each environment defines its own frozen dataclass of a task; all the engine needs from a
task is its ``id``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple, Protocol, TypeVar

import numpy as np

from agentic_esopt import options as options_lib

T = TypeVar("T")


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

    # Optional: ``close()`` releases what the episode holds (a browser page, a sandbox
    # folder). The rollout engine calls it when the episode ends, also on error.
    # Optional: ``concurrent = True`` says that ``reset`` and ``step`` of different
    # instances may run at once in threads (they wait on other processes, e.g. browsers);
    # the rollout engine then issues all rows of a turn together.


EnvFactory = Callable[[], Environment]


class Closeable:
    """``close()`` and ``with`` support for a task source.

    A source that holds processes (browsers, sandboxes) releases them in ``close``; the
    default holds nothing. ``close`` may be called more than once, also after an error.
    """

    def close(self) -> None:
        """Releases what the source holds (nothing by default)."""

    def __enter__(self: T) -> T:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()


@dataclasses.dataclass(frozen=True)
class TaskSource(Closeable):
    """Everything a trainer needs from a multi-turn environment.

    ``with envs.make(...) as source:`` closes it on exit (see ``Closeable``).

    Attributes:
      env_factory: makes a fresh environment per episode.
      system_prompt: the system message of every conversation (None for none).
      train_tasks: generation -> that generation's training tasks, a pure function of
        (seed, generation), the same for every member.
      eval_tasks: the held-out tasks (disjoint from every generation's training tasks).
      stop: strings that end a reply (e.g. "Observation:" for a ReAct agent), on top of
        the run's own.
      on_close: releases what the episodes share (e.g. ``BrowserPool.close``); called
        by ``close``, so it must be safe to call again. None: nothing to release.
    """

    env_factory: EnvFactory
    system_prompt: str | None
    train_tasks: Callable[[int], Sequence[Any]]
    eval_tasks: Sequence[Any]
    stop: tuple[str, ...] = ()
    on_close: Callable[[], None] | None = None

    def close(self) -> None:
        """Calls ``on_close`` (when given): browsers and other shared processes end."""
        if self.on_close is not None:
            self.on_close()


class Splits(NamedTuple):
    """How many tasks a run takes from an environment, and from which splits.

    Attributes:
      seed: the run seed (task sampling derives from it).
      tasks_per_generation: training tasks per generation.
      eval_size: held-out tasks.
      eval_split: the held-out split, "eval" or "test" (never the training split).
    """

    seed: int = 0
    tasks_per_generation: int = 4
    eval_size: int = 32
    eval_split: str = "eval"


EVAL_SPLITS = ("eval", "test")


def split_problems(splits: Splits) -> list[str]:
    """Problems with the split sizes (the run's, checked by the trainer too)."""
    problems = []
    check = options_lib.checker(problems)
    check(splits.tasks_per_generation >= 1,
          f"tasks_per_generation must be >= 1, got {splits.tasks_per_generation}")
    check(splits.eval_size >= 1, f"eval_size must be >= 1, got {splits.eval_size}")
    check(splits.eval_split in EVAL_SPLITS, f"eval split must be one of {EVAL_SPLITS} "
                                            f"(never the training split), got "
                                            f"{splits.eval_split!r}")
    return problems


def stable_int(text: str) -> int:
    """A 64-bit integer hash of ``text`` that is the same in every process (task splits
    and ids derive from it; Python's ``hash`` is salted per process)."""
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")


def read_task_rows(path: str | Path, parse: Callable[[dict], T], what: str) -> list[T]:
    """``parse(row)`` of every JSON object of a JSONL task file (blank lines skipped).

    Raises:
      ValueError: naming the file, the line and ``what`` a row should be, when a line is
        not JSON or ``parse`` fails on it (ValueError, KeyError or TypeError).
    """
    parsed = []
    with open(path, encoding="utf-8") as f:
        for line_number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                parsed.append(parse(json.loads(line)))
            except (ValueError, KeyError, TypeError) as error:
                raise ValueError(f"{path}:{line_number}: not {what} "
                                 f"({type(error).__name__}: {error})") from error
    return parsed


def generation_seed(seed: int, generation: int) -> int:
    """A stable 32-bit seed for generation ``generation`` of a run seeded with ``seed``."""
    return int(np.random.SeedSequence([seed, generation]).generate_state(1)[0])


def sample_generation_tasks(pool: Sequence[Any], n: int, seed: int,
                            generation: int) -> list[Any]:
    """``n`` distinct tasks of ``pool`` for one generation (pool order kept)."""
    rng = np.random.default_rng([seed, generation])
    chosen = rng.choice(len(pool), size=n, replace=False)
    return [pool[i] for i in sorted(chosen)]
