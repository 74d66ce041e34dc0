"""reasoning-gym's procedural datasets as one environment family.

``envs.make("reasoning_gym", dataset="countdown", dataset_options='{"max_numbers": 4}')``
plays any of reasoning-gym's datasets (``pip install -e ".[reasoning]"``; the package is
imported only when this environment is used). A task is one dataset entry: the
observation is its question, ``task.answer`` its reference answer (None for the few
datasets without a single one, e.g. ``graph_color``, whose scorer checks validity).

Answer: the text of the reply's LAST ``<answer>...</answer>``; else, when the last
``<answer>`` tag is unclosed (generation stopped at ``</answer>``, the source's stop
string), everything after it; else the reply's last non-blank line. Surrounding
whitespace is stripped; a blank reply has no answer (score 0). Multi-line answers
(grids) therefore need the tags.

Reward: the dataset's own ``score_answer(answer, entry)``, clamped to [0, 1], given on
the final step. With ``max_turns`` 1 (the default) the episode is one reply, scored.
With ``max_turns`` > 1 a reply scoring below 1 comes back as feedback with its score
and the agent answers again, until it scores 1 or runs out of turns; the episode's
reward is the last answer's score (``episode_reward="final"``) or the best one
(``"best"``). ``info["solved"]`` iff that reward is 1. A scorer that raises, runs past
``score_timeout_s`` or exhausts its memory scores 0 and says so in the feedback: the
scorers evaluate model-written text (countdown hands the answer to sympy, where
``9**9**9`` never finishes), so by default they run in a worker process that is killed
and restarted when that happens. It is a guard against stalls, not a security sandbox.

``prompt_style="es_at_scale"`` (countdown, one reply) plays ES at Scale's Countdown
instead (``envs.es_at_scale``): their plain-text prompt (system text, then their puzzle
text; the run's ``rollout.reply_prefix=es_at_scale.REPLY_PREFIX`` and
``rollout.chat_template=False`` complete it), no stop string, and their reward
``0.1 * format + answer`` in [0, 1.1]; ``info["solved"]`` iff the answer is right.

Splits: entries are hash-partitioned by their question text between train, eval and
test (like Sudoku's grids), so the splits never share a question whatever the seeds.
Each split also draws from its own dataset seed: eval and test from (run seed, split),
generation g's training tasks from (``base.generation_seed(run seed, g)``, "train").
With ``train_pool`` N > 0 the training tasks are instead one fixed set of N drawn from
(run seed, "train"), and generation g plays ``tasks_per_generation`` of them in an order
drawn from ``base.generation_seed(run seed, g)`` (all N when the two are equal).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import pickle
import re
import select
import struct
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from agentic_esopt import options as options_lib
from agentic_esopt.envs import base, es_at_scale
from agentic_esopt.envs.base import StepResult

SPLITS = ("train", "eval", "test")
EPISODE_REWARDS = ("final", "best")
PROMPT_STYLES = ("default", "es_at_scale")
INSTALL_HINT = 'reasoning-gym is not installed; install it with pip install -e ".[reasoning]"'
# Config fields the run owns: seeds come from the splits, sizes from the task counts.
RUN_FIELDS = ("seed", "size")
STOP = ("</answer>",)
WORKER_START_TIMEOUT_S = 120.0
WORKER_MEMORY_MB = 4096

SYSTEM_PROMPT = (
    "You solve reasoning problems. Think the problem through, then write your final "
    "answer between <answer> and </answer>, for example <answer>42</answer>, with "
    "nothing else between the tags and in the format the question asks for.")
RETRY_PROMPT = " If an answer is wrong you are told its score and may answer again."

_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.IGNORECASE | re.DOTALL)
_OPEN_TAG = re.compile(r"<answer>", re.IGNORECASE)


def _reasoning_gym():
    """The ``reasoning_gym`` package, or ImportError naming the install command."""
    try:
        import reasoning_gym  # pylint: disable=import-outside-toplevel
    except ImportError as error:
        raise ImportError(INSTALL_HINT) from error
    return reasoning_gym


def dataset_names() -> tuple[str, ...]:
    """Every dataset reasoning-gym registers (needs the package)."""
    return tuple(sorted(_reasoning_gym().factory.DATASETS))


def extract_answer(reply: Any) -> str | None:
    """The answer in ``reply`` (see the module docstring), or None when there is none."""
    if not isinstance(reply, str):
        return None
    tagged = _ANSWER_TAG.findall(reply)
    if tagged:
        answer = tagged[-1]
    else:
        opened = list(_OPEN_TAG.finditer(reply))
        if opened:
            answer = reply[opened[-1].end():]
        else:
            lines = [line for line in reply.splitlines() if line.strip()]
            answer = lines[-1] if lines else ""
    answer = answer.strip()
    return answer or None


def question_split(question: str) -> str:
    """The split a question belongs to (a hash of its whitespace-normalised text)."""
    return SPLITS[base.stable_int(" ".join(question.split())) % len(SPLITS)]


# ----------------------------------------------------------------------------- configs


def _config_kwargs(dataset: str, dataset_options: str) -> tuple[dict[str, Any], list[str]]:
    """The dataset's config fields from the ``dataset_options`` JSON, and the problems."""
    rg = _reasoning_gym()
    _, config_cls = rg.factory.DATASETS[dataset]
    try:
        values = json.loads(dataset_options)
    except json.JSONDecodeError as error:
        return {}, [f"dataset_options is not JSON ({error}): {dataset_options!r}"]
    if not isinstance(values, dict):
        return {}, [f"dataset_options must be a JSON object, got {dataset_options!r}"]
    fields = {f.name: f for f in dataclasses.fields(config_cls)}
    own = [name for name in fields if name not in RUN_FIELDS]
    problems = [f"dataset_options: {name!r} is set by the run (seed and splits), not here"
                for name in values if name in RUN_FIELDS]
    problems += [f"dataset_options: {options_lib.unknown(name, own, f'{dataset} option')}"
                 for name in values if name not in fields]
    kwargs = {}
    for name, value in values.items():
        if name not in own:
            continue
        if isinstance(value, list) and isinstance(fields[name].default, tuple):
            value = tuple(value)
        kwargs[name] = value
    if dataset == "composite" and isinstance(kwargs.get("datasets"), list):
        try:
            kwargs["datasets"] = [rg.composite.DatasetSpec(**{"weight": 1.0, "config": {},
                                                              **spec})
                                  for spec in kwargs["datasets"]]
        except TypeError as error:
            problems.append(f"dataset_options.datasets: each needs a name and may have a "
                            f"weight and a config ({error})")
    return kwargs, problems


