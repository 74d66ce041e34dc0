"""The multi-turn rollout engine: every (member, task) episode of a generation, batched.

Rows are (member, task) pairs: every member plays the same tasks. At each turn all rows
still running go through ONE policy call, so a population-aware model generates for G
members × k episodes in one batch. Finished episodes drop out of the batch. The policy
also gets each row's task index: the model policy samples every member's episode of a
task from the same random stream (common random numbers), so members' rewards differ by
their parameters rather than by sampling luck.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import itertools
import json
import numbers
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import jax
import numpy as np

from agentic_esopt import options as options_lib
from agentic_esopt.agents.prompts import (Message, add_turn, initial_messages, plain_prompt,
                                          trim_history)
from agentic_esopt.envs.base import EnvFactory
from agentic_esopt.models.kv_cache import Conversation, ConversationCache
from agentic_esopt.models.sampling import Sampling
from agentic_esopt.registry import PluginError


class TurnTokens(NamedTuple):
    """What a policy gradient needs of one turn: the prompt the model saw, the tokens it
    generated and their sampling log-probabilities (``models.GenerationOutput.logprobs``)."""

    prompt_ids: list[int]
    reply_ids: list[int]
    logprobs: list[float]


class Reply(NamedTuple):
    """A reply with its tokens (what ``make_model_policy(..., keep_tokens=True)`` returns)."""

    text: str
    tokens: TurnTokens


# policy(conversations, members, task_indices) -> one reply (a string or a ``Reply``) per
# conversation; members[i] is the ES member whose parameters must produce reply i (without
# a population: the index of an independent sample), task_indices[i] the position of its
# task in the generation's task list.
Policy = Callable[[list[list[Message]], list[int], list[int]], list["str | Reply"]]
# Without a population, member m's episode of task t samples from stream
# m * MAX_TASKS + t; with one, members share the task's stream (common random numbers).
MAX_TASKS = 1 << 16


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
      turns: each turn's tokens when the policy kept them (in memory only: trajectory
        files leave them out), else None.
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
    turns: list[TurnTokens] | None = None


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
    with contextlib.ExitStack() as closing:
        envs = []
        for _ in rows:
            envs.append(env_factory())
            if hasattr(envs[-1], "close"):
                closing.callback(envs[-1].close)
        return _play(envs, rows, tasks, policy, system_prompt, generation, max_turns,
                     trajectory_path)


def _play(envs: list[Any], rows: list[tuple[int, int]], tasks: Sequence[Any],
          policy: Policy, system_prompt: str | None, generation: int,
          max_turns: int | None, trajectory_path: str | Path | None) -> list[Trajectory]:
    """The turn loop of ``run_episodes`` over already-made environments."""
    first = _each_env(envs, range(len(rows)), lambda i: _checked(
        envs[i], "reset", envs[i].reset(tasks[rows[i][1]], max_turns=max_turns)))
    conversations = [initial_messages(system_prompt, observation) for observation in first]
    actions: list[list[str]] = [[] for _ in rows]
    rewards: list[list[float]] = [[] for _ in rows]
    infos: list[dict[str, Any]] = [{} for _ in rows]
    turns: list[list[TurnTokens]] = [[] for _ in rows]
    active = list(range(len(rows)))
    while active:
        if max_turns is not None and len(actions[active[0]]) >= max_turns:
            raise RuntimeError(f"environment did not end its episodes within max_turns="
                               f"{max_turns}; it must honour reset(..., max_turns=)")
        replies = policy([conversations[i] for i in active], [rows[i][0] for i in active],
                         [rows[i][1] for i in active])
        if len(replies) != len(active) or not all(isinstance(r, (str, Reply)) for r in replies):
            raise ValueError(f"policy must return {len(active)} strings or Replies, got "
                             f"{replies!r:.200}")
        for i, reply in zip(active, replies):
            if isinstance(reply, Reply):
                turns[i].append(reply.tokens)
        replies = [r.text if isinstance(r, Reply) else r for r in replies]
        reply_of = dict(zip(active, replies))
        results = _each_env(envs, active,
                            lambda i: _checked(envs[i], "step", envs[i].step(reply_of[i])))
        still_active = []
        for i, reply, (observation, reward, done, info) in zip(active, replies, results):
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
                   solved=bool(infos[i].get("solved", False)), info=infos[i],
                   turns=turns[i] if len(turns[i]) == len(actions[i]) else None)
        for i, (member, t) in enumerate(rows)
    ]
    if trajectory_path is not None:
        write_trajectories(trajectory_path, trajectories)
    return trajectories


_RETURNS = {"reset": "the first observation, a str",
            "step": "StepResult(observation: str, reward: float, done: bool, info: dict)"}


def _checked(env: Any, method: str, result: Any) -> Any:
    """``result`` of ``env.<method>``; PluginError if it is not what the protocol says."""
    if method == "reset":
        valid = isinstance(result, str)
    else:
        valid = (isinstance(result, tuple) and len(result) == 4 and isinstance(result[0], str)
                 and isinstance(result[1], numbers.Real) and isinstance(result[3], dict))
    if not valid:
        raise PluginError(f"{type(env).__name__}.{method} must return {_RETURNS[method]}, "
                          f"got {result!r:.80}")
    return result


def _each_env(envs: list[Any], indices: Sequence[int], call: Callable[[int], Any]) -> list[Any]:
    """``[call(i) for i in indices]``, in parallel threads when every environment says it
    is ``concurrent`` (its calls wait on other processes, e.g. browsers)."""
    indices = list(indices)
    if len(indices) < 2 or not all(getattr(env, "concurrent", False) for env in envs):
        return [call(i) for i in indices]
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(indices)) as threads:
        return list(threads.map(call, indices))


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


def member_task_rewards(trajectories: Sequence[Trajectory], population_size: int,
                        task_ids: Sequence[str]) -> np.ndarray:
    """Each member's total reward on each task, shape (population_size, len(task_ids)):
    every member plays every task once."""
    column = {task_id: j for j, task_id in enumerate(task_ids)}
    rewards = np.zeros((population_size, len(task_ids)))
    played = np.zeros(rewards.shape, bool)
    for trajectory in trajectories:
        cell = (trajectory.member, column.get(trajectory.task_id))
        if not 0 <= cell[0] < population_size or cell[1] is None:
            raise ValueError(f"trajectory of member {trajectory.member} on task "
                             f"{trajectory.task_id!r} is outside {population_size} members "
                             f"× tasks {list(task_ids)}")
        if played[cell]:
            raise ValueError(f"member {cell[0]} played task {trajectory.task_id!r} twice")
        rewards[cell], played[cell] = trajectory.total_reward, True
    missing = np.argwhere(~played)
    if missing.size:
        raise ValueError("members without an episode of a task: " + ", ".join(
            f"member {m} on {task_ids[t]!r}" for m, t in missing[:8]))
    return rewards


def write_trajectories(path: str | Path, trajectories: Sequence[Trajectory]) -> None:
    """Appends trajectories (without their turn tokens) to a JSONL file, one per line,
    creating parent folders."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = "".join(json.dumps(dataclasses.asdict(dataclasses.replace(t, turns=None))) + "\n"
                    for t in trajectories)
    with open(path, "a", encoding="utf-8") as f:
        f.write(lines)


