"""Reward sources: a policy's parameters and a population in, one reward per member out.

A reward source is what an update rule asks for rewards each generation. Two exist:

* ``EpisodeRewards``: every member plays the generation's tasks of a multi-turn
  environment (``envs.TaskSource``) in one batched rollout; a member's reward is its mean
  total reward. Evaluation plays the held-out tasks with the unperturbed parameters.
* ``SearchRewards``: one batch of an EoH / Sample heuristic search (``agents.eoh``); each
  member answers its share of the batch's prompts and is rewarded by its offspring
  (``member_rewards``). Evaluation scores the best heuristic on held-out instances.

Both share one interface (``rewards``, ``evaluate``, ``state`` / ``restore``, ``close``)
so the trainer runs either with any update rule. A source's ``state()`` is JSON and is
checkpointed with the update rule's state, so a resumed run continues bitwise.

On several processes (``jax.distributed``) ``EpisodeRewards.rewards`` plays only this
process's contiguous share of the members (``sharding.process_slice``; a member's
sampling streams do not depend on which process plays it) and gathers every process's
trajectories, in member order, so every process computes the same rewards; only the
first writes the trajectory file. Evaluation and GRPO samples run whole on every process.
"""

from __future__ import annotations

import dataclasses
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import jax
import numpy as np

from agentic_esopt import sharding
from agentic_esopt.agents import eoh, rollout, skills
from agentic_esopt.models.kv_cache import Conversation, ConversationCache

PyTree = Any


class Rewards(NamedTuple):
    """One generation's rewards.

    Attributes:
      rewards: (members,) float64, one per member (one for an unperturbed policy).
      task_ids: the tasks the members played (recorded in the history).
      metrics: scalar metrics of the generation (success rate, valid programs, ...).
      by_task: (members, tasks), each member's reward on each task, where every member
        played the same tasks (episodes); None otherwise (a heuristic search).
    """

    rewards: np.ndarray
    task_ids: list[str]
    metrics: dict[str, float]
    by_task: np.ndarray | None = None


class RewardSource(Protocol):
    """What an update rule needs from a task."""

    def rewards(self, model: Any, population: Any, generation: int, key: jax.Array,
                trajectory_path: str | None) -> Rewards:
        """Rewards of the population around ``model.params`` (None: θ itself)."""

    def evaluate(self, model: Any, key: jax.Array, generation: int,
                 trajectory_path: str | None) -> dict[str, Any]:
        """Held-out statistics of ``model.params``."""

    def state(self) -> dict[str, Any]:
        """The source's own state (JSON), saved with every checkpoint."""

    def restore(self, state: dict[str, Any]) -> None:
        """Continues from a ``state()`` taken at a checkpoint."""

    def close(self) -> None:
        """Releases the task source's processes (browsers); safe to call again."""


def num_members(population: Any) -> int:
    """Members of a population (1 for the unperturbed policy, ``population=None``)."""
    return 1 if population is None else int(population.signs.shape[0])


