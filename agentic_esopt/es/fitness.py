"""Fitness shaping: map a population's raw rewards (G,) to update weights (G,); and
``task_normalised``, members' rewards from their rewards on shared tasks (G, T)."""

from __future__ import annotations

from typing import Callable

import jax.numpy as jnp
import numpy as np

ZSCORE_EPS = 1e-8


def zscore(rewards: jnp.ndarray) -> jnp.ndarray:
    """(r − mean) / (std + 1e-8), population std (ddof 0), as the paper; 0 if constant."""
    rewards = jnp.asarray(rewards, jnp.float32)
    centred = rewards - rewards.mean()
    return centred / (rewards.std() + ZSCORE_EPS)


def centered_rank(rewards: jnp.ndarray) -> jnp.ndarray:
    """Ranks mapped linearly to [-0.5, 0.5]; ties share their mean rank."""
    rewards = jnp.asarray(rewards, jnp.float32)
    size = rewards.shape[0]
    if size == 1:
        return jnp.zeros_like(rewards)
    below = (rewards[None, :] < rewards[:, None]).sum(axis=1)
    equal = (rewards[None, :] == rewards[:, None]).sum(axis=1)
    mean_rank = below + (equal - 1) / 2.0
    return (mean_rank / (size - 1) - 0.5).astype(jnp.float32)


def identity(rewards: jnp.ndarray) -> jnp.ndarray:
    """Raw rewards as weights."""
    return jnp.asarray(rewards, jnp.float32)


SHAPERS: dict[str, Callable[[jnp.ndarray], jnp.ndarray]] = {
    "zscore": zscore,
    "centered_rank": centered_rank,
    "identity": identity,
}


def get(name: str) -> Callable[[jnp.ndarray], jnp.ndarray]:
    """The shaping function called ``name``."""
    if name not in SHAPERS:
        raise ValueError(f"unknown fitness shaping {name!r}; choose one of {sorted(SHAPERS)}")
    return SHAPERS[name]


def task_normalised(rewards_by_task) -> np.ndarray:
    """Members' fitness from their rewards on shared tasks, (G, T) -> (G,): each task's
    rewards z-scored among the members (ddof 0, as ``zscore``), then averaged over the
    tasks (EGGROLL's group-normalised fitness, a group being the members on one task).
    A task every member scored alike adds 0, so tasks that tell members apart decide."""
    rewards = np.asarray(rewards_by_task, np.float64)
    if rewards.ndim != 2 or 0 in rewards.shape:
        raise ValueError(f"expected rewards of shape (members, tasks), got {rewards.shape}")
    centred = rewards - rewards.mean(axis=0)
    return (centred / (rewards.std(axis=0) + ZSCORE_EPS)).mean(axis=1)


def check_rewards(rewards, population_size: int) -> np.ndarray:
    """Host-side validation: a (G,) float array of finite rewards, else ValueError."""
    rewards = np.asarray(rewards, dtype=np.float64)
    if rewards.shape != (population_size,):
        raise ValueError(f"expected rewards of shape ({population_size},), got {rewards.shape}")
    bad = np.flatnonzero(~np.isfinite(rewards))
    if bad.size:
        listed = ", ".join(f"member {i}: {rewards[i]}" for i in bad[:8])
        raise ValueError(f"non-finite rewards ({listed}); fix the environment or reward "
                         "function, ES cannot shape them")
    return rewards.astype(np.float32)