def _create(dataset: str, kwargs: Mapping[str, Any], seed: int, size: int) -> Any:
    """A reasoning-gym dataset of ``size`` entries drawn with ``seed``."""
    return _reasoning_gym().create_dataset(dataset, **kwargs, seed=seed, size=size)


def _first_entry_problem(dataset: str, kwargs: Mapping[str, Any]) -> str | None:
    """Why the settings cannot make an entry (a failed check or generator), or None."""
    try:
        _create(dataset, kwargs, seed=0, size=1)[0]
    except Exception as error:  # pylint: disable=broad-except  # any generator's error
        reason = str(error) or type(error).__name__
        return f"dataset_options are invalid for {dataset!r}: {reason}"
    return None


# ----------------------------------------------------------------------------- tasks


@dataclasses.dataclass(frozen=True)
class ReasoningTask:
    """One reasoning-gym entry; ``entry`` is what its scorer reads."""

    id: str
    dataset: str
    question: str
    answer: str | None
    entry: dict[str, Any] = dataclasses.field(compare=False, hash=False, repr=False)


def split_seed(seed: int, split: str) -> int:
    """A dataset seed in [0, 2**31) for ``split`` of a run seeded ``seed`` (entry i of a
    dataset uses ``seed + i``, which stays below 2**32 for numpy-seeded generators)."""
    state = np.random.SeedSequence([seed, base.stable_int(split)]).generate_state(1)[0]
    return int(state) >> 1