def read_trajectories(path: str | Path) -> list[Trajectory]:
    """Reads back every trajectory written by ``write_trajectories``."""
    with open(path, encoding="utf-8") as f:
        return [Trajectory(**{k: v for k, v in json.loads(line).items() if k != "turns"})
                for line in f if line.strip()]


@dataclasses.dataclass(frozen=True)
class Options:
    """How agents play episodes (a config file's ``rollout`` section)."""

    tasks_per_generation: int = options_lib.field(4, "Tasks every member plays each "
                                                     "generation.")
    batch_size: int = options_lib.field(0, "Tasks played together, in turn (0: all of a "
                                           "generation's at once); smaller batches bound a "
                                           "rollout's memory and play the same episodes.")
    max_turns: int | None = options_lib.field(None, "Cap on turns per episode (default: the "
                                                    "environment's own limit).")
    max_new_tokens: int = options_lib.field(32, "Tokens the agent may generate per turn.")
    temperature: float = options_lib.field(0.0, "Sampling temperature of training rollouts "
                                                "(0 = greedy).")
    top_p: float = options_lib.field(1.0, "Nucleus sampling mass (1 = off).")
    top_k: int = options_lib.field(0, "Sample among the k most likely tokens (0 = off).")
    presence_penalty: float = options_lib.field(0.0, "Subtracted once from the logit of "
                                                     "every token the reply already holds.")
    frequency_penalty: float = options_lib.field(0.0, "Subtracted from a token's logit per "
                                                      "occurrence in the reply so far.")
    history_turns: int | None = options_lib.field(None, "Keep only the last k turns in each "
                                                        "prompt (0: only the latest "
                                                        "observation; default: all).")
    reply_prefix: str = options_lib.field("", "Text that opens every reply (e.g. 'set '); "
                                              "steers small models into the action format.")
    chat_template: bool = options_lib.field(True, "Format prompts with the tokenizer's chat "
                                                  "template; False joins the messages' "
                                                  "texts as they are (a plain-text prompt).")
    stop_at_newline: bool = options_lib.field(False, "End each reply at its first newline.")
    skill: str | None = options_lib.field(None, "A skill file whose text is appended to the "
                                                "system prompt, in training and evaluation.")
    keep_kv_cache: bool = options_lib.field(True, "Keep each episode's KV cache between "
                                                  "turns, so a turn feeds only its new tokens "
                                                  "(same tokens as re-prefilling).")
    max_context: int | None = options_lib.field(None, "Most tokens an episode's prompt plus "
                                                      "reply may hold (default: no limit); "
                                                      "bounds the kept caches' memory.")

    def problems(self) -> list[str]:
        problems: list[str] = []
        check = options_lib.checker(problems)
        check(self.tasks_per_generation >= 1,
              f"tasks_per_generation must be >= 1, got {self.tasks_per_generation}")
        check(self.batch_size >= 0, f"batch_size must be >= 0 (0: all tasks at once), "
                                    f"got {self.batch_size}")
        check(self.max_turns is None or self.max_turns >= 1,
              f"max_turns must be >= 1, got {self.max_turns}")
        check(self.max_new_tokens >= 1, f"max_new_tokens must be >= 1, got "
                                        f"{self.max_new_tokens}")
        check(self.temperature >= 0, f"temperature must be >= 0, got {self.temperature}")
        check(0 < self.top_p <= 1, f"top_p must be in (0, 1], got {self.top_p}")
        check(self.top_k >= 0, f"top_k must be >= 0, got {self.top_k}")
        check(self.history_turns is None or self.history_turns >= 0,
              f"history_turns must be >= 0, got {self.history_turns}")
        check(self.skill is None or os.path.isfile(self.skill),
              f"skill: no file {self.skill!r}")
        check(self.max_context is None or self.max_context > self.max_new_tokens,
              f"max_context must exceed max_new_tokens ({self.max_new_tokens}), got "
              f"{self.max_context}")
        return problems


