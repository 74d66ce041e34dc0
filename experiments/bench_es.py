"""Benchmark of the ES core on a ~100M-parameter pytree: ask, perturb and tell.

    python -m experiments.bench_es --json

Prints one JSON object: per noise mode, the median wall time of ``ask``, ``perturb`` and
``tell`` (after a warm-up call, so compilation is excluded) and tell's compiled temp memory
from XLA's memory analysis, for each population size; and where it ran (backend, devices,
processes, mesh, rules) and the parameter dtype. ``--mesh=data:1,model:8`` shards the
tree over a mesh by ``--rules`` first.
"""

import json
import statistics
import time

from absl import app, flags
import jax
import jax.numpy as jnp
import numpy as np

from agentic_esopt import es, sharding
from agentic_esopt.models import loading

_POPULATION_SIZES = flags.DEFINE_list("population_sizes", ["8", "32", "128"],
                                      "Population sizes G.")
_NOISE = flags.DEFINE_list("noise", ["full", "lowrank"], "Noise modes.")
_PARAMS = flags.DEFINE_float("params", 100e6, "Approximate number of parameters.")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed repeats per figure (median).")
_DTYPE = flags.DEFINE_enum("dtype", "float32", list(loading.DTYPES), "Parameter dtype.")
_MESH = flags.DEFINE_string("mesh", "", "Mesh shape, e.g. data:1,model:8 (empty: none).")
_RULES = flags.DEFINE_string("rules", "fsdp", "Sharding rules: a preset or explicit rules.")
_JSON = flags.DEFINE_bool("json", False, "Print only the JSON result.")


def llm_like_tree(num_params: float, dtype=jnp.float32) -> dict:
    """A decoder-shaped pytree (stacked layers, embedding, norms) of ~num_params floats."""
    width, vocab = 1024, 32768
    per_layer = 4 * width * width + 3 * width * 4 * width + 2 * width
    layers = max(1, round((num_params - vocab * width) / per_layer))
    key = jax.random.key(0)
    shapes = {
        "embed": {"embedding": (vocab, width)},
        "layers": {"attn": {"qkvo": {"kernel": (layers, 4, width, width)}},
                   "mlp": {"gate_up": {"kernel": (layers, 2, width, 4 * width)},
                           "down": {"kernel": (layers, 4 * width, width)}},
                   "input_norm": {"scale": (layers, width)},
                   "post_norm": {"scale": (layers, width)}},
        "final_norm": {"scale": (width,)},
    }
    return jax.tree.map(lambda s: (jax.random.normal(key, s, jnp.float32) * 0.02).astype(dtype),
                        shapes, is_leaf=lambda s: isinstance(s, tuple))


def median_seconds(fn, repeats: int) -> float:
    jax.block_until_ready(fn())  # Warm-up: compile.
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def bench_mode(params, noise: str, sizes: list[int], repeats: int) -> dict:
    results = {}
    for size in sizes:
        strategy = es.agentic_esopt(size, es.schedules.cosine(1e-3, 2.5e-4, 100), 5e-4,
                                    noise=noise)
        state = strategy.init(0, jax.tree.map(jnp.copy, params))  # tell consumes it.
        population = strategy.ask(state)
        rewards = jnp.asarray(np.random.default_rng(0).normal(size=size), jnp.float32)
        compiled = strategy.update.lower(state, population, rewards).compile()

        def tell():
            nonlocal state
            state = strategy.update(state, population, rewards)[0]
            return state

        results[str(size)] = {
            "ask_s": median_seconds(lambda: strategy.ask(state), repeats),
            "perturb_s": median_seconds(lambda: strategy.perturb(state, population, 1),
                                        repeats),
            "tell_s": median_seconds(tell, repeats),
            "tell_temp_bytes": compiled.memory_analysis().temp_size_in_bytes,
        }
    return results


def main(argv):
    del argv
    layout = sharding.layout(sharding.MeshOptions(_MESH.value, _RULES.value))
    params = llm_like_tree(_PARAMS.value, loading.resolve_dtype(_DTYPE.value))
    if layout is not None:
        params = layout.place(params)
    num_params = sum(x.size for x in jax.tree.leaves(params))
    sizes = [int(s) for s in _POPULATION_SIZES.value]
    result = {
        **sharding.describe(layout),
        "dtype": _DTYPE.value,
        "num_params": num_params,
        "param_bytes": sum(x.nbytes for x in jax.tree.leaves(params)),
        "repeats": _REPEATS.value,
        "modes": {noise: bench_mode(params, noise, sizes, _REPEATS.value)
                  for noise in _NOISE.value},
    }
    print(json.dumps(result, indent=None if _JSON.value else 2))


if __name__ == "__main__":
    app.run(main)
