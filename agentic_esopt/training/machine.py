"""Which machine ran a run's generations and how fast it is, so that wall times taken on
different machines can be compared.

Runs of one grid land on shared machines whose speed differs from session to session (by
a fifth and more on the 2-core machines here), so a run's training seconds compare with
another's only where both ran on one machine, or once each is divided by the seconds its
own machine took for one fixed workload (``probe_seconds``). ``describe`` gives both, and
the trainer adds them to every generation's metrics line (``training.train``'s
``machine``), so a run resumed on another machine keeps each part's own.
"""

from __future__ import annotations

import platform
import statistics
import time

import jax
import jax.numpy as jnp

# The probe's workload: one turn of a 16-episode rollout through SmolLM2-135M's MLP stack
# (30 layers, 576 -> 1536 -> 576, float32): a 16 x 8-token prefill, then 8 one-token
# decode steps. Fixed for good: probe times are only comparable for one workload.
LAYERS, WIDTH, HIDDEN = 30, 576, 1536
ROWS, PROMPT_TOKENS, NEW_TOKENS = 16, 8, 8
BOOT_ID = "/proc/sys/kernel/random/boot_id"


def machine_id() -> str:
    """This boot of this machine: Linux's boot id (new at every boot), else the host name."""
    try:
        with open(BOOT_ID, encoding="utf-8") as f:
            return f.read().strip()
    except OSError:
        return platform.node()


def _mlp_stack(weights: tuple[jax.Array, jax.Array], x: jax.Array) -> jax.Array:
    def layer(h, weight):
        up, down = weight
        return h + jax.nn.gelu(h @ up) @ down, None
    return jax.lax.scan(layer, x, weights)[0]


@jax.jit
def _turn(weights: tuple[jax.Array, jax.Array], prompt: jax.Array) -> jax.Array:
    """The prefill of every prompt token, then ``NEW_TOKENS`` decode steps of the rows."""
    last = _mlp_stack(weights, prompt)[::PROMPT_TOKENS]
    return jax.lax.fori_loop(0, NEW_TOKENS, lambda _, h: _mlp_stack(weights, h), last)


def probe_seconds(repeats: int = 3) -> float:
    """Median seconds the default device takes for the fixed workload, over ``repeats``
    calls after one that compiles it."""
    up, down, prompt = jax.random.split(jax.random.key(0), 3)
    weights = (jax.random.normal(up, (LAYERS, WIDTH, HIDDEN)) * WIDTH ** -0.5,
               jax.random.normal(down, (LAYERS, HIDDEN, WIDTH)) * HIDDEN ** -0.5)
    prompt = jax.random.normal(prompt, (ROWS * PROMPT_TOKENS, WIDTH), jnp.float32)
    _turn(weights, prompt).block_until_ready()
    seconds = []
    for _ in range(repeats):
        began = time.perf_counter()
        _turn(weights, prompt).block_until_ready()
        seconds.append(time.perf_counter() - began)
    return statistics.median(seconds)


def describe() -> dict[str, str | float]:
    """``machine`` (``machine_id``) and ``probe_s`` (``probe_seconds``) of this process."""
    return {"machine": machine_id(), "probe_s": probe_seconds()}
