"""The multi-turn rollout engine: every (member, task) episode of a generation, batched.

Rows are (member, task) pairs: every member plays the same tasks. At each turn all rows
still running go through ONE policy call, so a population-aware model generates for G
members × k episodes in one batch. Finished episodes drop out of the batch. The policy
also gets each row's task index: the model policy samples every member's episode of a
task from the same random stream (common random numbers), so members' rewards differ by
their parameters rather than by sampling luck.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np

from agentic_esopt.agents.prompts import Message, add_turn, initial_messages, trim_history
from agentic_esopt.envs.base import EnvFactory

# policy(conversations, members, task_indices) -> one reply per conversation; members[i]
# is the ES member whose parameters must produce reply i, task_indices[i] the position of
# its task in the generation's task list.
Policy = Callable[[list[list[Message]], list[int], list[int]], list[str]]


@dataclasses.dataclass(frozen=True)
class Trajectory:
    """One finished episode.

    Attributes:
      member: ES member index whose parameters acted.
      task_id: the task's id.
      generation: ES generation the episode belongs to.
      messages: the whole conversation, final observation included.
      actions: the agent's replies, one per turn.
      rewards: the environment's reward per turn.
      total_reward: sum of ``rewards``.
      num_turns: number of turns played.
      solved: the final step's ``info["solved"]`` (False when the env does not report it).
      info: the final step's info dict.
    """

    member: int
    task_id: str
    generation: int
    messages: list[Message]
    actions: list[str]
    rewards: list[float]
    total_reward: float
    num_turns: int
    solved: bool
    info: dict[str, Any]


def run_episodes(env_factory: EnvFactory, tasks: Sequence[Any], policy: Policy,
                 members: Sequence[int], *, system_prompt: str | None = None,
                 generation: int = 0, max_turns: int | None = None,
                 trajectory_path: str | Path | None = None) -> list[Trajectory]:
    """Plays every task once per member, one batched policy call per turn.

    The per-turn token limit belongs to the policy (see ``make_model_policy``).

    Args:
      env_factory: makes a fresh environment; called once per episode.
      tasks: the generation's tasks (each with an ``id``), the same for every member.
      policy: ``policy(conversations, members, task_indices) -> replies``.
      members: distinct member indices to evaluate, e.g. ``range(G)``.
      system_prompt: optional system message opening every conversation.
      generation: ES generation, recorded in each trajectory.
      max_turns: optional cap on turns; the limit is min(the env's own, max_turns).
      trajectory_path: if given, trajectories are appended there as JSONL.

    Returns:
      Trajectories in row order: member-major, then task order.
    """
    members = [int(m) for m in members]
    if not members or not tasks:
        raise ValueError(f"need at least one member and one task, got {len(members)} members "
                         f"and {len(tasks)} tasks")
    if len(set(members)) != len(members):
        raise ValueError(f"members must be distinct, got {members}")
    if max_turns is not None and max_turns < 1:
        raise ValueError(f"max_turns must be >= 1, got {max_turns}")
    rows = list(itertools.product(members, range(len(tasks))))
    envs = [env_factory() for _ in rows]
    conversations = [initial_messages(system_prompt, env.reset(tasks[t], max_turns=max_turns))
                     for env, (_, t) in zip(envs, rows)]
    actions: list[list[str]] = [[] for _ in rows]
    rewards: list[list[float]] = [[] for _ in rows]
    infos: list[dict[str, Any]] = [{} for _ in rows]
    active = list(range(len(rows)))
    while active:
        if max_turns is not None and len(actions[active[0]]) >= max_turns:
            raise RuntimeError(f"environment did not end its episodes within max_turns="
                               f"{max_turns}; it must honour reset(..., max_turns=)")
        replies = policy([conversations[i] for i in active], [rows[i][0] for i in active],
                         [rows[i][1] for i in active])
        if len(replies) != len(active) or not all(isinstance(r, str) for r in replies):
            raise ValueError(f"policy must return {len(active)} strings, got {replies!r:.200}")
        still_active = []
        for i, reply in zip(active, replies):
            observation, reward, done, info = envs[i].step(reply)
            conversations[i] = add_turn(conversations[i], reply, observation)
            actions[i].append(reply)
            rewards[i].append(float(reward))
            infos[i] = info
            if not done:
                still_active.append(i)
        active = still_active
    trajectories = [
        Trajectory(member=member, task_id=str(tasks[t].id), generation=int(generation),
                   messages=conversations[i], actions=actions[i], rewards=rewards[i],
                   total_reward=float(sum(rewards[i])), num_turns=len(actions[i]),
                   solved=bool(infos[i].get("solved", False)), info=infos[i])
        for i, (member, t) in enumerate(rows)
    ]
    if trajectory_path is not None:
        write_trajectories(trajectory_path, trajectories)
    return trajectories


def member_rewards(trajectories: Sequence[Trajectory], population_size: int) -> np.ndarray:
    """Each member's mean total reward over its trajectories, shape (population_size,)."""
    totals = [[] for _ in range(population_size)]
    for trajectory in trajectories:
        if not 0 <= trajectory.member < population_size:
            raise ValueError(f"trajectory of member {trajectory.member} is outside a "
                             f"population of {population_size}")
        totals[trajectory.member].append(trajectory.total_reward)
    missing = [m for m, rewards in enumerate(totals) if not rewards]
    if missing:
        raise ValueError(f"members without trajectories: {missing}")
    return np.array([np.mean(rewards) for rewards in totals], dtype=np.float64)


def write_trajectories(path: str | Path, trajectories: Sequence[Trajectory]) -> None:
    """Appends trajectories to a JSONL file (one per line), creating parent folders."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = "".join(json.dumps(dataclasses.asdict(t)) + "\n"
                    for t in trajectories)
    with open(path, "a", encoding="utf-8") as f:
        f.write(lines)


def read_trajectories(path: str | Path) -> list[Trajectory]:
    """Reads back every trajectory written by ``write_trajectories``."""
    with open(path, encoding="utf-8") as f:
        return [Trajectory(**json.loads(line)) for line in f if line.strip()]


def make_model_policy(model: Any, population: Any, *, max_new_tokens: int,
                      temperature: float = 0.0, key: jax.Array | None = None,
                      history_turns: int | None = None, reply_prefix: str = "",
                      stop: tuple[str, ...] = ()) -> Policy:
    """A policy that chat-templates each conversation and calls ``models.generate``.

    Args:
      model: a loaded ``models.Model`` (config, params, tokenizer with a chat template).
      population: the generation's ``es.Population``, or None to act with θ itself.
      max_new_tokens: per-turn token limit.
      temperature: 0 is greedy.
      key: sampling key (required when temperature > 0); call k uses fold_in(key, k),
        and within a call every row of the same task shares one sampling stream.
      history_turns: keep only the last k turns in each prompt (None keeps all).
      reply_prefix: text that opens every reply (e.g. "set "): appended to the prompt
        after the generation prompt, and part of the returned reply. It steers small
        models into the action format.
      stop: stop strings ending a reply early.

    Returns:
      ``policy(conversations, members, task_indices) -> replies``.
    """
    # Imported here so the engine, parsers and environments load without the model stack.
    from agentic_esopt import models  # pylint: disable=import-outside-toplevel

    if temperature > 0 and key is None:
        raise ValueError("sampling with temperature > 0 needs a key")
    call_index = itertools.count()

    def policy(conversations: list[list[Message]], members: list[int],
               task_indices: list[int]) -> list[str]:
        prompts = [model.tokenizer.apply_chat_template(trim_history(c, history_turns),
                                                       add_generation_prompt=True,
                                                       tokenize=False) + reply_prefix
                   for c in conversations]
        call_key = None if key is None else jax.random.fold_in(key, next(call_index))
        output = models.generate(
            model, prompts, max_new_tokens=max_new_tokens, temperature=temperature,
            key=call_key, population=population, stop=stop or None,
            members=None if population is None else np.asarray(members, dtype=np.int32),
            streams=np.asarray(task_indices, dtype=np.int32))
        return [reply_prefix + text for text in output.texts]

    return policy
