"""EoH and Sample: LLM heuristic search with an injected LLM and evaluator.

The LLM is a callable ``llm(prompts, members) -> replies``: one reply per prompt, and
``members[j]`` names the ES population member that must answer prompt ``j`` (plain
searches use ``num_members=1``). Prompt ``j`` of a batch goes to member
``j % num_members``; EoH batches list prompts operator by operator, so with
``offspring_per_operator == num_members`` every member answers once per operator.
One prompt is one LLM call: budgets and ``call_index`` count prompts.

* EoH (Evolution of Heuristics): fill a population of ``population_size`` valid
  heuristics with ``i1`` batches, then per generation apply each operator
  ``offspring_per_operator`` times to rank-selected parents, evaluate the offspring
  in parallel and keep the best ``population_size`` with distinct objectives.
* Sample: independent ``i1`` batches until the budget; the best is kept.

`step` runs one batch and rewards it for ES (`eoh_es_reward`, `sample_es_rewards`;
``i1`` batches are rewarded like Sample batches). With a ``run_dir``, every program is
appended to ``programs.jsonl``. A search continues from ``state_to_json`` (taken after
a batch) with ``state_from_json`` and ``restore_log``, which cuts the log back to that
state and rebuilds the evaluation cache from it, so identical code is evaluated once per
run, also across a batch that was logged but not checkpointed.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Any, Callable, NamedTuple, Protocol, Sequence

import numpy as np

from agentic_esopt import fileio
from agentic_esopt.agents import ahd_prompts


PROGRAMS_FILE = "programs.jsonl"
# Sample+ES reward of every member when no sample of the batch is valid. Any constant
# carries no signal; zero also gives a zero update without fitness shaping.
NO_VALID_REWARD = 0.0

LLM = Callable[[list[str], list[int]], Sequence[str]]


class Evaluation(Protocol):
    """What an evaluator returns per program (`envs.ahd.scoring.Result` is one)."""

    valid: bool
    objective: float | None
    error: str | None


Evaluate = Callable[[list[str]], Sequence[Evaluation]]
Entry = tuple[str, tuple["Individual", ...]]  # (operator, parents)


@dataclasses.dataclass(frozen=True)
class Individual:
    """One LLM call's heuristic and its score.

    Attributes:
      description: the one-sentence idea.
      code: the extracted source ("" when extraction failed).
      objective: the task objective when valid, else None.
      valid: whether it was extracted and scored.
      operator: the operator whose prompt produced it.
      parents: the ``call_index`` of each parent.
      member: the ES member that answered the prompt.
      generation: 0 for EoH initialisation, then the generation (EoH) or batch
        (Sample, from 1) that produced it.
      call_index: position of its LLM call in the run (unique; also its id).
      error: why it is invalid, else None.
    """

    description: str
    code: str
    objective: float | None
    valid: bool
    operator: str
    parents: tuple[int, ...]
    member: int
    generation: int
    call_index: int
    error: str | None = None


@dataclasses.dataclass(frozen=True)
class EoHConfig:
    """EoH settings. `budget` counts LLM calls, initialisation included.

    Initialisation issues ``i1`` batches of ``max(missing, num_members)`` prompts until
    the population is full, for at most ``init_attempts * population_size`` calls, or
    longer while no valid heuristic exists at all.
    """

    population_size: int = 4
    budget: int = 100
    operators: tuple[str, ...] = ("e1", "e2", "m1", "m2")
    offspring_per_operator: int = 1
    num_parents: int = 2
    init_attempts: int = 4
    num_members: int = 1

    def __post_init__(self):
        _check_budget(self)
        for name in ("population_size", "offspring_per_operator", "num_parents",
                     "init_attempts"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not self.operators or not set(self.operators) <= set(ahd_prompts.OPERATORS[1:]):
            raise ValueError(f"operators must be a non-empty subset of "
                             f"{ahd_prompts.OPERATORS[1:]}, got {self.operators}")


@dataclasses.dataclass(frozen=True)
class SampleConfig:
    """Sample settings: ``batch_size`` independent ``i1`` prompts per batch."""

    budget: int = 100
    batch_size: int = 4
    num_members: int = 1

    def __post_init__(self):
        _check_budget(self)
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")


def _check_budget(config: EoHConfig | SampleConfig) -> None:
    """Raises ValueError for a negative budget or no members."""
    if config.budget < 0 or config.num_members < 1:
        raise ValueError(f"need budget >= 0 and num_members >= 1, got {config}")


@dataclasses.dataclass(frozen=True)
class SearchState:
    """Everything a search needs to continue.

    Attributes:
      population: valid individuals, best first.
      call_count: LLM calls made so far.
      generation: generations (EoH) or batches (Sample) completed.
      rng_state: the numpy bit-generator state used for parent selection.
    """

    population: tuple[Individual, ...]
    call_count: int
    generation: int
    rng_state: dict[str, Any]


class Batch(NamedTuple):
    """One batch of offspring and their ES rewards (aligned)."""

    offspring: tuple[Individual, ...]
    rewards: tuple[float, ...]


class _Outcome(NamedTuple):
    valid: bool
    objective: float | None
    error: str | None


# ---------------------------------------------------------------- pure functions


def _cost(objective: float, minimise: bool) -> float:
    """The objective oriented so that lower is better."""
    return objective if minimise else -objective


def select_survivors(individuals: Sequence[Individual], size: int,
                     minimise: bool) -> tuple[Individual, ...]:
    """The best `size` valid individuals with distinct objectives, best first.

    Ties in objective keep the earliest individual (smallest ``call_index``).
    """
    ranked = sorted((i for i in individuals if i.valid),
                    key=lambda i: (_cost(i.objective, minimise), i.call_index))
    survivors, seen = [], set()
    for individual in ranked:
        if individual.objective not in seen:
            seen.add(individual.objective)
            survivors.append(individual)
    return tuple(survivors[:size])


def select_parents(population: Sequence[Individual], count: int,
                   rng: np.random.Generator) -> tuple[Individual, ...]:
    """`count` distinct parents from a best-first population, rank-weighted.

    The individual of rank r (0 = best) among n is drawn with probability
    proportional to 1 / (r + 1 + n), as in EoH. Parents come back best first.
    """
    n = len(population)
    if not 1 <= count <= n:
        raise ValueError(f"cannot select {count} parents from a population of {n}")
    weights = 1.0 / (np.arange(n) + 1.0 + n)
    chosen = rng.choice(n, size=count, replace=False, p=weights / weights.sum())
    return tuple(population[i] for i in sorted(chosen))


def eoh_es_reward(child_objective: float | None, parent_objective: float,
                  worst_objective: float, minimise: bool) -> float:
    """EoH+ES reward of one offspring.

    With s = +1 when minimising and -1 when maximising, P the parent's objective (the
    best parent's for multi-parent operators), W the worst objective in the population
    the parents came from and C the child's:

      reward = s * (P - C)                 for a valid child no worse than W,
      reward = max(s * (P - W), -1)        for an invalid child or one worse than W.

    Since the parent is in the population, s * (P - W) <= 0: the clipped reward lies in
    [-1, 0]. A valid child between W and P is not clipped, so when s * (P - W) < -1
    its reward can be below the clip value.
    """
    sign = 1.0 if minimise else -1.0
    clipped = max(sign * (parent_objective - worst_objective), -1.0)
    if child_objective is None or sign * (child_objective - worst_objective) > 0:
        return clipped
    return sign * (parent_objective - child_objective)


def sample_es_rewards(objectives: Sequence[float | None], minimise: bool) -> list[float]:
    """Sample+ES rewards of one batch (None marks an invalid sample).

    A valid sample with objective C gets -C when minimising (C when maximising). An
    invalid one gets min(valid rewards) - std(valid rewards) (population std), or
    `NO_VALID_REWARD` when the batch has no valid sample.
    """
    valid = [-_cost(c, minimise) for c in objectives if c is not None]
    penalty = min(valid) - float(np.std(valid)) if valid else NO_VALID_REWARD
    return [penalty if c is None else -_cost(c, minimise) for c in objectives]


# ---------------------------------------------------------------- one batch


def _outcome(result: Evaluation) -> _Outcome:
    """An evaluator's result, with a valid one required to carry a finite objective."""
    if not result.valid:
        return _Outcome(False, None, result.error)
    try:
        objective = float(result.objective)
    except (TypeError, ValueError):
        objective = math.nan
    if not math.isfinite(objective):
        return _Outcome(False, None, f"evaluator gave objective {result.objective!r}")
    return _Outcome(True, objective, None)


