"""Rollouts on kept KV caches play exactly the episodes that re-prefilling plays."""

import jax
import pytest

from agentic_esopt import es, models
from agentic_esopt.agents import rollout
from agentic_esopt.envs import sudoku

TASKS = sudoku.generate_tasks(2, 4, 3, seed=0, split="train")


@pytest.fixture(scope="module")
def model():
    return models.load("tiny")


def episodes(model, keep_kv_cache, population=None, temperature=0.0, history_turns=None):
    options = rollout.Options(max_new_tokens=6, keep_kv_cache=keep_kv_cache,
                              history_turns=history_turns)
    policy = rollout.make_model_policy(model, population, options, temperature=temperature,
                                       key=jax.random.key(3), generate=models.generate)
    trajectories = rollout.run_episodes(lambda: sudoku.SudokuEnv(), TASKS, policy, range(3),
                                        system_prompt="Fill the board.", max_turns=4)
    return [(t.member, t.task_id, t.messages) for t in trajectories]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_population_episodes_match_re_prefilling(model, temperature):
    strategy = es.agentic_esopt(population_size=3, sigma=0.05, learning_rate=1e-3)
    population = strategy.ask(strategy.init(jax.random.key(1), model.params))
    kept = episodes(model, True, population, temperature)
    assert kept == episodes(model, False, population, temperature)
    assert max(len(messages) for _, _, messages in kept) > 4  # Several turns were played.


def test_trimmed_history_episodes_match_re_prefilling(model):
    assert episodes(model, True, history_turns=1) == episodes(model, False, history_turns=1)
