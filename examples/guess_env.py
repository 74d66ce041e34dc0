"""An environment defined outside the package: say the number the task asks for.

One turn per episode: the observation asks for a number below ``10 ** level``; the
reward is 1 when the reply contains it. Registered by ``config.py`` beside this file.
"""

import dataclasses

from agentic_esopt import envs, options


@dataclasses.dataclass(frozen=True)
class Options:
    """The ``env`` section's fields besides ``name``."""

    level: int = options.field(1, "Digits of the number to say.")

    def problems(self) -> list[str]:
        return [] if self.level >= 1 else [f"level must be >= 1, got {self.level}"]


@dataclasses.dataclass(frozen=True)
class Task:
    """A task: its stable ``id`` (all the rollout engine needs) and the number."""

    id: str
    number: int


class GuessEnv:
    """One episode; ``max_turns`` is None unless ``rollout.max_turns`` is set."""

    def reset(self, task: Task, *, max_turns: int | None = None) -> str:
        self.task = task
        return f"Reply with the number {task.number} and nothing else."

    def step(self, text: str) -> envs.StepResult:
        solved = str(self.task.number) in text
        return envs.StepResult("Done.", float(solved), True, {"solved": solved})


def tasks(options: Options, seed: int, split: str, count: int) -> list[Task]:
    """``count`` tasks of a split, a pure function of (seed, split)."""
    return [Task(f"{split}-{i}", envs.base.stable_int(f"{seed}/{split}/{i}") % 10**options.level)
            for i in range(count)]


def make_source(options: Options, splits: envs.Splits) -> envs.TaskSource:
    return envs.TaskSource(
        env_factory=GuessEnv, system_prompt="You answer with numbers.",
        train_tasks=lambda generation: tasks(options, splits.seed, f"train{generation}",
                                             splits.tasks_per_generation),
        eval_tasks=tasks(options, splits.seed, splits.eval_split, splits.eval_size))
