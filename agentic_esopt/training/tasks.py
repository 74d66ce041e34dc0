"""Task sources: what each environment contributes to the generic trainer.

A ``TaskSource`` gives the trainer an environment factory, a system prompt, the training
tasks of each generation (a pure function of (seed, generation), the same for every
member) and a fixed held-out evaluation set that training never sees. Environments are
looked up by name in a mapping of ``EnvSpec``s (``ENVS`` by default); callers may pass
their own mapping to train on other environments.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from agentic_esopt.envs import base, sudoku

if TYPE_CHECKING:
    from agentic_esopt.training.config import TrainConfig


class TaskSource(NamedTuple):
    """Everything the trainer needs from an environment.

    Attributes:
      env_factory: makes a fresh environment per episode.
      system_prompt: the system message of every conversation (None for none).
      train_tasks: generation -> that generation's training tasks.
      eval_tasks: the held-out tasks (disjoint from every generation's training tasks).
    """

    env_factory: base.EnvFactory
    system_prompt: str | None
    train_tasks: Callable[[int], Sequence[Any]]
    eval_tasks: Sequence[Any]


class EnvSpec(NamedTuple):
    """An environment the trainer can run.

    Attributes:
      problems: config -> list of problems with the env-specific fields (cheap, no I/O
        beyond checking that files exist).
      make_source: config -> ``TaskSource`` (may read or generate tasks).
    """

    problems: Callable[[TrainConfig], list[str]]
    make_source: Callable[[TrainConfig], TaskSource]


def generation_seed(seed: int, generation: int) -> int:
    """A stable 32-bit seed for generation ``generation`` of a run seeded with ``seed``."""
    return int(np.random.SeedSequence([seed, generation]).generate_state(1)[0])


def sample_generation_tasks(pool: Sequence[Any], n: int, seed: int,
                            generation: int) -> list[Any]:
    """``n`` distinct tasks of ``pool`` for one generation (file order kept)."""
    rng = np.random.default_rng([seed, generation])
    chosen = rng.choice(len(pool), size=n, replace=False)
    return [pool[i] for i in sorted(chosen)]


def sudoku_problems(config: TrainConfig) -> list[str]:
    """Problems with the Sudoku fields of ``config``."""
    size = config.board_size
    if size not in sudoku.BOX_SHAPES:
        return [f"board_size must be one of {sorted(sudoku.BOX_SHAPES)}, got {size}"]
    problems = []
    most_blanks = size ** 2 - sudoku.MIN_GIVENS[size]
    if not 1 <= config.mask_count <= most_blanks:
        problems.append(f"mask_count must be in [1, {most_blanks}] on a {size}×{size} board "
                        f"(a unique solution needs {sudoku.MIN_GIVENS[size]} givens), got "
                        f"{config.mask_count}")
    if config.anchor_path is not None:
        for split in ("train", config.eval_split):
            path = os.path.join(config.anchor_path, f"{split}.jsonl")
            if not os.path.isfile(path):
                problems.append(f"anchor_path {config.anchor_path!r} has no {split}.jsonl "
                                f"(looked for {path})")
    return problems


def _anchor_tasks(config: TrainConfig, split: str, needed: int) -> list[sudoku.SudokuTask]:
    path = os.path.join(config.anchor_path, f"{split}.jsonl")
    loaded = sudoku.load_anchor_tasks(path, mask_count=config.mask_count)
    wrong_size = [t.id for t in loaded if t.size != config.board_size]
    if wrong_size:
        raise ValueError(f"{path}: tasks {wrong_size[:3]} are not {config.board_size}×"
                         f"{config.board_size}; set board_size to match the anchor file")
    if len(loaded) < needed:
        raise ValueError(f"{path} has {len(loaded)} tasks with mask_count="
                         f"{config.mask_count}, fewer than the {needed} needed")
    return loaded


def sudoku_source(config: TrainConfig) -> TaskSource:
    """Sudoku tasks: generated (train / held-out splits never share a grid) or anchors."""
    if config.anchor_path is not None:
        pool = _anchor_tasks(config, "train", config.tasks_per_generation)
        eval_tasks = _anchor_tasks(config, config.eval_split, config.eval_size)
        eval_tasks = eval_tasks[:config.eval_size]
        train_tasks = functools.partial(sample_generation_tasks, pool,
                                        config.tasks_per_generation, config.seed)
    else:
        eval_tasks = sudoku.generate_tasks(config.eval_size, config.board_size,
                                           config.mask_count, seed=config.seed,
                                           split=config.eval_split)

        def train_tasks(generation: int) -> list[sudoku.SudokuTask]:
            return sudoku.generate_tasks(config.tasks_per_generation, config.board_size,
                                         config.mask_count,
                                         seed=generation_seed(config.seed, generation),
                                         split="train")

    train_tasks(0)  # Fails now, before any compute, if the setting cannot make tasks.
    return TaskSource(env_factory=functools.partial(
                          sudoku.SudokuEnv, partial_credit=config.partial_credit,
                          list_legal_moves=config.list_legal_moves),
                      system_prompt=sudoku.system_prompt(config.board_size), train_tasks=train_tasks,
                      eval_tasks=eval_tasks)


ENVS: Mapping[str, EnvSpec] = {"sudoku": EnvSpec(sudoku_problems, sudoku_source)}