def _evaluate_codes(codes: list[str], evaluate: Evaluate,
                    cache: dict[str, _Outcome]) -> list[_Outcome]:
    """Outcomes of `codes`, calling `evaluate` once on those not seen before."""
    new = [code for code in dict.fromkeys(codes) if code not in cache]
    results = list(evaluate(new)) if new else []
    if len(results) != len(new):
        raise ValueError(f"evaluate returned {len(results)} results for {len(new)} programs")
    cache.update(zip(new, map(_outcome, results)))
    return [cache[code] for code in codes]


def _make_offspring(entries: list[Entry], candidates: list[Any], state: SearchState,
                    generation: int, num_members: int, evaluate: Evaluate,
                    cache: dict[str, _Outcome]) -> tuple[Individual, ...]:
    """Scores the extracted candidates and wraps every reply as an `Individual`."""
    extracted = [c for c in candidates if isinstance(c, ahd_prompts.Candidate)]
    scored = iter(_evaluate_codes([c.code for c in extracted], evaluate, cache))
    offspring = []
    for j, ((operator, parents), candidate) in enumerate(zip(entries, candidates)):
        if isinstance(candidate, ahd_prompts.Candidate):
            outcome = next(scored)
            description, code = candidate.description, candidate.code
        else:
            outcome = _Outcome(False, None, f"extraction failed: {candidate.reason}")
            description, code = "", ""
        offspring.append(Individual(
            description=description, code=code, objective=outcome.objective,
            valid=outcome.valid, operator=operator,
            parents=tuple(p.call_index for p in parents), member=j % num_members,
            generation=generation, call_index=state.call_count + j, error=outcome.error))
    return tuple(offspring)


