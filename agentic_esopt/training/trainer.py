"""The one run loop: any update rule × any reward source, with resume and reports.

Per generation t the update rule asks the reward source for rewards (ES: the population
around θ_t plays the generation's tasks, or answers one search batch) and applies its
update. The loop records each generation in the rule's history (ES's), metrics.jsonl,
TensorBoard and the log; checkpoints the rule's state and the source's state every K
generations; evaluates the unperturbed parameters at the start (unless given another run's
evaluation of the same untrained model), every E generations and at the end; and writes the reward curve and the summary. Rerunning the same config in the
same workdir resumes from the newest good checkpoint, bitwise.

Parameters are placed on the run's mesh as its sharding rules say (``config.mesh``). On
several processes every process runs this loop: each derives the same population, plays
its own members (the reward source gathers every member's rewards), applies the same
update and takes part in every checkpoint; only process 0 writes the workdir's files.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import time
from typing import Any, NamedTuple

import jax
import numpy as np
import tqdm
from absl import logging

from agentic_esopt import agents, envs, models, sharding
from agentic_esopt.agents import eoh
from agentic_esopt.training import config as config_lib
from agentic_esopt.training import report, rules
from agentic_esopt.training.checkpoint import Checkpointer, resume, save_or_check_config
from agentic_esopt.training.config import TrainConfig
from agentic_esopt.training.files import RunFiles
from agentic_esopt.training.metrics import MetricsLogger, read_metrics


class TrainResult(NamedTuple):
    """The final update-rule state and the run summary (see ``report.summarize``)."""

    state: Any
    summary: dict


def make_reward_source(config: TrainConfig, files: RunFiles,
                       generate: agents.rollout.Generate,
                       search_members: int | None = 1) -> agents.sources.RewardSource:
    """The reward source of ``config.env``: episodes, or a heuristic search for AHD.

    Args:
      config: the run.
      files: the workdir's files (a search keeps its programs log there).
      generate: ``models.generate`` or a stand-in.
      search_members: members that answer a search batch (the rule's
        ``search_members``; None: the rule needs multi-turn episodes).
    """
    source = envs.registry.make_from_options(config.env_name, config.env, config.splits)
    if isinstance(source, envs.TaskSource):
        return agents.sources.EpisodeRewards(source, config.rollout, config.eval.temperature,
                                             generate, config.eval.repeats,
                                             config.eval.batch_size)
    if search_members is None:
        settings = f"rule.name={config.rule_name}" + (
            ", es.task_normalised" if config.rule_name == "es" else "")
        raise ValueError(f"{settings} needs multi-turn episodes; environment "
                         f"{config.env_name!r} is a heuristic search")
    if jax.process_count() > 1:
        raise ValueError(f"environment {config.env_name!r} is a heuristic search, which "
                         "runs on one process")
    budget = sys.maxsize  # run.generations bounds the search: one batch per generation
    if config.env.search == "eoh":
        search = eoh.EoHConfig(population_size=config.env.eoh_population, budget=budget,
                               offspring_per_operator=config.es.population_size,
                               num_members=search_members)
    else:
        search = eoh.SampleConfig(
            budget=budget, batch_size=config.es.population_size * config.env.samples_per_member,
            num_members=search_members)
    return agents.sources.SearchRewards(source, search, config.rollout, generate,
                                        files.workdir, config.run.seed)


def is_due(generations_done: int, every: int, total: int) -> bool:
    """Whether a periodic action (eval, checkpoint) happens after ``generations_done``."""
    return generations_done % every == 0 or generations_done == total


def placed_model(config: TrainConfig, model: models.Model | None,
                 layout: sharding.Layout | None) -> models.Model:
    """``model`` (default: ``config.model`` loaded) with its parameters on the layout and
    ``config.model.cache_layout``."""
    if model is None:
        return models.load(config.model.name, dtype=config.model.dtype,
                           shardings=layout and layout.shardings,
                           cache_layout=config.model.cache_layout)
    if layout is not None:
        model = dataclasses.replace(model, params=layout.place(model.params))
    return model.with_cache_layout(config.model.cache_layout)


def train_record(result: rules.StepResult, wall_time_s: float) -> dict[str, float]:
    """The metrics line of one generation."""
    scalars = {name: float(value) for name, value in result.metrics.items()
               if np.ndim(value) == 0}
    # The source's rewards, not what the rule made of them (es.task_normalised's fitness).
    return {**scalars, **rules.reward_statistics(result.rewards.rewards),
            **result.rewards.metrics, "wall_time_s": wall_time_s}


def reused_evaluation(record: dict) -> dict:
    """Another run's eval record as this run's values: its statistics, with its wall time
    as ``reused_wall_time_s`` and none spent here."""
    values = {k: v for k, v in record.items() if k not in ("kind", "generation")}
    return {**values, "wall_time_s": 0.0,
            "reused_wall_time_s": values.get("reused_wall_time_s", values["wall_time_s"])}


def train(config: TrainConfig, workdir: str, *,
          generate: agents.rollout.Generate = models.generate,
          model: models.Model | None = None,
          base_evaluation: dict | None = None,
          machine: dict | None = None) -> TrainResult:
    """Trains (or resumes training) as ``config`` says; see the module docstring.

    Args:
      config: the run.
      workdir: receives every output; a run already there is resumed.
      generate: ``models.generate`` or a stand-in with its signature (tests).
      model: an already loaded model (default: ``models.load(config.model.name)``).
      base_evaluation: the generation-0 eval record of a run with the same
        ``config.base_evaluation_fingerprint``, logged as this run's own instead of
        evaluating the untrained model again; its ``wall_time_s`` becomes
        ``reused_wall_time_s`` (this run spends none).
      machine: fields added to every generation's metrics line, e.g.
        ``training.machine.describe()`` (which machine ran it and how fast that is), so
        that wall times taken on different machines can be compared.

    Returns:
      The final state and the summary.
    """
    files = RunFiles(workdir)
    primary = sharding.is_primary()
    save_or_check_config(files, config, write=primary)
    layout = sharding.layout(config.mesh)
    rule = rules.make(config)
    total = config.run.generations

    def written(path: str) -> str | None:  # Only process 0 writes trajectories.
        return path if primary else None

    with contextlib.ExitStack() as closing:
        source = make_reward_source(config, files, generate, rule.search_members)
        closing.callback(source.close)  # browsers and other processes end with the run
        model = placed_model(config, model, layout)
        rule.check_params(model.params)
        initial = rule.init(model.params)
        rules.check_state(config.rule_name, initial)
        checkpointer = closing.enter_context(contextlib.closing(
            Checkpointer(files.checkpoints, layout=layout)))
        state, recorder = resume(files, config, rule, source, checkpointer,
                                initial if layout is None else layout.commit(initial), primary)
        # From here the rule's state holds the parameters (ES copied them): the loaded ones
        # and the initial state are freed, not kept beside it (experiments.plan counts on it).
        model = dataclasses.replace(model, params=None)
        del initial
        start = int(state.generation)
        if start:
            logging.info("resuming %s after generation %d of %d", files.workdir, start, total)
        logger = closing.enter_context(contextlib.closing(
            MetricsLogger(files.metrics, files.tensorboard, purge_step=start, write=primary)))

        def evaluate_and_log(params: Any, generations_done: int) -> None:
            began = time.time()
            key = config_lib.sampling_key(config, config_lib.EVAL_SAMPLING_STREAM, 0)
            statistics = source.evaluate(dataclasses.replace(model, params=params), key,
                                         generations_done,
                                         written(files.eval_trajectories(generations_done)))
            logger.log("eval", generations_done, {**statistics,
                                                  "wall_time_s": time.time() - began})

        if start == 0 and base_evaluation is not None:
            logger.log("eval", 0, reused_evaluation(base_evaluation))
        elif is_due(start, config.run.eval_every, total):
            evaluate_and_log(state.params, start)
        bar = closing.enter_context(tqdm.tqdm(total=total, initial=start, disable=not primary,
                                              desc="generations", unit="gen"))
        for generation in range(start, total):
            began = time.time()
            key = config_lib.sampling_key(config, config_lib.TRAIN_SAMPLING_STREAM, generation)
            state, result = rule.step(state, source, model, key,
                                      written(files.train_trajectories(generation)))
            wall_time_s = time.time() - began
            if recorder is not None:
                recorder.append(result, wall_time_s)
            record = logger.log("train", generation,
                                {**train_record(result, wall_time_s), **(machine or {})})
            bar.set_postfix(reward=f"{record['reward_mean']:.3f}")
            bar.update()
            if is_due(generation + 1, config.run.checkpoint_every, total):
                checkpointer.save(state, source.state())
            if is_due(generation + 1, config.run.eval_every, total):
                evaluate_and_log(state.params, generation + 1)

    sharding.sync("train: the last metrics are written")
    records = read_metrics(files.metrics)
    summary = report.summarize(records)
    if primary:
        report.plot_reward_curve(records, files.reward_curve)
        report.write_summary(summary, files.summary_json, files.summary_markdown)
        logging.info("wrote %s, %s and %s", files.reward_curve, files.summary_json,
                     files.summary_markdown)
    return TrainResult(state, summary)
