"""Prompt–parameter co-evolution for automatic heuristic design (AHD).

One run evolves a population of heuristics (EoH or Sample, see `agents.eoh`) and, with
ES, the parameters θ of the LLM that writes them. Every batch of LLM calls the search
issues is one ES generation:

    population = strategy.ask(state)                                # G keys, no weights
    replies    = generate(θ, prompts, population, members, key)     # prompt j -> member j % G
    offspring  = sandbox scores of the heuristics read from the replies
    rewards    = per-member means of eoh.eoh_es_reward / eoh.sample_es_rewards
    state, _   = strategy.tell(state, population, rewards)

A member that answered no prompt of a batch (only a budget-truncated last batch can leave
one out) gets the mean reward of all the batch's offspring, which z-score shaping maps to
a weight near zero. Methods "eoh" and "sample" run the same loop with the unperturbed
model (``population=None``) and no ES. The sampling key of a batch is
``fold_in(key(seed) stream 1, call index of its first prompt)``, so replies depend only on
the run seed, θ and the batch.

Files in a run directory:

  run.json           the `AHDConfig`; a rerun must match it (evaluation fields aside)
  programs.jsonl     every program: code, score, operator, member, generation, reward
  state.json         the search state after the last completed batch (`agents.eoh`)
  metrics.jsonl      one line per batch: calls, validity, best, member rewards, σ, norm
  history.jsonl      the ES history (`es.history`; replay rebuilds θ bitwise), ES only
  checkpoints/       orbax checkpoints of the ES state (``training.checkpoint``), step =
                     LLM calls completed; the last two are kept, ES only
  summary.json       written by `run` at the end

Resuming continues the search from state.json (eoh's own resume), loads the ES state
saved at that same call count, cuts the history back to its generation and drops the
metrics of later batches, so a run killed at any moment and rerun ends bitwise where an
uninterrupted run ends (for a deterministic ``generate``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import time
import typing
from typing import Any, Callable, NamedTuple, Sequence

import jax
import numpy as np
from absl import logging

from agentic_esopt import es, fileio, models
from agentic_esopt.agents import eoh
from agentic_esopt.envs.ahd import aco, sandbox
from agentic_esopt.envs.ahd.tasks import TASKS
from agentic_esopt.models import loading
from agentic_esopt.training.checkpoint import Checkpointer

PyTree = Any
Generate = Callable[[PyTree, list[str], "es.Population | None", np.ndarray, jax.Array],
                    Sequence[str]]

METHODS = ("eoh", "eoh_es", "sample", "sample_es")
BASE_METHODS = ("eoh", "sample")
EVAL_ONLY_FIELDS = ("eval_size", "anchor_data")  # may change when a run is resumed
TRAIN_INSTANCES_SEED = 0  # search instances: the same for every method and seed
EVAL_INSTANCES_SEED = 1   # held-out generated instances (without --anchor_data)
ANCHOR_SPLIT = "test"
RUN_FILE = "run.json"
METRICS_FILE = "metrics.jsonl"
HISTORY_FILE = "history.jsonl"
SUMMARY_FILE = "summary.json"
CHECKPOINT_DIR = "checkpoints"
_ES_STREAM, _SAMPLING_STREAM = 0, 1


def _field(default: Any, help_text: str) -> Any:
    return dataclasses.field(default=default, metadata={"help": help_text})


@dataclasses.dataclass(frozen=True)
class AHDConfig:
    """One heuristic-design run (see each field's help)."""

    task: str = _field("tsp_constructive", f"AHD task, one of {sorted(TASKS)}.")
    size: int | None = _field(None, "Problem size (default: the task's training size).")
    method: str = _field("eoh_es", f"Search method, one of {METHODS}.")
    budget: int = _field(16, "LLM calls (prompts) the search may make.")
    seed: int = _field(0, "Run seed: ES noise, sampling and parent selection derive "
                          "from it.")
    population_size: int = _field(4, "G: ES members; Sample batches hold "
                                     "G*samples_per_member prompts and EoH applies each "
                                     "operator G times per generation (with or without ES).")
    noise: str = _field("lowrank", "ES noise: 'full' or 'lowrank'.")
    rank: int = _field(1, "Rank r of low-rank noise.")
    sigma_start: float = _field(1e-3, "σ of the first batch (cosine schedule).")
    sigma_end: float = _field(0.0, "σ of the last planned batch.")
    learning_rate: float = _field(5e-4, "ES learning rate α (SGD).")
    fitness: str = _field("zscore", "Reward shaping: zscore, centered_rank or identity.")
    scope: str = _field("full", "Perturbed parameters: 'full', 'all_linear' or a regex.")
    eoh_population: int = _field(4, "Heuristics EoH keeps between generations.")
    samples_per_member: int = _field(1, "Sample prompts per member and batch.")
    model: str = _field("smollm2-135m", "'smollm2-135m', 'tiny', a .gguf file or a HF "
                                        "checkpoint folder.")
    dtype: str = _field("float32", "Parameter dtype: float32, bfloat16 or float16.")
    max_new_tokens: int = _field(384, "Tokens generated per LLM call.")
    temperature: float = _field(0.7, "Sampling temperature (SmolLM2-135M writes mostly "
                                      "unparsable code at 1.0).")
    top_p: float = _field(0.9, "Nucleus sampling mass (1 = off).")
    train_size: int = _field(8, "Generated instances every heuristic is scored on during "
                                "the search.")
    eval_size: int = _field(64, "Evaluation instances the best heuristic and the baseline "
                                "are scored on at the end.")
    anchor_data: str | None = _field(None, "Anchor data root (e.g. ../shared/data/anchors): "
                                           "evaluate on its published test instances "
                                           "instead of generated ones.")
    timeout_s: float = _field(10.0, "Wall-clock limit per heuristic evaluation (sandbox).")
    fast_aco: bool = _field(False, "ACO tasks: few ants and iterations (fast, noisier).")

    @property
    def uses_es(self) -> bool:
        return self.method.endswith("_es")

    @property
    def base_method(self) -> str:
        return self.method.removesuffix("_es")

    def problem_size(self) -> int:
        return TASKS[self.task].default_size if self.size is None else self.size

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def field_specs() -> list[tuple[str, type, Any, str]]:
    """(name, base type, default, help) of every `AHDConfig` field, for flag definitions."""
    hints = typing.get_type_hints(AHDConfig)
    specs = []
    for field in dataclasses.fields(AHDConfig):
        args = [a for a in typing.get_args(hints[field.name]) if a is not type(None)]
        specs.append((field.name, args[0] if args else hints[field.name], field.default,
                      field.metadata["help"]))
    return specs


def _type_problems(config: AHDConfig) -> list[str]:
    problems = []
    for name, expected, default, _ in field_specs():
        value = getattr(config, name)
        if value is None and default is None:
            continue
        if expected is float:
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        else:
            ok = isinstance(value, expected) and (expected is bool or
                                                  not isinstance(value, bool))
        if not ok:
            problems.append(f"{name} must be {expected.__name__}, got {value!r}")
    return problems


def _anchor_problems(config: AHDConfig) -> list[str]:
    task = TASKS[config.task]
    if task.anchor_name is None:
        return [f"task {config.task!r} has no published anchor instances"]
    folder = os.path.join(config.anchor_data, "ahd", "datasets", task.anchor_name)
    stem = os.path.join(folder, f"{ANCHOR_SPLIT}{config.problem_size()}_dataset")
    if not (os.path.exists(stem + ".npy") or os.path.exists(stem + ".npz")):
        return [f"anchor_data has no {stem}.np[yz]"]
    return []


def problems(config: AHDConfig) -> list[str]:
    """Every problem with `config` (empty if it is valid); cheap, no compute."""
    found = _type_problems(config)
    if found:
        return found

    def check(condition: bool, message: str) -> None:
        if not condition:
            found.append(message)

    check(config.task in TASKS, f"unknown task {config.task!r}; choose one of {sorted(TASKS)}")
    check(config.size is None or config.size >= 1, f"size must be >= 1, got {config.size}")
    check(config.method in METHODS, f"unknown method {config.method!r}; choose one of "
                                    f"{METHODS}")
    check(config.budget >= 1, f"budget must be >= 1, got {config.budget}")
    check(config.population_size >= (2 if config.uses_es else 1),
          f"population_size must be >= {2 if config.uses_es else 1} for "
          f"{config.method}, got {config.population_size}")
    check(config.noise in es.noise.NOISE_MODES,
          f"unknown noise {config.noise!r}; choose one of {es.noise.NOISE_MODES}")
    check(config.rank >= 1, f"rank must be >= 1, got {config.rank}")
    check(config.sigma_start >= 0 and config.sigma_end >= 0,
          f"sigma_start and sigma_end must be >= 0, got {config.sigma_start}, "
          f"{config.sigma_end}")
    check(config.learning_rate >= 0, f"learning_rate must be >= 0, got "
                                     f"{config.learning_rate}")
    check(config.fitness in es.fitness.SHAPERS,
          f"unknown fitness {config.fitness!r}; choose one of {sorted(es.fitness.SHAPERS)}")
    try:
        es.noise.validate_scope(config.scope)
    except ValueError as error:
        found.append(str(error))
    check(config.eoh_population >= 1, f"eoh_population must be >= 1, got "
                                      f"{config.eoh_population}")
    check(config.samples_per_member >= 1, f"samples_per_member must be >= 1, got "
                                          f"{config.samples_per_member}")
    check(config.model in ("tiny", *loading.GGUF_NAMES) or os.path.exists(config.model),
          f"model {config.model!r} is not 'tiny', one of {loading.GGUF_NAMES}, or an "
          "existing .gguf file / checkpoint folder")
    check(config.dtype in loading.DTYPES,
          f"unknown dtype {config.dtype!r}; choose one of {tuple(loading.DTYPES)}")
    check(config.max_new_tokens >= 1, f"max_new_tokens must be >= 1, got "
                                      f"{config.max_new_tokens}")
    check(config.temperature >= 0, f"temperature must be >= 0, got {config.temperature}")
    check(0 < config.top_p <= 1, f"top_p must be in (0, 1], got {config.top_p}")
    check(config.train_size >= 1, f"train_size must be >= 1, got {config.train_size}")
    check(config.eval_size >= 1, f"eval_size must be >= 1, got {config.eval_size}")
    check(config.timeout_s > 0, f"timeout_s must be > 0, got {config.timeout_s}")
    if config.anchor_data is not None and config.task in TASKS and not found:
        found.extend(_anchor_problems(config))
    return found


def check(config: AHDConfig) -> AHDConfig:
    """Raises ValueError listing every problem with `config`; returns it if valid."""
    found = problems(config)
    if found:
        raise ValueError("invalid AHD configuration:\n  " + "\n  ".join(found))
    return config


# ---------------------------------------------------------------- the search and ES


def num_members(config: AHDConfig) -> int:
    """Members answering the prompts: G with ES, else the one unperturbed model."""
    return config.population_size if config.uses_es else 1


def search_config(config: AHDConfig) -> eoh.EoHConfig | eoh.SampleConfig:
    """The EoH / Sample settings of a run (batch shapes match with and without ES)."""
    if config.base_method == "eoh":
        return eoh.EoHConfig(population_size=config.eoh_population, budget=config.budget,
                             offspring_per_operator=config.population_size,
                             num_members=num_members(config), seed=config.seed)
    return eoh.SampleConfig(budget=config.budget,
                            batch_size=config.population_size * config.samples_per_member,
                            num_members=num_members(config))


def planned_generations(config: AHDConfig) -> int:
    """ES generations (batches) the budget allows, the σ schedule's length.

    EoH is planned with one initialisation batch; if initialisation needs more, the
    schedule holds σ at ``sigma_end`` for the extra batches.
    """
    search = search_config(config)
    if isinstance(search, eoh.SampleConfig):
        return math.ceil(config.budget / search.batch_size)
    init_calls = max(search.population_size, search.num_members)
    per_generation = len(search.operators) * search.offspring_per_operator
    return 1 + math.ceil(max(config.budget - init_calls, 0) / per_generation)


def make_strategy(config: AHDConfig) -> es.Strategy | None:
    """The ES strategy of an ``*_es`` run (σ cosine over the planned batches), else None."""
    if not config.uses_es:
        return None
    sigma = es.schedules.cosine(config.sigma_start, config.sigma_end,
                                planned_generations(config))
    return es.agentic_esopt(population_size=config.population_size, sigma=sigma,
                            learning_rate=config.learning_rate, noise=config.noise,
                            rank=config.rank, fitness=config.fitness, scope=config.scope)


def member_rewards(batch: eoh.Batch, size: int) -> np.ndarray:
    """(size,) mean reward of each member's offspring; the batch mean for members with none."""
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


# ---------------------------------------------------------------- files


def es_checkpointer(run_dir: str) -> Checkpointer:
    """The run's ES checkpoints: step k holds the ES state after k LLM calls. Two are kept,
    because the search state may lag the ES state by one batch after a crash."""
    return Checkpointer(os.path.join(run_dir, CHECKPOINT_DIR), max_to_keep=2)


def _open_run_dir(run_dir: str, config: AHDConfig) -> int:
    """Records or checks the config; returns the LLM calls the run has completed."""
    os.makedirs(run_dir, exist_ok=True)
    run_path = os.path.join(run_dir, RUN_FILE)
    state_path = os.path.join(run_dir, eoh.STATE_FILE)
    if os.path.exists(run_path):
        with open(run_path, encoding="utf-8") as file:
            saved = json.load(file)
        current = config.to_dict()
        changed = [f"{name}: {saved.get(name)!r} in the run, {current.get(name)!r} now"
                   for name in sorted(set(saved) | set(current))
                   if name not in EVAL_ONLY_FIELDS and saved.get(name) != current.get(name)]
        if changed:
            raise ValueError(f"{run_dir} holds a run with other settings, so it cannot be "
                             "resumed with these:\n  " + "\n  ".join(changed))
    elif os.path.exists(state_path) or os.path.exists(os.path.join(run_dir,
                                                                   eoh.PROGRAMS_FILE)):
        raise ValueError(f"{run_dir} holds a search without {RUN_FILE}; use a new directory")
    fileio.atomic_write_text(run_path, json.dumps(config.to_dict(), indent=2))
    if not os.path.exists(state_path):
        return 0
    with open(state_path, encoding="utf-8") as file:
        return int(json.load(file)["call_count"])


def _restore_es(run_dir: str, checkpointer: Checkpointer, strategy: es.Strategy,
                params: PyTree, run_key: jax.Array,
                calls: int) -> tuple[es.ESState, es.history.HistoryWriter]:
    """The ES state and history writer of a run that has completed `calls` LLM calls."""
    state = strategy.init(run_key, params)
    history_path = os.path.join(run_dir, HISTORY_FILE)
    if calls == 0:
        return state, es.history.HistoryWriter.create(history_path, strategy.spec, run_key)
    if calls not in checkpointer.steps():
        raise FileNotFoundError(f"the search in {run_dir} completed {calls} calls but the ES "
                                f"checkpoint of step {calls} is missing from "
                                f"{checkpointer.directory}; the ES state cannot be resumed")
    state = checkpointer.restore(calls, state)
    checkpointer.discard_after(calls)  # The ES state of a batch the search did not record.
    history = es.history.HistoryWriter.open(history_path,
                                            keep_generations=int(state.generation))
    if history.header["strategy"] != strategy.spec:
        raise ValueError(f"{history_path} was written by another strategy: "
                         f"{history.header['strategy']} != {strategy.spec}")
    return state, history


# ---------------------------------------------------------------- the loop


class Outcome(NamedTuple):
    """A finished co-evolution run.

    Attributes:
      search: the final search state (``search.population[0]`` is the best heuristic).
      params: the final model parameters (the initial ones without ES).
      es_state: the final ES state, or None without ES.
    """

    search: eoh.SearchState
    params: PyTree
    es_state: es.ESState | None


class _Loop:
    """Answers the search's LLM calls with the ES members and updates θ after each batch."""

    def __init__(self, generate: Generate, params: PyTree, strategy: es.Strategy | None,
                 es_state: es.ESState | None, history: es.history.HistoryWriter | None,
                 sampling_key: jax.Array, calls: int, run_dir: str, minimise: bool,
                 checkpointer: Checkpointer | None):
        self.generate = generate
        self.minimise = minimise
        self.params = params
        self.strategy = strategy
        self.es_state = es_state
        self.history = history
        self.sampling_key = sampling_key
        self.calls = calls
        self.run_dir = run_dir
        self.checkpointer = checkpointer
        self.population = None
        self.batch_start = time.monotonic()

    def llm(self, prompts: list[str], members: list[int]) -> list[str]:
        self.batch_start = time.monotonic()
        params = self.params
        if self.strategy is not None:
            self.population = self.strategy.ask(self.es_state)
            params = self.es_state.params
        key = jax.random.fold_in(self.sampling_key, self.calls)
        return list(self.generate(params, prompts, self.population,
                                  np.asarray(members, np.int32), key))

    def on_batch(self, batch: eoh.Batch, search: eoh.SearchState) -> None:
        record = dict(calls=search.call_count, search_generation=search.generation,
                      batch_size=len(batch.offspring),
                      num_valid=sum(child.valid for child in batch.offspring),
                      batch_best=best_objective([c.objective for c in batch.offspring],
                                                self.minimise),
                      best=search.population[0].objective if search.population else None)
        if self.strategy is not None:
            rewards = member_rewards(batch, self.population.size)
            self.es_state, metrics = self.strategy.tell(self.es_state, self.population,
                                                        rewards)
            self.history.append(self.population, rewards, metrics,
                                time.monotonic() - self.batch_start, calls=search.call_count)
            record.update(es_generation=int(self.es_state.generation),
                          member_rewards=rewards.tolist(), sigma=float(metrics["sigma"]),
                          update_norm=float(metrics["update_norm"]))
            self.checkpointer.save(self.es_state, step=search.call_count)
        record["batch_seconds"] = time.monotonic() - self.batch_start
        path = os.path.join(self.run_dir, METRICS_FILE)
        fileio.write_jsonl(path, fileio.read_jsonl(path) + [record])
        logging.info("calls %d: %d/%d valid, batch best %s, best %s", search.call_count,
                     record["num_valid"], record["batch_size"], record["batch_best"],
                     record["best"])
        self.calls = search.call_count


def best_objective(objectives: Sequence[float | None], minimise: bool) -> float | None:
    """The best of `objectives` (None entries skipped), or None if there is none."""
    valid = [o for o in objectives if o is not None]
    if not valid:
        return None
    return min(valid) if minimise else max(valid)


def coevolve(generate: Generate, params: PyTree, evaluate: eoh.Evaluate, task: Any,
             config: AHDConfig, run_dir: str) -> Outcome:
    """Runs (or resumes) heuristic search, with ES on the model for ``*_es`` methods.

    Args:
      generate: ``generate(params, prompts, population, members, key) -> replies``:
        reply j from member ``members[j]`` of ``population`` around ``params``
        (``population`` is None without ES).
      params: the model's initial parameters.
      evaluate: ``evaluate(codes) -> results`` (e.g. `eoh.sandbox_evaluator`).
      task: the task record (`envs.ahd.AHDTask` or any `ahd_prompts.HeuristicTask`).
      config: the run settings (model, sampling and evaluation fields are not used here).
      run_dir: the run directory; a run already there is resumed.

    Returns:
      The `Outcome`.
    """
    check(config)
    calls = _open_run_dir(run_dir, config)
    strategy = make_strategy(config)
    seed_key = jax.random.key(config.seed)
    es_state = history = None
    with contextlib.ExitStack() as closing:
        checkpointer = None
        if strategy is not None:
            checkpointer = closing.enter_context(contextlib.closing(es_checkpointer(run_dir)))
            run_key = jax.random.key_data(jax.random.fold_in(seed_key, _ES_STREAM))
            es_state, history = _restore_es(run_dir, checkpointer, strategy, params, run_key,
                                            calls)
        metrics_path = os.path.join(run_dir, METRICS_FILE)
        fileio.write_jsonl(metrics_path, [r for r in fileio.read_jsonl(metrics_path)
                                          if r["calls"] <= calls])
        loop = _Loop(generate, params, strategy, es_state, history,
                     jax.random.fold_in(seed_key, _SAMPLING_STREAM), calls, run_dir,
                     task.minimise, checkpointer)
        search = search_config(config)
        runner = eoh.run_eoh if isinstance(search, eoh.EoHConfig) else eoh.run_sample
        final = runner(loop.llm, evaluate, task, search, run_dir, resume=True,
                       on_batch=loop.on_batch)
    return Outcome(final, loop.es_state.params if strategy else params, loop.es_state)


# ---------------------------------------------------------------- a full AHD run


def chat_prompt(tokenizer: Any, prompt: str) -> str:
    """`prompt` as one user turn in the tokenizer's chat template, ready for a reply."""
    return tokenizer.apply_chat_template([{"role": "user", "content": prompt}],
                                         tokenize=False, add_generation_prompt=True)


def model_generator(model: Any, config: AHDConfig) -> Generate:
    """A `Generate` backed by `models.generate` on chat-templated prompts."""
    def generate(params, prompts, population, members, key):
        output = models.generate(
            dataclasses.replace(model, params=params),
            [chat_prompt(model.tokenizer, p) for p in prompts],
            max_new_tokens=config.max_new_tokens, temperature=config.temperature,
            top_p=config.top_p, key=key, population=population,
            members=None if population is None else members)
        return output.texts

    return generate


def _sandbox_options(config: AHDConfig) -> dict[str, Any]:
    options: dict[str, Any] = dict(timeout_s=config.timeout_s)
    if config.fast_aco and config.task.endswith("_aco"):
        options["evaluate_options"] = {"settings": aco.FAST_SETTINGS}
    return options


def evaluation_instances(config: AHDConfig) -> Any:
    """The instances the final heuristic and the baseline are scored on.

    The first ``eval_size`` published test instances with ``anchor_data``, else
    ``eval_size`` instances generated from `EVAL_INSTANCES_SEED` (a
    `sandbox.InstanceSpec`).
    """
    task = TASKS[config.task]
    if config.anchor_data is None:
        return sandbox.InstanceSpec(config.problem_size(), config.eval_size,
                                    EVAL_INSTANCES_SEED)
    instances = task.load_anchor_instances(config.anchor_data, config.problem_size(),
                                           ANCHOR_SPLIT)
    return instances[:config.eval_size]


def score_program(source: str, config: AHDConfig, instances: Any = None) -> dict[str, Any]:
    """Scores one program in the sandbox on the evaluation instances.

    Returns:
      ``{"valid": bool, "objective": float | None, "error": str | None}``.
    """
    task = TASKS[check(config).task]
    instances = evaluation_instances(config) if instances is None else instances
    result = sandbox.run_candidate(source, task.function_name, task.name, instances,
                                   **_sandbox_options(config))
    return dict(valid=result.valid, objective=result.objective, error=result.error)


def run(config: AHDConfig, run_dir: str, model: Any = None) -> dict[str, Any]:
    """A full AHD run: search (resumed if `run_dir` holds one), then evaluation.

    Args:
      config: the run settings (checked before anything is loaded).
      run_dir: the run directory.
      model: an already loaded model (default: ``models.load(config.model)``).

    Returns:
      The summary (also written to ``summary.json``): the best heuristic's objective on
      the search and the evaluation instances, the seed heuristic's (baseline) on the
      evaluation instances, calls used and wall time.
    """
    check(config)
    start = time.monotonic()
    task = TASKS[config.task]
    eval_instances = evaluation_instances(config)
    if model is None:
        model = models.load(config.model, dtype=config.dtype)
    evaluate = eoh.sandbox_evaluator(
        task.name, task.function_name,
        sandbox.InstanceSpec(config.problem_size(), config.train_size, TRAIN_INSTANCES_SEED),
        **_sandbox_options(config))
    outcome = coevolve(model_generator(model, config), model.params, evaluate, task,
                       config, run_dir)
    best = outcome.search.population[0] if outcome.search.population else None
    records = fileio.read_jsonl(os.path.join(run_dir, eoh.PROGRAMS_FILE))
    summary = dict(
        task=config.task, size=config.problem_size(), method=config.method,
        seed=config.seed, minimise=task.minimise, budget=config.budget,
        calls_used=outcome.search.call_count, programs=len(records),
        valid_programs=sum(r["valid"] for r in records),
        best_call_index=None if best is None else best.call_index,
        best_train_objective=None if best is None else best.objective,
        best_eval_objective=None,
        baseline_eval_objective=score_program(task.seed_heuristic_source, config,
                                              eval_instances)["objective"],
        eval_instances=(f"{config.anchor_data} {ANCHOR_SPLIT}[:{config.eval_size}]"
                        if config.anchor_data else
                        f"generated seed={EVAL_INSTANCES_SEED} n={config.eval_size}"),
        es_generations=None if outcome.es_state is None else int(
            outcome.es_state.generation),
        wall_s=time.monotonic() - start)
    if best is not None:
        summary["best_eval_objective"] = score_program(best.code, config,
                                                       eval_instances)["objective"]
    fileio.atomic_write_text(os.path.join(run_dir, SUMMARY_FILE),
                             json.dumps(summary, indent=2))
    return summary


# ---------------------------------------------------------------- matched comparison


def _stats(values: Sequence[float | None]) -> dict[str, Any]:
    found = [v for v in values if v is not None]
    return dict(mean=float(np.mean(found)) if found else None,
                std=float(np.std(found)) if found else None,
                found=len(found), runs=len(values))


def _compare(with_es: float | None, without: float | None, minimise: bool) -> int:
    """+1 if `with_es` is better, -1 if worse, 0 for a tie (a found heuristic beats none)."""
    if with_es is None or without is None:
        return (with_es is not None) - (without is not None)
    if math.isclose(with_es, without, rel_tol=1e-9, abs_tol=1e-12):
        return 0
    better = with_es < without if minimise else with_es > without
    return 1 if better else -1


def matched_table(summaries: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Method vs method+ES per (task, size), from `run` summaries.

    Each row: the best evaluation objective's mean ± std (population std) over the seeds
    that found a valid heuristic, for the base method and its ES version, and the
    win/tie/loss counts of method+ES against the method over the seeds both ran (with
    the task's direction; a run that found a heuristic beats one that found none).
    """
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for summary in summaries:
        groups.setdefault((summary["task"], summary["size"]), []).append(summary)
    rows = []
    for (task, size), runs in sorted(groups.items()):
        minimise = runs[0]["minimise"]
        for base in BASE_METHODS:
            by_seed = {m: {r["seed"]: r["best_eval_objective"] for r in runs
                           if r["method"] == m} for m in (base, base + "_es")}
            if not by_seed[base] or not by_seed[base + "_es"]:
                continue
            seeds = sorted(set(by_seed[base]) & set(by_seed[base + "_es"]))
            outcomes = [_compare(by_seed[base + "_es"][s], by_seed[base][s], minimise)
                        for s in seeds]
            baselines = [r["baseline_eval_objective"] for r in runs
                         if r["baseline_eval_objective"] is not None]
            rows.append(dict(
                task=task, size=size, method=base, minimise=minimise,
                baseline=baselines[0] if baselines else None,
                without_es=_stats(list(by_seed[base].values())),
                with_es=_stats(list(by_seed[base + "_es"].values())),
                wins=outcomes.count(1), ties=outcomes.count(0), losses=outcomes.count(-1),
                seeds=seeds))
    return rows


def _mean_std(stats: dict[str, Any]) -> str:
    if stats["mean"] is None:
        return f"none found (0/{stats['runs']})"
    return f"{stats['mean']:.4f} ± {stats['std']:.4f} ({stats['found']}/{stats['runs']})"


def table_markdown(rows: Sequence[dict[str, Any]]) -> str:
    """`matched_table` rows as a markdown table."""
    lines = ["| task | size | goal | baseline | method | best: method | best: method+ES | "
             "W/T/L (+ES vs method) |",
             "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        baseline = "n/a" if row["baseline"] is None else f"{row['baseline']:.4f}"
        lines.append(
            f"| {row['task']} | {row['size']} | {'min' if row['minimise'] else 'max'} | "
            f"{baseline} | {row['method']} | {_mean_std(row['without_es'])} | "
            f"{_mean_std(row['with_es'])} | {row['wins']}/{row['ties']}/{row['losses']} |")
    return "\n".join(lines) + "\n"