def _batch_rewards(entries: list[Entry], offspring: Sequence[Individual],
                   population: Sequence[Individual], minimise: bool) -> tuple[float, ...]:
    if all(not parents for _, parents in entries):
        return tuple(sample_es_rewards([child.objective for child in offspring], minimise))
    worst = max((i.objective for i in population), key=lambda c: _cost(c, minimise))
    return tuple(
        eoh_es_reward(child.objective,
                      min((p.objective for p in parents), key=lambda c: _cost(c, minimise)),
                      worst, minimise)
        for (_, parents), child in zip(entries, offspring))


def _run_batch(state: SearchState, entries: list[Entry], generation: int,
               rng_state: dict[str, Any], llm: LLM, evaluate: Evaluate, task: Any,
               cache: dict[str, _Outcome], population_size: int,
               num_members: int) -> tuple[SearchState, Batch, list[str]]:
    """Prompts, generates, extracts, evaluates, rewards and selects one batch."""
    prompts = [ahd_prompts.build_prompt(op, task, parents) for op, parents in entries]
    replies = list(llm(prompts, [j % num_members for j in range(len(prompts))]))
    if len(replies) != len(prompts):
        raise ValueError(f"llm returned {len(replies)} replies for {len(prompts)} prompts")
    candidates = [ahd_prompts.extract_candidate(r, task.function_name) for r in replies]
    offspring = _make_offspring(entries, candidates, state, generation, num_members,
                                evaluate, cache)
    rewards = _batch_rewards(entries, offspring, state.population, task.minimise)
    population = select_survivors(state.population + offspring, population_size,
                                  task.minimise)
    new_state = SearchState(population, state.call_count + len(entries), generation,
                            rng_state)
    return new_state, Batch(offspring, rewards), replies


# ---------------------------------------------------------------- planning


def _eoh_plan(state: SearchState, rng: np.random.Generator,
              config: EoHConfig) -> tuple[list[Entry], int]:
    """The next batch's (operator, parents) entries and the offspring's generation."""
    missing = config.population_size - len(state.population)
    init_calls = config.init_attempts * config.population_size
    if state.generation == 0 and missing > 0 and (
            state.call_count < init_calls or not state.population):
        return [("i1", ())] * max(missing, config.num_members), 0
    entries = []
    for operator in config.operators:
        count = min(ahd_prompts.parent_count(operator, config.num_parents),
                    len(state.population))
        entries += [(operator, select_parents(state.population, count, rng))
                    for _ in range(config.offspring_per_operator)]
    return entries, state.generation + 1


