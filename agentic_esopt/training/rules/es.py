"""Agentic ESOpt as an update rule: the population around θ answers, ``tell`` moves θ.

The ES settings are the config's ``es`` section (``es.options.Options``; ``es.strategy``
names the algorithm in ``es.strategies``); the ``rule`` section holds only ``name: es``.
The rule keeps the es history (``history.jsonl``: each
generation's population, rewards and metrics), from which a run resumes, or is
exported, by a bitwise replay without rollouts.

With ``es.scope=lora`` the rule trains LoRA adapters (``models.lora``): ``init`` adds
them to the loaded parameters (A drawn from the run's adapter key stream, B zero), so
every state, checkpoint and history of the run holds them, and the base leaves never
change.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from agentic_esopt import es
from agentic_esopt import options as options_lib
from agentic_esopt.agents import sources
from agentic_esopt.models import lora
from agentic_esopt.training import config as config_lib
from agentic_esopt.training.rules.base import Rule, StepResult, forward_flops

PyTree = Any


@dataclasses.dataclass(frozen=True)
class Options:
    """ES has no options in the ``rule`` section: its settings are the ``es`` section."""


def config_problems(sections: Mapping[str, Any]) -> list[str]:
    """A registered ES strategy, and at least one member per process (each process plays
    its own members)."""
    problems: list[str] = []
    check = options_lib.checker(problems)
    processes = sections["distributed"].num_processes or 1
    size, name = sections["es"].population_size, sections["es"].strategy
    check(name in es.strategies.names(),
          f"es.strategy: unknown ES strategy {name!r}; choose one of {es.strategies.names()}")
    check(size >= processes, f"es.population_size ({size}) must be >= "
                             f"distributed.num_processes ({processes}): each process plays "
                             f"its own members")
    return problems


def make_strategy(config: Any) -> es.Strategy:
    """The ES strategy of a ``TrainConfig`` (its σ schedule spans ``run.generations``)."""
    return es.from_options(config.es, config.run.generations)


@dataclasses.dataclass(frozen=True)
class ESHistory:
    """The es history of a run (``es.history``) as the loop's history hook."""

    path: str
    strategy: es.Strategy
    run_key: jax.Array

    def read(self):
        return es.history.read_intact(self.path)

    def replay(self, initial: es.ESState, header: dict, records: list[dict]) -> es.ESState:
        return es.history.replay_records(initial.params, header, records, self.strategy)

    def recorder(self, header, records, config):
        if header is None or not records:
            return _Recorder(es.history.HistoryWriter.create(
                self.path, self.strategy.spec, es.strategy.raw_key(self.run_key),
                config=config))
        return _Recorder(es.history.HistoryWriter.resume(self.path, header, records))


@dataclasses.dataclass(frozen=True)
class _Recorder:
    writer: es.history.HistoryWriter

    def append(self, result: StepResult, wall_time_s: float) -> None:
        by_task = {name: np.asarray(result.metrics[name]).tolist()
                   for name in ("rewards_by_task",) if name in result.metrics}
        self.writer.append(result.population, result.metrics["fitness"], result.metrics,
                           wall_time_s, task_ids=result.rewards.task_ids, **by_task)


@dataclasses.dataclass(frozen=True)
class ESRule(Rule):
    """ask → every member's reward from the source → tell."""

    strategy: es.Strategy
    run_key: jax.Array
    scope: str
    population_size: int
    adapters: lora.Settings | None = None  # es.scope=lora: the adapters trained.
    adapter_key: jax.Array | None = None  # Draws the adapters' A.
    task_normalised: bool = False  # es.task_normalised: per-task z-scored fitness.

    @property
    def search_members(self) -> int | None:
        # Per-task fitness needs every member on the same tasks: episodes, not a search.
        return None if self.task_normalised else self.population_size

    def init(self, params: PyTree) -> es.ESState:
        # A copy: ``tell`` consumes the state, and the caller's model keeps its params.
        params = jax.tree.map(jnp.copy, params)
        if self.adapters is not None:
            params = lora.add_lora(params, self.adapter_key, self.adapters)
        return self.strategy.init(self.run_key, params)

    def step(self, state: es.ESState, source: sources.RewardSource, model: Any,
             key: jax.Array, trajectory_path: str | None) -> tuple[es.ESState, StepResult]:
        population = self.strategy.ask(state)
        rewards = source.rewards(dataclasses.replace(model, params=state.params), population,
                                 int(state.generation), key, trajectory_path)
        flops = forward_flops(state.params, rewards.metrics.get("forward_tokens", 0.0))
        told = dict(fitness=rewards.rewards)
        if self.task_normalised:
            told = dict(fitness=es.fitness.task_normalised(rewards.by_task),
                        rewards_by_task=rewards.by_task)
        state, metrics = self.strategy.tell(state, population, told["fitness"])
        return state, StepResult(population, rewards, {**metrics, **told, "flops": flops})

    def check_params(self, params: PyTree) -> None:
        """Raises ValueError if ``es.scope`` selects no parameter leaf, or if
        ``es.lora_targets`` names no projection of the model."""
        if self.adapters is not None:
            try:
                lora.target_projections(params, self.adapters.targets)
            except ValueError as error:
                raise ValueError(f"es.lora_targets: {error}") from None
            return
        leaves = jax.tree_util.tree_flatten_with_path(params)[0]
        if not any(es.noise.in_scope(self.scope, jax.tree_util.keystr(path), leaf)
                   for path, leaf in leaves):
            raise ValueError(f"es.scope {self.scope!r} matches no parameter; paths look "
                             f"like {jax.tree_util.keystr(leaves[0][0])}")

    def history(self, path: str) -> ESHistory:
        return ESHistory(path, self.strategy, self.run_key)


def make(config: Any) -> ESRule:
    """The ES rule of a ``TrainConfig``."""
    options = config.es
    adapters = (lora.Settings(options.lora_rank, options.lora_alpha,
                              options.lora_target_names)
                if options.scope == "lora" else None)
    return ESRule(make_strategy(config), config_lib.run_key(config), options.scope,
                  options.population_size, adapters,
                  config_lib.stream_key(config, config_lib.ADAPTER_STREAM),
                  options.task_normalised)
