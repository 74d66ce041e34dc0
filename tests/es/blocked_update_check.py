"""Blocked against whole-leaf ES updates, compared bit for bit in a process of its own.

    python tests/es/blocked_update_check.py CASE [CASE ...]   # one JSON object on stdout

Bit-for-bit equality of two programs is a property of the code XLA generates for them, so
``test_strategy.py`` runs these comparisons in a fresh process under XLA's default CPU code
generation, the one runs use (the tests' own processes compile with cheaper settings; see
``tests/conftest.py``). A case is ``noise,antithetic,precision,scope`` (``tell`` of
``es.agentic_esopt``) or ``momentum`` (SGD with momentum, a per-entry optimizer state).
"""

import json
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax

from agentic_esopt import es

BLOCK_TREE = {  # Leaves a tiny block budget cuts unevenly: 256 + 344, 16 + 16 + 18, 5 × 1.
    "embed": jnp.linspace(-1.0, 1.0, 600 * 6).reshape(600, 6),
    "bias": jnp.linspace(0.0, 1.0, 50),
    "stacked": jnp.linspace(-0.5, 0.5, 5 * 7 * 3).reshape(5, 7, 3),
    "norm": {"scale": jnp.ones((3,))},
}


def agentic_esopt_of(noise: str, antithetic: bool, precision: str, scope: str):
    """``update_block_bytes -> strategy`` of an Agentic ESOpt case."""
    def strategy_of(block_bytes):
        return es.agentic_esopt(6, 0.1, 0.3, noise=noise, rank=2 if noise == "lowrank" else 1,
                                antithetic=antithetic, scope=scope,
                                rounding="stochastic" if precision == "stochastic" else
                                "nearest", master_weights=precision == "master",
                                update_block_bytes=block_bytes)
    return strategy_of


def momentum_of(block_bytes):
    """SGD with momentum keeps a trace per entry: each block steps its own rows."""
    settings = es.options.Settings.of(6, 0.1, 0.3, noise="lowrank", rank=2,
                                      optimizer=optax.sgd(0.3, momentum=0.9))
    algorithm = es.strategy.Algorithm("momentum", shape=es.fitness.zscore,
                                      scale=lambda population: 1.0 / population.size)
    return es.strategy.make(settings, algorithm,
                            es.update.Mode(elementwise=True, block_bytes=block_bytes))


def blocked_and_whole(strategy_of, dtype, generations):
    """(final state, update norms) of ``strategy_of(update_block_bytes)`` for a 64-byte
    block budget and for whole leaves."""
    results = []
    for block_bytes in (64, 0):
        strategy = strategy_of(block_bytes)
        state = strategy.init(1, jax.tree.map(lambda p: jnp.array(p, dtype), BLOCK_TREE))
        norms = []
        for generation in range(generations):
            rewards = np.random.default_rng(generation).normal(size=6)
            state, metrics = strategy.tell(state, strategy.ask(state), rewards)
            norms.append(float(metrics["update_norm"]))
        results.append((state, norms))
    return results


def same_bits(x, y) -> bool:
    return all(np.array_equal(np.asarray(a), np.asarray(b))
               for a, b in zip(jax.tree.leaves(x), jax.tree.leaves(y), strict=True))


def compare(case: str) -> dict:
    """What the tests assert of a case, computed."""
    if case == "momentum":
        (blocked, norms), (whole, whole_norms) = blocked_and_whole(momentum_of, jnp.float32, 3)
    else:
        noise, antithetic, precision, scope = case.split(",")
        dtype = jnp.float32 if precision == "float32" else jnp.bfloat16
        (blocked, norms), (whole, whole_norms) = blocked_and_whole(
            agentic_esopt_of(noise, antithetic == "True", precision, scope), dtype, 2)
    return dict(params=same_bits(blocked.params, whole.params),
                opt_state=same_bits(blocked.opt_state, whole.opt_state),
                norms_close=bool(np.allclose(norms, whole_norms, rtol=1e-6, atol=0)),
                stacked_moved=not np.array_equal(np.asarray(whole.params["stacked"], np.float32),
                                                 np.asarray(BLOCK_TREE["stacked"])),
                opt_state_moved=bool(jax.tree.leaves(whole.opt_state)) and bool(
                    np.any(np.asarray(jax.tree.leaves(whole.opt_state)[0]) != 0)))


if __name__ == "__main__":
    print(json.dumps({case: compare(case) for case in sys.argv[1:]}))