def generate_tasks(dataset: str, kwargs: Mapping[str, Any], n: int, seed: int, split: str,
                   *, max_attempts: int | None = None) -> list[ReasoningTask]:
    """``n`` tasks of ``split`` with distinct questions, deterministic in the arguments.

    Args:
      dataset: a reasoning-gym dataset name.
      kwargs: its config fields (without seed and size).
      n: number of tasks.
      seed: the split's seed (see ``split_seed``).
      split: one of ``SPLITS``; entries whose question hashes to another split are skipped.
      max_attempts: entries to draw before giving up (default 20·n + 100).

    Returns:
      Tasks with ids ``{dataset}-{split}-{seed}-{entry index}``.

    Raises:
      ValueError: when the settings allow too few distinct questions for ``n``.
    """
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose one of {SPLITS}")
    max_attempts = 20 * n + 100 if max_attempts is None else max_attempts
    source = _create(dataset, kwargs, seed=seed, size=max_attempts)
    tasks, seen, failure = [], set(), None
    for index in range(max_attempts):
        if len(tasks) == n:
            break
        try:
            entry = source[index]
        except Exception as error:  # pylint: disable=broad-except  # a generator's bug
            failure = f"; the generator failed: {type(error).__name__}: {error}"
            continue
        question = entry["question"]
        if question_split(question) != split or question in seen:
            continue
        seen.add(question)
        answer = entry.get("answer")
        tasks.append(ReasoningTask(id=f"{dataset}-{split}-{seed}-{index}", dataset=dataset,
                                   question=question,
                                   answer=None if answer is None else str(answer),
                                   entry=entry))
    if len(tasks) < n:
        raise ValueError(f"reasoning-gym {dataset!r} made only {len(tasks)} of {n} distinct "
                         f"{split} questions in {max_attempts} entries{failure or ''}; its "
                         "settings allow too few distinct questions, ask for fewer tasks")
    return tasks


# ----------------------------------------------------------------------------- scoring


def _describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"[:300]


def _clamp(score: Any) -> float:
    score = float(score)
    return min(1.0, max(0.0, score)) if math.isfinite(score) else 0.0


class InProcessScorer:
    """Scores in this process (``score_timeout_s=0``): no start-up, no stall guard."""

    def __init__(self, dataset: str, kwargs: Mapping[str, Any]):
        self._dataset = _create(dataset, kwargs, seed=0, size=1)

    def __call__(self, answer: str | None, entry: dict[str, Any]) -> tuple[float, str | None]:
        """(score in [0, 1], why it could not be scored or None)."""
        try:
            return _clamp(self._dataset.score_answer(answer, entry)), None
        except Exception as error:  # pylint: disable=broad-except  # any scorer's error
            return 0.0, _describe(error)

    def close(self) -> None:
        """Nothing to release."""


def _write_frame(stream: Any, obj: Any) -> None:
    data = pickle.dumps(obj)
    stream.write(struct.pack(">I", len(data)) + data)
    stream.flush()


def _read_frame(stream: Any) -> Any:
    header = stream.read(4)
    if len(header) < 4:
        return None
    (length,) = struct.unpack(">I", header)
    return pickle.loads(stream.read(length))


def _stop_worker(state: dict[str, Any]) -> None:
    process, state["process"] = state.get("process"), None
    if process is not None and process.poll() is None:
        process.kill()
    if process is not None:
        process.wait()
        for stream in (process.stdin, process.stdout):
            stream.close()