def sampling(options: Options, temperature: float, stop: Sequence[str] = ()) -> Sampling:
    """``models.generate``'s sampling for ``options`` at ``temperature``, ending rows at
    ``stop`` strings."""
    return Sampling(max_new_tokens=options.max_new_tokens, temperature=temperature,
                    top_k=options.top_k or None,
                    top_p=options.top_p if options.top_p < 1 else None,
                    presence_penalty=options.presence_penalty,
                    frequency_penalty=options.frequency_penalty, stop=tuple(stop))


# generate(model, prompts, sampling=..., key=..., population=..., members=..., streams=...,
# conversation=...) -> models.GenerationOutput: ``models.generate`` or a stand-in with its
# signature (tests inject scripted replies).
Generate = Callable[..., Any]


@dataclasses.dataclass
class PolicyUsage:
    """What a policy's calls cost: the tokens its model processed
    (``GenerationOutput.fed_tokens``, summed) and the seconds the calls took."""

    fed: int = 0
    seconds: float = 0.0


def make_model_policy(model: Any, population: Any, options: Options, *,
                      temperature: float, key: jax.Array | None, generate: Generate,
                      extra_stop: Sequence[str] = (), keep_tokens: bool = False,
                      usage: PolicyUsage | None = None) -> Policy:
    """A policy that chat-templates each conversation (or joins its texts, without
    ``options.chat_template``) and calls ``generate``.

    Args:
      model: a loaded ``models.Model`` (config, params, tokenizer with a chat template).
      population: the generation's ``es.Population``, or None to act with θ itself.
      options: the rollout settings (token limit, history, prompt format, reply prefix,
        sampling).
      temperature: 0 is greedy (training and evaluation use different temperatures).
      key: sampling key (required when temperature > 0); call k uses fold_in(key, k).
        Within a call, with a population every row of the same task shares one sampling
        stream (common random numbers); without one, each (member, task) row has its own
        (members are then independent samples, e.g. a GRPO group).
      generate: ``models.generate`` or a stand-in with its signature.
      extra_stop: the environment's stop strings.
      keep_tokens: return ``Reply``s holding each turn's token ids and log-probabilities.
      usage: if given, counts the tokens every call fed through the model and the time
        the calls took (templating, tokenising and generating).

    With ``options.keep_kv_cache`` the policy keeps one ``models.ConversationCache`` whose
    rows are the (member, task) episodes: a turn feeds only the tokens its prompt adds to
    the last one (the reply's end and the new observation).

    Returns:
      ``policy(conversations, members, task_indices) -> replies``; a reply opens with
      ``options.reply_prefix``, which is appended to the prompt after the generation
      prompt.
    """
    if temperature > 0 and key is None:
        raise ValueError("sampling with temperature > 0 needs a key")
    stop = (*(("\n",) if options.stop_at_newline else ()), *extra_stop)
    call_index = itertools.count()
    cache = ConversationCache(options.max_context) if options.keep_kv_cache else None

    def policy(conversations: list[list[Message]], members: list[int],
               task_indices: list[int]) -> list[str]:
        began = time.perf_counter()
        prompts = [prompt_text(model.tokenizer, trim_history(c, options.history_turns),
                               options.chat_template) + options.reply_prefix
                   for c in conversations]
        if keep_tokens:  # Tokenised here (as generate would) to keep the ids.
            prompts = model.tokenizer(prompts, add_special_tokens=False)["input_ids"]
        call_key = None if key is None else jax.random.fold_in(key, next(call_index))
        output = generate(
            model, prompts, sampling=sampling(options, temperature, stop), key=call_key,
            population=population,
            members=None if population is None else np.asarray(members, dtype=np.int32),
            streams=sample_streams(population is not None, members, task_indices),
            conversation=None if cache is None else Conversation(
                cache, list(zip(members, task_indices))))
        texts = [options.reply_prefix + text for text in output.texts]
        if usage is not None:
            usage.fed += sum(output.fed_tokens)
            usage.seconds += time.perf_counter() - began
        if not keep_tokens:
            return texts
        return [Reply(text, TurnTokens(list(prompt), list(ids), list(logprobs)))
                for text, prompt, ids, logprobs in zip(texts, prompts, output.token_ids,
                                                       output.logprobs)]

    return policy


def prompt_text(tokenizer: Any, messages: list[Message], chat_template: bool = True) -> str:
    """The prompt of ``messages``: chat-templated with the generation prompt, or (without
    ``chat_template``) their texts joined as they are."""
    if not chat_template:
        return plain_prompt(messages)
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)


def offset_tasks(policy: Policy, offset: int) -> Policy:
    """``policy`` for a slice of a task list starting at position ``offset``: it sees the
    tasks' positions in the whole list (which pick their sampling streams)."""
    def shifted(conversations, members, task_indices):
        return policy(conversations, members, [offset + i for i in task_indices])
    return shifted


def sample_streams(common: bool, members: Sequence[int], task_indices: Sequence[int]
                   ) -> np.ndarray:
    """Each row's sampling stream: its task's (``common``, for members of a population) or
    its own (independent samples of the same policy)."""
    task_indices = np.asarray(task_indices, dtype=np.int64)
    if common:
        return task_indices.astype(np.int32)
    if task_indices.size and task_indices.max() >= MAX_TASKS:
        raise ValueError(f"at most {MAX_TASKS} tasks per call, got task index "
                         f"{task_indices.max()}")
    return (np.asarray(members, dtype=np.int64) * MAX_TASKS + task_indices).astype(np.int32)