@dataclasses.dataclass
class EpisodeRewards:
    """Multi-turn episodes of an environment (see the module docstring).

    Attributes:
      source: the environment's task source.
      options: the rollout settings.
      eval_temperature: sampling temperature of held-out evaluation.
      generate: ``models.generate`` or a stand-in.
      eval_repeats: episodes per held-out task (independent samples), pooled.
      eval_batch_size: held-out tasks played together (0: all); batches play in turn,
        each task with its own sampling streams, so the episodes do not depend on it.
    """

    source: Any
    options: rollout.Options
    eval_temperature: float
    generate: rollout.Generate
    eval_repeats: int = 1
    eval_batch_size: int = 0

    @property
    def system_prompt(self) -> str | None:
        return skills.with_skill(self.source.system_prompt, self.options.skill)

    def _play(self, model: Any, population: Any, tasks: Any, temperature: float,
              key: jax.Array, generation: int, trajectory_path: str | None,
              members: Sequence[int], batch_size: int = 0, keep_tokens: bool = False
              ) -> tuple[list[rollout.Trajectory], rollout.PolicyUsage]:
        """The episodes of ``members`` × ``tasks`` (member-major, then task order) and
        what the policy's calls cost, played in batches of ``batch_size`` tasks (0: one
        batch) in turn; a task's sampling streams follow its position in ``tasks``, so
        the batches do not change the episodes."""
        usage = rollout.PolicyUsage()
        if not members:
            return [], usage
        size = batch_size or len(tasks)
        batches = []
        for start in range(0, len(tasks), size):
            policy = rollout.make_model_policy(model, population, self.options,
                                               temperature=temperature, key=key,
                                               generate=self.generate,
                                               extra_stop=self.source.stop,
                                               keep_tokens=keep_tokens, usage=usage)
            batches.append(rollout.run_episodes(
                self.source.env_factory, tasks[start:start + size],
                rollout.offset_tasks(policy, start), members,
                system_prompt=self.system_prompt, generation=generation,
                max_turns=self.options.max_turns, trajectory_path=trajectory_path))
        return member_major(batches, len(members)), usage

    def rewards(self, model, population, generation, key, trajectory_path=None) -> Rewards:
        tasks = self.source.train_tasks(generation)
        members = sharding.process_slice(num_members(population))
        began = time.perf_counter()
        own, usage = self._play(model, population, tasks, self.options.temperature, key,
                                generation, None, members, self.options.batch_size)
        rollout_s = time.perf_counter() - began
        trajectories = gather_trajectories(own)
        if trajectory_path is not None and sharding.is_primary():
            rollout.write_trajectories(trajectory_path, trajectories)
        task_ids = [str(t.id) for t in tasks]
        return Rewards(rollout.member_rewards(trajectories, num_members(population)), task_ids,
                       {**training_metrics(trajectories),
                        **rollout_timing(trajectories, usage.seconds, rollout_s),
                        "forward_tokens": float(sharding.process_sum(usage.fed))},
                       rollout.member_task_rewards(trajectories, num_members(population),
                                                   task_ids))

    def samples(self, model: Any, group_size: int, generation: int, key: jax.Array,
                trajectory_path: str | None = None) -> tuple[list[rollout.Trajectory], int]:
        """``group_size`` independent episodes of each of the generation's tasks by
        ``model.params``, with their turn tokens (a policy-gradient batch); sample-major,
        then task order; and the tokens the model processed."""
        trajectories, usage = self._play(model, None, self.source.train_tasks(generation),
                                         self.options.temperature, key, generation,
                                         trajectory_path, range(group_size),
                                         self.options.batch_size, keep_tokens=True)
        return trajectories, usage.fed

    def evaluate(self, model, key, generation, trajectory_path=None) -> dict[str, Any]:
        trajectories, _ = self._play(model, None, self.source.eval_tasks,
                                     self.eval_temperature, key, generation, trajectory_path,
                                     range(self.eval_repeats), self.eval_batch_size)
        return episode_statistics(trajectories)

    def state(self) -> dict[str, Any]:
        return {}

    def restore(self, state: dict[str, Any]) -> None:
        del state  # Tasks are a function of (seed, generation): nothing to restore.

    def close(self) -> None:
        self.source.close()