def _sample_plan(state: SearchState, rng: np.random.Generator,
                 config: SampleConfig) -> tuple[list[Entry], int]:
    del rng  # samples are independent
    return [("i1", ())] * config.batch_size, state.generation + 1


# ---------------------------------------------------------------- records


def _record(individual: Individual, reward: float, reply: str) -> dict[str, Any]:
    reply = reply if isinstance(reply, str) else repr(reply)
    return dict(dataclasses.asdict(individual), reward=reward, reply=reply)


def _individual(record: dict[str, Any]) -> Individual:
    fields = {f.name: record[f.name] for f in dataclasses.fields(Individual)}
    return Individual(**dict(fields, parents=tuple(fields["parents"])))


def _append_jsonl(path: str, records: Sequence[dict[str, Any]]) -> None:
    with open(path, "a", encoding="utf-8") as file:
        file.writelines(json.dumps(record) + "\n" for record in records)
        file.flush()
        os.fsync(file.fileno())


# ---------------------------------------------------------------- searches


def plan(state: SearchState,
         config: EoHConfig | SampleConfig) -> tuple[list[Entry], int, dict[str, Any]]:
    """The next batch's (operator, parents) entries, cut to the budget, the generation its
    offspring belong to, and the parent-selection rng state after planning."""
    rng = np.random.default_rng()
    rng.bit_generator.state = state.rng_state
    if isinstance(config, EoHConfig):
        entries, generation = _eoh_plan(state, rng, config)
    else:
        entries, generation = _sample_plan(state, rng, config)
    return entries[:config.budget - state.call_count], generation, rng.bit_generator.state


def step(state: SearchState, cache: dict[str, Any], llm: LLM, evaluate: Evaluate, task: Any,
         config: EoHConfig | SampleConfig,
         run_dir: str | None = None) -> tuple[SearchState, Batch]:
    """One batch of the search: plan, generate, evaluate, reward, select; the offspring
    are appended to ``run_dir``'s programs log when given. ``cache`` (code -> outcome)
    is updated in place."""
    entries, generation, rng_state = plan(state, config)
    population_size = config.population_size if isinstance(config, EoHConfig) else 1
    state, batch, replies = _run_batch(state, entries, generation, rng_state, llm, evaluate,
                                       task, cache, population_size, config.num_members)
    if run_dir is not None:
        records = [_record(individual, reward, reply) for individual, reward, reply
                   in zip(batch.offspring, batch.rewards, replies)]
        _append_jsonl(os.path.join(run_dir, PROGRAMS_FILE), records)
    return state, batch


def initial_state(seed: int) -> SearchState:
    """The state of a search that has made no call."""
    return SearchState((), 0, 0, np.random.default_rng(seed).bit_generator.state)


def state_to_json(state: SearchState) -> dict[str, Any]:
    """A JSON-serialisable copy of ``state``."""
    return dict(population=[dataclasses.asdict(i) for i in state.population],
                call_count=state.call_count, generation=state.generation,
                rng_state=state.rng_state)


def state_from_json(saved: dict[str, Any]) -> SearchState:
    """The inverse of ``state_to_json``."""
    return SearchState(tuple(_individual(r) for r in saved["population"]),
                       saved["call_count"], saved["generation"], saved["rng_state"])


def restore_log(run_dir: str, call_count: int) -> dict[str, Any]:
    """Cuts ``run_dir``'s programs log back to ``call_count`` calls; returns the evaluation
    cache rebuilt from every logged program (later ones included: same code, same score)."""
    log_path = os.path.join(run_dir, PROGRAMS_FILE)
    records = fileio.read_jsonl(log_path)
    cache = {r["code"]: _Outcome(r["valid"], r["objective"], r["error"])
             for r in records if r["code"]}
    os.makedirs(run_dir, exist_ok=True)
    fileio.write_jsonl(log_path, [r for r in records if r["call_index"] < call_count])
    return cache
