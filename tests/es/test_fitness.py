"""Fitness shaping."""

import numpy as np
import pytest

from agentic_esopt import es


def test_zscore_matches_the_paper_formula():
    rewards = np.array([0.0, 1.0, 3.0, 4.0], np.float32)
    expected = (rewards - rewards.mean()) / (rewards.std(ddof=0) + 1e-8)
    np.testing.assert_allclose(es.fitness.zscore(rewards), expected, rtol=1e-6)


@pytest.mark.parametrize("name", sorted(es.fitness.SHAPERS))
def test_constant_rewards_give_finite_weights(name):
    weights = np.asarray(es.fitness.get(name)(np.full(8, 0.5, np.float32)))
    assert np.all(np.isfinite(weights))
    if name != "identity":
        np.testing.assert_array_equal(weights, 0.0)


def test_centered_rank_is_in_half_interval_and_handles_ties():
    weights = np.asarray(es.fitness.centered_rank(np.array([10.0, -3.0, 10.0, 0.0])))
    np.testing.assert_allclose(weights, [1 / 3, -0.5, 1 / 3, -1 / 6], rtol=1e-6)
    assert weights.sum() == pytest.approx(0.0, abs=1e-6)


def test_non_finite_rewards_name_the_member():
    with pytest.raises(ValueError, match="member 2: nan.*member 3: inf"):
        es.fitness.check_rewards([0.0, 1.0, np.nan, np.inf], 4)
    with pytest.raises(ValueError, match=r"shape \(4,\)"):
        es.fitness.check_rewards([0.0, 1.0], 4)


def test_unknown_shaping_is_rejected():
    with pytest.raises(ValueError, match="centered_rank"):
        es.fitness.get("softmax")


def test_task_normalised_fitness_z_scores_each_task_then_averages():
    by_task = np.array([[1.0, 0.0, 5.0],
                        [0.0, 0.0, 5.0],
                        [1.0, 0.0, 5.0],
                        [0.0, 0.0, 5.0]])  # Tasks 2 and 3: every member alike.
    fitness = es.fitness.task_normalised(by_task)
    # Task 1's z-scores are ±1; the tasks that tell no member apart add 0.
    np.testing.assert_allclose(fitness, np.array([1.0, -1.0, 1.0, -1.0]) / 3, rtol=1e-6)
    scaled = es.fitness.task_normalised(by_task * [[100.0, 1.0, 1.0]])
    np.testing.assert_allclose(scaled, fitness, rtol=1e-6)  # Each task on its own scale.
    with pytest.raises(ValueError, match=r"shape \(members, tasks\)"):
        es.fitness.task_normalised(np.zeros(4))