class WorkerScorer:
    """Scores in a worker process, killed and restarted when one answer takes longer than
    ``timeout_s`` or crashes it. Thread-safe; ``close`` stops the worker (a later score
    starts a new one) and so does garbage collection or interpreter exit."""

    def __init__(self, dataset: str, kwargs: Mapping[str, Any], timeout_s: float):
        self._dataset, self._kwargs = dataset, dict(kwargs)
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._state: dict[str, Any] = {"process": None}
        self._finalizer = weakref.finalize(self, _stop_worker, self._state)

    def _start(self) -> subprocess.Popen:
        package_root = str(Path(__file__).resolve().parents[2])
        env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
               "MKL_NUM_THREADS": "1", "JAX_PLATFORMS": "cpu",
               "PYTHONPATH": os.pathsep.join(filter(None, [package_root,
                                                           os.environ.get("PYTHONPATH")]))}
        process = subprocess.Popen(
            [sys.executable, "-c", f"from {__name__} import serve_scores; serve_scores()"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            env=env, bufsize=0, start_new_session=True)
        self._state["process"] = process
        _write_frame(process.stdin, (self._dataset, self._kwargs, WORKER_MEMORY_MB,
                                     os.getpid()))
        if self._read_reply(process, WORKER_START_TIMEOUT_S) != {"ready": True}:
            _stop_worker(self._state)
            raise RuntimeError(f"the reasoning-gym scoring worker for {self._dataset!r} did "
                               f"not start within {WORKER_START_TIMEOUT_S:.0f} s")
        return process

    @staticmethod
    def _read_reply(process: subprocess.Popen, timeout_s: float) -> dict[str, Any] | None:
        """The worker's next JSON line; None on timeout, exit or garbage."""
        deadline, buffer = time.monotonic() + timeout_s, b""
        fd = process.stdout.fileno()
        while b"\n" not in buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                return None
            buffer += chunk
        try:
            reply = json.loads(buffer.split(b"\n", 1)[0])
        except ValueError:
            return None
        return reply if isinstance(reply, dict) else None

    def __call__(self, answer: str | None, entry: dict[str, Any]) -> tuple[float, str | None]:
        """(score in [0, 1], why it could not be scored or None)."""
        with self._lock:
            process = self._state["process"]
            if process is None or process.poll() is not None:
                _stop_worker(self._state)
                process = self._start()
            try:
                _write_frame(process.stdin, (answer, entry))
            except OSError:  # the worker died since the last answer: once more, afresh
                _stop_worker(self._state)
                process = self._start()
                _write_frame(process.stdin, (answer, entry))
            reply = self._read_reply(process, self.timeout_s)
            if reply is None:
                crashed = process.poll() is not None
                _stop_worker(self._state)
                if crashed:
                    return 0.0, "the scorer crashed on this answer"
                return 0.0, f"scoring took longer than {self.timeout_s:g} s"
        if "error" in reply:
            return 0.0, str(reply["error"])
        try:
            return _clamp(reply.get("score")), None
        except (TypeError, ValueError):
            return 0.0, f"the scorer returned {reply.get('score')!r}"

    def close(self) -> None:
        """Stops the worker, if one runs."""
        with self._lock:
            _stop_worker(self._state)


def serve_scores() -> None:
    """The scoring worker's main loop (stdin: pickled frames; stdout: JSON lines)."""
    replies = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)  # What a scorer prints must not reach the protocol stream.
    requests = sys.stdin.buffer
    dataset, kwargs, memory_mb, parent = _read_frame(requests)
    try:  # Die with the parent even while stuck in one computation (Linux).
        import ctypes  # pylint: disable=import-outside-toplevel
        ctypes.CDLL(None, use_errno=True).prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:
        return
    scorer = _create(dataset, kwargs, seed=0, size=1)
    try:
        import resource  # pylint: disable=import-outside-toplevel
        limit = memory_mb * 2 ** 20
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    except (ImportError, ValueError, OSError):
        pass
    replies.write(b'{"ready": true}\n')
    while (request := _read_frame(requests)) is not None:
        answer, entry = request
        try:
            reply = {"score": float(scorer.score_answer(answer, entry))}
        except BaseException as error:  # pylint: disable=broad-except  # also MemoryError
            reply = {"error": _describe(error)}
        replies.write(json.dumps(reply).encode() + b"\n")


# ----------------------------------------------------------------------------- environment


def checked_task(env: Any, task: Any, max_turns: int | None) -> ReasoningTask:
    """``task``, once ``env.reset``'s arguments are checked (TypeError, ValueError)."""
    if not isinstance(task, ReasoningTask):
        raise TypeError(f"{type(env).__name__} needs a ReasoningTask, got "
                        f"{type(task).__name__}")
    if max_turns is not None and max_turns < 1:
        raise ValueError(f"max_turns must be >= 1, got {max_turns}")
    return task


