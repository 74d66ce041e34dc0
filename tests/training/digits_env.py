"""A one-turn toy environment a tiny random model scores on: the digit share of its reply.

Sudoku gives a random tiny model reward 0 everywhere, so ES updates are exactly zero;
tests that need parameters to move (resume, replay) train on this instead. Importing this
module registers it as "digits".
"""

import dataclasses

from agentic_esopt import envs, training
from agentic_esopt.envs.base import StepResult


@dataclasses.dataclass(frozen=True)
class DigitsTask:
    id: str


class DigitsEnv:
    """Reward: the fraction of the reply's characters that are digits; one turn."""

    def reset(self, task, *, max_turns=None):
        del max_turns
        return f"Task {task.id}: reply with digits only."

    def step(self, action_text):
        reward = sum(c.isdigit() for c in action_text) / max(len(action_text), 1)
        return StepResult("Thanks.", reward, True, {"solved": reward == 1.0})


@dataclasses.dataclass(frozen=True)
class Options:
    """The digits environment has no options."""

    def problems(self):
        return []


def make_source(options, splits):
    del options
    return envs.TaskSource(
        env_factory=DigitsEnv, system_prompt=None,
        train_tasks=lambda g: [DigitsTask(f"train-{g}-{i}")
                               for i in range(splits.tasks_per_generation)],
        eval_tasks=[DigitsTask(f"eval-{i}") for i in range(splits.eval_size)])


envs.registry.register("digits", __name__)

# Tiny settings under which members' replies differ (large σ), so updates are non-zero;
# training and evaluation batches share shapes and sampling mode, so compile once.
TINY_VALUES = dict(
    env=dict(name="digits"), model=dict(name="tiny"),
    es=dict(population_size=4, sigma_schedule="constant", sigma_start=0.5, sigma_end=0.5,
            learning_rate=0.05),
    rollout=dict(tasks_per_generation=2, max_new_tokens=4, temperature=1.0),
    eval=dict(size=2, temperature=1.0),
    run=dict(generations=3, eval_every=2, checkpoint_every=1, seed=3))
TINY = training.TrainConfig.from_dict(TINY_VALUES)
