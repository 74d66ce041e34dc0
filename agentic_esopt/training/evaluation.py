"""Held-out evaluation of a workdir's parameters (latest checkpoint or the base model)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from agentic_esopt import models
from agentic_esopt.training import config as config_lib, report
from agentic_esopt.training.checkpoint import load_config, restore_workdir_state
from agentic_esopt.training.files import RunFiles
from agentic_esopt.training.trainer import make_reward_source

EVAL_OVERRIDES = ("size", "split", "temperature")


def evaluate_workdir(workdir: str, base: bool = False,
                     eval_overrides: Mapping[str, Any] | None = None,
                     skill: str | None = None) -> dict[str, Any]:
    """Evaluates a training workdir's latest checkpoint (or its base model).

    Nothing in the workdir is modified. Every evaluation of a run samples with the same
    key, so this one is paired with the run's own evaluations.

    Args:
      workdir: a folder made by ``training.train``.
      base: evaluate the model before training instead of the latest checkpoint.
      eval_overrides: ``eval`` settings to change, e.g. {"split": "test", "size": 64}.
      skill: a skill file appended to the system prompt (``rollout.skill``).

    Returns:
      The statistics with the workdir, the evaluated generation and the settings.
    """
    files = RunFiles(workdir)
    config = load_config(files)
    unknown = sorted(set(eval_overrides or {}) - set(EVAL_OVERRIDES))
    if unknown:
        raise ValueError(f"cannot override eval {unknown}; only {list(EVAL_OVERRIDES)}")
    config = config.replace(eval=dict(eval_overrides or {}), rollout={"skill": skill})
    model = models.load(config.model.name, dtype=config.model.dtype,
                        cache_layout=config.model.cache_layout)
    if base:
        params, generation = model.params, 0
    else:
        state = restore_workdir_state(files, config, model.params)
        if state is None:
            raise FileNotFoundError(f"no usable checkpoint in {files.checkpoints}")
        params, generation = state.params, int(state.generation)
    source = make_reward_source(config, files, models.generate)
    key = config_lib.sampling_key(config, config_lib.EVAL_SAMPLING_STREAM, 0)
    statistics = source.evaluate(dataclasses.replace(model, params=params), key, generation,
                                 None)
    return dict(workdir=workdir, params="base" if base else "latest", generation=generation,
                model=config.model.name, eval_split=config.eval.split,
                eval_temperature=config.eval.temperature, skill=skill, **statistics)


def evaluate_skill_effect(workdir: str, skill: str, base: bool = False,
                          eval_overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Evaluates a workdir's parameters without and with a skill, on the same tasks with
    the same sampling key: both evaluations and the skill's effect (``report.compare``:
    the differences in pooled and paired s.e.). A bad skill path fails before any
    evaluation."""
    with_skill = evaluate_workdir(workdir, base, eval_overrides, skill)
    without = evaluate_workdir(workdir, base, eval_overrides)
    return dict(without_skill=without, with_skill=with_skill,
                skill_effect=report.compare(without, with_skill))