class ReasoningGymEnv:
    """One episode on a reasoning-gym task (see the module docstring)."""

    def __init__(self, scorer: Any, max_turns: int = 1, episode_reward: str = "final"):
        self.scorer = scorer
        self.turn_limit_default = max_turns
        self.episode_reward = episode_reward
        self._task: ReasoningTask | None = None
        self._turn_limit = max_turns
        self._turn = 0
        self._best = 0.0
        self._done = False

    def reset(self, task: ReasoningTask, *, max_turns: int | None = None) -> str:
        """Starts ``task``; returns its question (and the number of attempts, if several)."""
        self._task = checked_task(self, task, max_turns)
        self._turn_limit = (self.turn_limit_default if max_turns is None
                            else min(self.turn_limit_default, max_turns))
        self._turn, self._best, self._done = 0, 0.0, False
        if self._turn_limit == 1:
            return task.question
        return f"{task.question}\n\nYou have {self._turn_limit} attempts."

    def step(self, action_text: str) -> StepResult:
        """Scores the reply's answer; ends the episode when it is right or turns run out."""
        if self._task is None or self._done:
            raise RuntimeError("step() called on an episode that was not reset or has ended")
        self._turn += 1
        answer = extract_answer(action_text)
        if answer is None:
            score, error = 0.0, None
        else:
            score, error = self.scorer(answer, self._task.entry)
        self._best = max(self._best, score)
        left = self._turn_limit - self._turn
        self._done = score >= 1.0 or left == 0
        final = self._best if self.episode_reward == "best" else score
        info = {"turn": self._turn, "answer": answer, "score": score,
                "best_score": self._best, "error": error,
                "solved": self._done and final >= 1.0}
        if answer is None:
            feedback = ("Your reply has no answer; write it between <answer> and "
                        "</answer>.")
        elif error is not None:
            feedback = f"Your answer could not be checked ({error}); it scores 0."
        elif score >= 1.0:
            feedback = "Correct."
        else:
            feedback = f"Your answer scored {score:.2f} out of 1; it is not correct."
        if not self._done:
            feedback += (f" Try again with a new answer between <answer> and </answer>. "
                         f"Attempts left: {left}.")
        elif score < 1.0 and self._turn_limit > 1:
            feedback += " No attempts left."
        return StepResult(feedback, final if self._done else 0.0, self._done, info)


class EsAtScaleCountdownEnv:
    """One reply to a countdown task, prompted and rewarded as ES at Scale's
    (``envs.es_at_scale``); ``info`` has the format and answer rewards."""

    def __init__(self) -> None:
        self._task: ReasoningTask | None = None

    def reset(self, task: ReasoningTask, *, max_turns: int | None = None) -> str:
        """Starts ``task``; returns their puzzle text."""
        self._task = checked_task(self, task, max_turns)
        metadata = task.entry["metadata"]
        return es_at_scale.user_text(metadata["numbers"], metadata["target"])

    def step(self, action_text: str) -> StepResult:
        """Scores the reply; the episode ends."""
        if self._task is None:
            raise RuntimeError("step() called on an episode that was not reset or has ended")
        metadata, self._task = self._task.entry["metadata"], None
        total, fmt, correct = es_at_scale.reward(action_text, metadata["numbers"],
                                                 metadata["target"])
        info = {"turn": 1, "answer": es_at_scale.last_answer(action_text), "score": total,
                "format_reward": fmt, "answer_reward": correct, "solved": correct == 1.0}
        return StepResult("Correct." if correct else "Not correct.", total, True, info)


