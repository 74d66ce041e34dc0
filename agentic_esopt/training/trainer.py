"""The generic ES trainer: one generation, read top to bottom, and the loop around it.

Per generation t (``run_generation``): the generation's tasks (a function of (seed, t),
the same for every member); the population (``strategy.ask``); one batched rollout of
every (member, task) episode with sampling keys from (seed, t, turn); one mean reward per
member; the ES update (``strategy.tell``). The loop (``train``) records each generation in
the es history, metrics.jsonl, TensorBoard and the log; checkpoints every K generations;
evaluates the unperturbed parameters on held-out tasks at the start, every E generations
and at the end; and writes the reward curve and the summary. Rerunning the same config in
the same workdir resumes from the newest good checkpoint, bitwise.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import jax
import numpy as np
import tqdm
from absl import logging

from agentic_esopt import agents, es, models
from agentic_esopt.training import config as config_lib
from agentic_esopt.training import evaluation, report
from agentic_esopt.training import tasks as tasks_lib
from agentic_esopt.training.checkpoint import (Checkpointer, save_or_check_config,
                                               trim_run_files)
from agentic_esopt.training.config import TrainConfig
from agentic_esopt.training.files import RunFiles
from agentic_esopt.training.metrics import MetricsLogger, read_metrics


class Run(NamedTuple):
    """What stays fixed during a run."""

    config: TrainConfig
    model: models.Model
    strategy: es.Strategy
    source: tasks_lib.TaskSource
    files: RunFiles


class GenerationResult(NamedTuple):
    """What one generation produced besides the new state."""

    population: es.Population
    tasks: Sequence[Any]
    trajectories: list[agents.Trajectory]
    rewards: np.ndarray
    es_metrics: dict


class TrainResult(NamedTuple):
    """The final ES state and the run summary (see ``report.summarize``)."""

    state: es.ESState
    summary: dict


def run_generation(run: Run, state: es.ESState) -> tuple[es.ESState, GenerationResult]:
    """One ES generation: every member plays the same tasks, then the update."""
    config, generation = run.config, int(state.generation)
    tasks = run.source.train_tasks(generation)
    population = run.strategy.ask(state)
    policy = agents.make_model_policy(
        dataclasses.replace(run.model, params=state.params), population,
        temperature=config.temperature,
        key=config_lib.sampling_key(config, config_lib.TRAIN_SAMPLING_STREAM, generation),
        **config_lib.policy_options(config))
    trajectories = agents.run_episodes(
        run.source.env_factory, tasks, policy, range(config.population_size),
        system_prompt=run.source.system_prompt, generation=generation,
        max_turns=config.max_turns, trajectory_path=run.files.train_trajectories(generation))
    rewards = agents.member_rewards(trajectories, config.population_size)
    state, es_metrics = run.strategy.tell(state, population, rewards)
    return state, GenerationResult(population, tasks, trajectories, rewards, es_metrics)


def train_record(result: GenerationResult, wall_time_s: float) -> dict[str, float]:
    """The metrics line of one generation."""
    m = result.es_metrics
    return dict(
        reward_mean=float(m["reward_mean"]), reward_std=float(m["reward_std"]),
        reward_max=float(m["reward_max"]), reward_min=float(m["reward_min"]),
        success_rate=float(np.mean([t.solved for t in result.trajectories])),
        mean_turns=float(np.mean([t.num_turns for t in result.trajectories])),
        sigma=float(m["sigma"]), learning_rate=float(m["learning_rate"]),
        update_norm=float(m["update_norm"]), wall_time_s=wall_time_s)


def is_due(generations_done: int, every: int, total: int) -> bool:
    """Whether a periodic action (eval, checkpoint) happens after ``generations_done``."""
    return generations_done % every == 0 or generations_done == total


def check_scope(scope: str, params: Any) -> None:
    """Raises ValueError if ``scope`` selects no parameter leaf."""
    leaves = jax.tree_util.tree_flatten_with_path(params)[0]
    if not any(es.noise.in_scope(scope, jax.tree_util.keystr(path), leaf)
               for path, leaf in leaves):
        raise ValueError(f"scope {scope!r} matches no parameter; paths look like "
                         f"{jax.tree_util.keystr(leaves[0][0])}")


def train(config: TrainConfig,
          envs: Mapping[str, tasks_lib.EnvSpec] | None = None) -> TrainResult:
    """Trains (or resumes training) as ``config`` says; see the module docstring.

    Args:
      config: the run; ``config.workdir`` receives every output.
      envs: the environments by name (default ``tasks.ENVS``).

    Returns:
      The final state and the summary.
    """
    envs = tasks_lib.ENVS if envs is None else envs
    config.validate(envs)
    source = envs[config.env].make_source(config)
    files = RunFiles(config.workdir)
    save_or_check_config(files, config)
    model = models.load(config.model, dtype=config.dtype)
    check_scope(config.scope, model.params)
    strategy = config_lib.make_strategy(config)
    run = Run(config, model, strategy, source, files)

    with contextlib.ExitStack() as closing:
        checkpointer = closing.enter_context(contextlib.closing(
            Checkpointer(files.checkpoints)))
        state = strategy.init(config_lib.run_key(config), model.params)
        restored = checkpointer.restore_latest(state,
                                               quarantine_dir=files.corrupt_checkpoints)
        state = state if restored is None else restored
        start, total = int(state.generation), config.generations
        if start:
            logging.info("resuming %s after generation %d of %d", files.workdir, start, total)
        history = trim_run_files(files, start, strategy, state.key, config)
        logger = closing.enter_context(contextlib.closing(
            MetricsLogger(files.metrics, files.tensorboard, purge_step=start)))

        def evaluate_and_log(params: Any, generations_done: int) -> None:
            began = time.time()
            statistics = evaluation.evaluate(model, params, source, config, generations_done,
                                             files.eval_trajectories(generations_done))
            logger.log("eval", generations_done, {**statistics,
                                                  "wall_time_s": time.time() - began})

        if is_due(start, config.eval_every, total):
            evaluate_and_log(state.params, start)
        bar = closing.enter_context(tqdm.tqdm(total=total, initial=start,
                                              desc="ES generations", unit="gen"))
        for generation in range(start, total):
            began = time.time()
            state, result = run_generation(run, state)
            wall_time_s = time.time() - began
            history.append(result.population, result.rewards, result.es_metrics,
                           wall_time_s, task_ids=[str(t.id) for t in result.tasks])
            record = logger.log("train", generation, train_record(result, wall_time_s))
            bar.set_postfix(reward=f"{record['reward_mean']:.3f}")
            bar.update()
            if is_due(generation + 1, config.checkpoint_every, total):
                checkpointer.save(state)
            if is_due(generation + 1, config.eval_every, total):
                evaluate_and_log(state.params, generation + 1)

    records = read_metrics(files.metrics)
    report.plot_reward_curve(records, files.reward_curve)
    summary = report.summarize(records)
    report.write_summary(summary, files.summary_json, files.summary_markdown)
    logging.info("wrote %s, %s and %s", files.reward_curve, files.summary_json,
                 files.summary_markdown)
    return TrainResult(state, summary)
