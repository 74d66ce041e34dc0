"""Schedules: exact endpoints, warmup, and the paper's cosine formula."""

import math

import numpy as np
import pytest

from agentic_esopt.es import schedules


def values(schedule, steps):
    return np.array([float(schedule(t)) for t in range(steps)])


def test_cosine_endpoints_and_formula():
    schedule = schedules.cosine(1e-3, 2.5e-4, 100)
    v = values(schedule, 100)
    assert v[0] == np.float32(1e-3) and v[-1] == np.float32(2.5e-4)
    for t in (1, 37, 50, 98):
        p = t / 99
        expected = 2.5e-4 + (1e-3 - 2.5e-4) * (1 + math.cos(math.pi * p)) / 2
        assert v[t] == pytest.approx(expected, rel=1e-5)
    assert np.all(np.diff(v) <= 0)
    assert float(schedule(150)) == np.float32(2.5e-4)


def test_cosine_with_warmup():
    schedule = schedules.cosine(1.0, 0.0, 11, warmup=4)
    v = values(schedule, 11)
    np.testing.assert_allclose(v[:4], [0.0, 0.25, 0.5, 0.75])
    assert v[4] == 1.0 and v[10] == 0.0
    assert v[7] == pytest.approx(0.5 * (1 + math.cos(math.pi * 3 / 6)), rel=1e-6)


def test_linear_and_constant():
    np.testing.assert_allclose(values(schedules.linear(2.0, 1.0, 5), 5),
                               [2.0, 1.75, 1.5, 1.25, 1.0])
    np.testing.assert_allclose(values(schedules.constant(1.5e-3, 10), 10), 1.5e-3)
    np.testing.assert_allclose(values(schedules.constant(1.0, 6, warmup=2), 4),
                               [0.0, 0.5, 1.0, 1.0])


def test_spec_round_trip_and_validation():
    schedule = schedules.cosine(1e-3, 0.0, 20, warmup=2)
    assert schedules.Schedule.from_spec(schedule.spec) == schedule
    with pytest.raises(ValueError, match="kind"):
        schedules.Schedule("exp", 1.0, 0.0, 10)
    with pytest.raises(ValueError, match="warmup"):
        schedules.cosine(1.0, 0.0, 10, warmup=10)
    with pytest.raises(TypeError, match="Schedule"):
        schedules.as_schedule(lambda t: 1.0)