@dataclasses.dataclass(frozen=True)
class Options:
    """reasoning-gym settings (``envs.make("reasoning_gym", **options)``)."""

    dataset: str = options_lib.field("countdown", "A reasoning-gym dataset name.")
    dataset_options: str = options_lib.field("{}", "The dataset's generator options as a "
                                                   "JSON object (its config fields but seed "
                                                   "and size), e.g. '{\"max_numbers\": 4}'.")
    max_turns: int = options_lib.field(1, "Answers per task: 1 = one reply, scored; more = "
                                          "a wrong answer comes back with its score.")
    episode_reward: str = options_lib.field("final", "With several answers, reward the "
                                                     "'final' one's score or the 'best'.")
    score_timeout_s: float = options_lib.field(10.0, "Seconds one answer may take to score "
                                                     "in the worker process; 0 scores in "
                                                     "this process, unguarded.")
    prompt_style: str = options_lib.field("default", "'default' (the dataset's question "
                                                     "and scorer) or 'es_at_scale' (their "
                                                     "Countdown prompt and reward).")
    train_pool: int = options_lib.field(0, "0: fresh training tasks every generation; N: "
                                           "every generation draws from one set of N.")

    def problems(self) -> list[str]:
        problems = []
        check = options_lib.checker(problems)
        check(self.max_turns >= 1, f"max_turns must be >= 1, got {self.max_turns}")
        check(self.episode_reward in EPISODE_REWARDS, f"episode_reward must be one of "
                                                      f"{EPISODE_REWARDS}, got "
                                                      f"{self.episode_reward!r}")
        check(self.score_timeout_s >= 0,
              f"score_timeout_s must be >= 0, got {self.score_timeout_s}")
        check(self.prompt_style in PROMPT_STYLES, f"prompt_style must be one of "
                                                  f"{PROMPT_STYLES}, got {self.prompt_style!r}")
        check(self.train_pool >= 0, f"train_pool must be >= 0, got {self.train_pool}")
        if self.prompt_style == "es_at_scale":
            check(self.dataset == "countdown", f"prompt_style='es_at_scale' is Countdown's; "
                                               f"dataset must be 'countdown', got "
                                               f"{self.dataset!r}")
            check(self.max_turns == 1, f"prompt_style='es_at_scale' is one reply; max_turns "
                                       f"must be 1, got {self.max_turns}")
        try:
            names = dataset_names()
        except ImportError as error:
            return problems + [str(error)]
        if self.dataset not in names:
            unknown = options_lib.unknown(self.dataset, names, "reasoning-gym dataset")
            return problems + [f"dataset: {unknown}"]
        kwargs, found = _config_kwargs(self.dataset, self.dataset_options)
        if not found:
            found = [p for p in [_first_entry_problem(self.dataset, kwargs)] if p]
        return problems + found


def make_source(options: Options, splits: base.Splits) -> base.TaskSource:
    """reasoning-gym tasks of ``options.dataset``; train and held-out questions disjoint."""
    kwargs, problems = _config_kwargs(options.dataset, options.dataset_options)
    if problems:
        raise ValueError("invalid reasoning_gym options:\n  " + "\n  ".join(problems))
    train_tasks = training_tasks(options, kwargs, splits)
    train_tasks(0)  # Fails now, before any compute, if the settings cannot make tasks.
    eval_tasks = generate_tasks(options.dataset, kwargs, splits.eval_size,
                                split_seed(splits.seed, splits.eval_split), splits.eval_split)
    if options.prompt_style == "es_at_scale":
        return base.TaskSource(env_factory=EsAtScaleCountdownEnv,
                               system_prompt=es_at_scale.SYSTEM, train_tasks=train_tasks,
                               eval_tasks=eval_tasks)
    if options.score_timeout_s > 0:
        scorer = WorkerScorer(options.dataset, kwargs, options.score_timeout_s)
    else:
        scorer = InProcessScorer(options.dataset, kwargs)
    prompt = SYSTEM_PROMPT + (RETRY_PROMPT if options.max_turns > 1 else "")
    return base.TaskSource(
        env_factory=functools.partial(ReasoningGymEnv, scorer, max_turns=options.max_turns,
                                      episode_reward=options.episode_reward),
        system_prompt=prompt, train_tasks=train_tasks, eval_tasks=eval_tasks, stop=STOP,
        on_close=scorer.close)


def training_tasks(options: Options, kwargs: Mapping[str, Any], splits: base.Splits
                   ) -> Callable[[int], list[ReasoningTask]]:
    """generation -> its training tasks: fresh ones, or drawn from the fixed
    ``train_pool`` (see the module docstring)."""
    count = splits.tasks_per_generation
    if options.train_pool and options.train_pool < count:
        raise ValueError(f"train_pool ({options.train_pool}) must hold at least "
                         f"tasks_per_generation ({count}) tasks")
    pool = (tuple(generate_tasks(options.dataset, kwargs, options.train_pool,
                                 split_seed(splits.seed, "train"), "train"))
            if options.train_pool else ())

    @functools.lru_cache(maxsize=8)
    def generation_tasks(generation: int) -> tuple[ReasoningTask, ...]:
        seed = split_seed(base.generation_seed(splits.seed, generation), "train")
        if pool:
            order = np.random.default_rng(seed).permutation(len(pool))[:count]
            return tuple(pool[i] for i in order)
        return tuple(generate_tasks(options.dataset, kwargs, count, seed, "train"))

    return lambda generation: list(generation_tasks(generation))
