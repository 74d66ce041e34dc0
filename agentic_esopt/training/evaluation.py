"""Held-out evaluation of the unperturbed parameters: mean reward and success rate ± s.e."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from agentic_esopt import agents, models
from agentic_esopt.training import config as config_lib
from agentic_esopt.training import tasks as tasks_lib
from agentic_esopt.training.checkpoint import load_config, restore_workdir_state
from agentic_esopt.training.files import RunFiles

PyTree = Any


def mean_and_standard_error(values: Sequence[float]) -> tuple[float, float]:
    """Sample mean and its standard error std(ddof=1)/√n (0 for a single value)."""
    values = np.asarray(values, dtype=np.float64)
    if values.size == 0:
        raise ValueError("need at least one value")
    if values.size == 1:
        return float(values[0]), 0.0
    return float(values.mean()), float(values.std(ddof=1) / np.sqrt(values.size))


def episode_statistics(trajectories: Sequence[agents.Trajectory]) -> dict[str, Any]:
    """Mean total reward and success rate of episodes, each with its standard error.

    The per-episode task ids, rewards and outcomes are kept too, so that two evaluations
    of the same tasks can be compared pairwise (``report.summarize``).
    """
    mean_reward, mean_reward_se = mean_and_standard_error(
        [t.total_reward for t in trajectories])
    success_rate, success_rate_se = mean_and_standard_error(
        [float(t.solved) for t in trajectories])
    return dict(num_episodes=len(trajectories), mean_reward=mean_reward,
                mean_reward_se=mean_reward_se, success_rate=success_rate,
                success_rate_se=success_rate_se,
                mean_turns=float(np.mean([t.num_turns for t in trajectories])),
                episode_task_ids=[t.task_id for t in trajectories],
                episode_rewards=[t.total_reward for t in trajectories],
                episode_solved=[float(t.solved) for t in trajectories])


def evaluate(model: models.Model, params: PyTree, source: tasks_lib.TaskSource,
             config: config_lib.TrainConfig, generation: int,
             trajectory_path: str | None = None) -> dict[str, Any]:
    """Plays every held-out task once with ``params`` (no perturbation).

    Every evaluation of a run samples with the same key, so evaluations at different
    generations differ only by their parameters (paired comparisons).

    Args:
      model: the loaded model (its params are replaced by ``params``).
      params: the parameters to evaluate.
      source: gives the environment, system prompt and held-out tasks.
      config: rollout settings (``policy_options``, eval_temperature, max_turns) and the
        seed of the sampling key.
      generation: completed generations behind ``params`` (recorded in the episodes).
      trajectory_path: optional JSONL file for the episodes.

    Returns:
      ``episode_statistics`` of the held-out episodes.
    """
    policy = agents.make_model_policy(
        dataclasses.replace(model, params=params), None, temperature=config.eval_temperature,
        key=config_lib.sampling_key(config, config_lib.EVAL_SAMPLING_STREAM, 0),
        **config_lib.policy_options(config))
    trajectories = agents.run_episodes(
        source.env_factory, source.eval_tasks, policy, [0],
        system_prompt=source.system_prompt, generation=generation,
        max_turns=config.max_turns, trajectory_path=trajectory_path)
    return episode_statistics(trajectories)


def evaluate_workdir(workdir: str, base: bool = False,
                     overrides: Mapping[str, Any] | None = None,
                     envs: Mapping[str, tasks_lib.EnvSpec] | None = None) -> dict[str, Any]:
    """Evaluates a training workdir's latest checkpoint (or its base model).

    Nothing in the workdir is modified.

    Args:
      workdir: a folder made by ``training.train``.
      base: evaluate the model before training instead of the latest checkpoint.
      overrides: evaluation settings to change, e.g. {"eval_split": "test",
        "eval_size": 64, "eval_temperature": 0.0}.
      envs: the environments (default ``tasks.ENVS``).

    Returns:
      The statistics with the workdir, the evaluated generation and the settings.
    """
    envs = tasks_lib.ENVS if envs is None else envs
    files = RunFiles(workdir)
    config = load_config(files)
    allowed = {"eval_split", "eval_size", "eval_temperature"}
    unknown = sorted(set(overrides or {}) - allowed)
    if unknown:
        raise ValueError(f"cannot override {unknown} for evaluation; only {sorted(allowed)}")
    config = dataclasses.replace(config, **(overrides or {})).validate(envs)
    source = envs[config.env].make_source(config)
    model = models.load(config.model, dtype=config.dtype)
    if base:
        params, generation = model.params, 0
    else:
        state = restore_workdir_state(files, config, model.params)
        if state is None:
            raise FileNotFoundError(f"no usable checkpoint in {files.checkpoints}")
        params, generation = state.params, int(state.generation)
    statistics = evaluate(model, params, source, config, generation)
    return dict(workdir=workdir, params="base" if base else "latest", generation=generation,
                model=config.model, eval_split=config.eval_split,
                eval_temperature=config.eval_temperature, **statistics)
