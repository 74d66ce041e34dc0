"""Step → value schedules for σ and the learning rate.

Each schedule is a frozen dataclass that is callable on an int or a traced step, so it can
be recorded in a run history (``spec``) and rebuilt (``from_spec``). Before ``warmup``
steps have passed the value rises linearly from 0 to ``start``; the decay then runs over
the remaining steps with exact endpoints: value(warmup) = start and value(steps − 1) = end,
held at ``end`` afterwards.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp

KINDS = ("constant", "linear", "cosine")


@dataclasses.dataclass(frozen=True)
class Schedule:
    """A σ or learning-rate schedule.

    Attributes:
      kind: "constant", "linear" or "cosine".
      start: value at the end of warmup (and throughout for "constant").
      end: value at step ``steps − 1``.
      steps: total number of steps T (generations).
      warmup: steps of linear ramp from 0 to ``start``.
    """

    kind: str
    start: float
    end: float
    steps: int
    warmup: int = 0

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"unknown schedule kind {self.kind!r}; choose one of {KINDS}")
        if self.steps < 1:
            raise ValueError(f"schedule needs steps >= 1, got {self.steps}")
        if not 0 <= self.warmup < self.steps:
            raise ValueError(f"schedule warmup must be in [0, steps), got {self.warmup}")
        if self.start < 0 or self.end < 0:
            raise ValueError(f"schedule values must be >= 0, got {self.start}, {self.end}")

    def __call__(self, step) -> jnp.ndarray:
        step = jnp.asarray(step, jnp.float32)
        start, end = jnp.float32(self.start), jnp.float32(self.end)
        span = max(self.steps - 1 - self.warmup, 1)
        progress = jnp.clip((step - self.warmup) / span, 0.0, 1.0)
        if self.kind == "constant":
            decayed = start
        elif self.kind == "linear":
            decayed = start + (end - start) * progress
        else:
            decayed = end + (start - end) * 0.5 * (1.0 + jnp.cos(jnp.pi * progress))
        # Exact endpoints, independent of float rounding in cos.
        decayed = jnp.where(progress >= 1.0, end if self.kind != "constant" else start,
                            jnp.where(progress <= 0.0, start, decayed))
        if self.warmup == 0:
            return decayed
        ramp = start * step / self.warmup
        return jnp.where(step < self.warmup, ramp, decayed)

    @property
    def spec(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_spec(cls, spec: dict[str, Any]) -> "Schedule":
        return cls(**spec)


def constant(value: float, steps: int = 1, warmup: int = 0) -> Schedule:
    """A constant schedule (after an optional warmup)."""
    return Schedule("constant", value, value, max(steps, warmup + 1), warmup)


def linear(start: float, end: float, steps: int, warmup: int = 0) -> Schedule:
    """Linear interpolation from ``start`` (after warmup) to ``end`` at step steps − 1."""
    return Schedule("linear", start, end, steps, warmup)


def cosine(start: float, end: float, steps: int, warmup: int = 0) -> Schedule:
    """σ_t = end + (start − end)(1 + cos(π p))/2, p = (t − warmup)/(steps − 1 − warmup)."""
    return Schedule("cosine", start, end, steps, warmup)


def as_schedule(value: float | Schedule) -> Schedule:
    """Wraps a float as a constant schedule; passes schedules through."""
    if isinstance(value, Schedule):
        return value
    if callable(value):
        raise TypeError("pass an es.schedules.Schedule (constant/linear/cosine) so the run "
                        "history can record and replay it, not an arbitrary callable")
    return constant(float(value))