def member_major(batches: Sequence[list[rollout.Trajectory]], members: int
                 ) -> list[rollout.Trajectory]:
    """Episodes of consecutive task batches, each member-major, in the order one batch of
    all the tasks gives: member-major, then task order."""
    return [trajectory for member in range(members) for batch in batches
            for trajectory in batch[member * len(batch) // members:
                                    (member + 1) * len(batch) // members]]


def gather_trajectories(trajectories: list[rollout.Trajectory]) -> list[rollout.Trajectory]:
    """Every process's trajectories (as their JSON lines: without turn tokens), in process
    order; ``trajectories`` itself on one process."""
    if jax.process_count() == 1:
        return trajectories
    with tempfile.TemporaryDirectory() as folder:
        own, every = Path(folder, "own.jsonl"), Path(folder, "every.jsonl")
        rollout.write_trajectories(own, trajectories)
        every.write_bytes(b"".join(sharding.allgather_bytes(own.read_bytes())))
        return rollout.read_trajectories(every)


def training_metrics(trajectories: Any) -> dict[str, float]:
    """Success rate and mean turns of a generation's training episodes."""
    return dict(success_rate=float(np.mean([t.solved for t in trajectories])),
                mean_turns=float(np.mean([t.num_turns for t in trajectories])))


def rollout_timing(trajectories: Sequence[rollout.Trajectory], policy_s: float,
                   rollout_s: float) -> dict[str, float]:
    """A generation's rollout: the environment steps (turns) of its ``trajectories``
    (every process's), this process's seconds of rollout and of those, the seconds in
    the policy's calls (the model's share; the rest is the environments': resets, steps)."""
    return dict(env_steps=float(sum(t.num_turns for t in trajectories)),
                rollout_s=rollout_s, policy_s=policy_s)


def mean_and_standard_error(values) -> tuple[float, float]:
    """Sample mean and its standard error std(ddof=1)/√n (0 for a single value)."""
    values = np.asarray(values, dtype=np.float64)
    if values.size == 0:
        raise ValueError("need at least one value")
    if values.size == 1:
        return float(values[0]), 0.0
    return float(values.mean()), float(values.std(ddof=1) / np.sqrt(values.size))


def episode_statistics(trajectories) -> dict[str, Any]:
    """Mean total reward and success rate of episodes, each with its standard error.

    The per-episode task ids, rewards and outcomes are kept too, so that two evaluations
    of the same tasks can be compared pairwise (``training.report.summarize``).
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


def member_rewards(batch: eoh.Batch, size: int) -> np.ndarray:
    """(size,) mean reward of each member's offspring; the batch mean for members with none
    (only a budget-cut last batch can leave one out), which z-scoring maps near zero."""
    if not batch.offspring:
        raise ValueError("an empty batch has no rewards")
    rewards = np.asarray(batch.rewards, np.float64)
    members = np.asarray([child.member for child in batch.offspring])
    if members.min() < 0 or members.max() >= size:
        raise ValueError(f"offspring members {sorted(set(members.tolist()))} are outside "
                         f"[0, {size})")
    totals = np.bincount(members, weights=rewards, minlength=size)
    counts = np.bincount(members, minlength=size)
    return np.where(counts > 0, totals / np.maximum(counts, 1), rewards.mean())


def chat_prompt(tokenizer: Any, prompt: str) -> str:
    """``prompt`` as one user turn in the tokenizer's chat template, ready for a reply."""
    return tokenizer.apply_chat_template([{"role": "user", "content": prompt}],
                                         tokenize=False, add_generation_prompt=True)


@dataclasses.dataclass
class SearchRewards:
    """Heuristic search batches as ES generations (see the module docstring).

    Each generation is one batch of the search; prompt j of a batch goes to member
    ``j % num_members``. The batch's sampling key is the generation's key.

    Attributes:
      source: the AHD task source (``envs.ahd.source.AHDSource``).
      search: ``eoh.EoHConfig`` or ``eoh.SampleConfig`` (its ``num_members`` is G with
        ES, 1 for the unperturbed model).
      options: the rollout settings (tokens, temperature, top-p).
      generate: ``models.generate`` or a stand-in.
      run_dir: where the programs log is kept.
      seed: seeds EoH's parent selection.
    """

    source: Any
    search: eoh.EoHConfig | eoh.SampleConfig
    options: rollout.Options
    generate: rollout.Generate
    run_dir: str
    seed: int
    _state: eoh.SearchState | None = None
    _cache: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        self._state = eoh.initial_state(self.seed)  # The trainer then calls ``restore``.

    def _llm(self, model: Any, population: Any, key: jax.Array) -> eoh.LLM:
        # Prompts share their task description: a kept cache feeds it once per row.
        cache = (ConversationCache(self.options.max_context) if self.options.keep_kv_cache
                 else None)

        def llm(prompts, members):
            output = self.generate(
                model, [chat_prompt(model.tokenizer, p) for p in prompts], key=key,
                sampling=rollout.sampling(self.options, self.options.temperature),
                population=population,
                members=None if population is None else np.asarray(members, np.int32),
                conversation=None if cache is None else Conversation(
                    cache, list(range(len(prompts)))))
            return output.texts
        return llm

    def rewards(self, model, population, generation, key, trajectory_path=None) -> Rewards:
        del generation, trajectory_path  # Programs go to the run's programs log.
        self._state, batch = eoh.step(self._state, self._cache,
                                      self._llm(model, population, key),
                                      self.source.evaluate, self.source.task, self.search,
                                      self.run_dir)
        valid = [c.objective for c in batch.offspring if c.valid]
        best = self._state.population[0].objective if self._state.population else None
        metrics = dict(calls=float(self._state.call_count), num_valid=float(len(valid)),
                       batch_size=float(len(batch.offspring)))
        if best is not None:
            metrics["best_train_objective"] = float(best)
        return Rewards(member_rewards(batch, num_members(population)),
                       [str(c.call_index) for c in batch.offspring], metrics)

    def evaluate(self, model, key, generation, trajectory_path=None) -> dict[str, Any]:
        del model, key, generation, trajectory_path  # The heuristic, not the LLM, is scored.
        best = self._state.population[0] if self._state.population else None
        statistics = dict(calls=self._state.call_count,
                          baseline_eval_objective=self.source.baseline_objective(),
                          best_eval_objective=None, best_train_objective=None,
                          best_call_index=None)
        if best is not None:
            statistics.update(best_eval_objective=self.source.score(best.code)["objective"],
                              best_train_objective=best.objective,
                              best_call_index=best.call_index)
        return statistics

    def state(self) -> dict[str, Any]:
        return eoh.state_to_json(self._state)

    def restore(self, state: dict[str, Any]) -> None:
        self._state = eoh.state_from_json(state)
        self._cache = eoh.restore_log(self.run_dir, self._state.call_count)

    def close(self) -> None:
        self.source.close()
