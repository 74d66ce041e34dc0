"""How bfloat16 parameters take ES perturbations and updates, against float32.

    python -m experiments.bench_precision --json [--model=tiny] [--sigmas=1e-3,2.5e-4]

Noise is always drawn in float32 and updates are accumulated in float32; what rounds is the
parameter itself. For each parameter dtype and σ this measures, on --model:

* ``perturbed_fraction``: the fraction of entries that a full-rank member θ + σε actually
  changes once cast back to the parameter dtype, for matrices and for vectors (norm scales
  near 1, where bfloat16's spacing is 2⁻⁷ ≈ 7.8e-3);
* ``logit_change_full`` / ``logit_change_lowrank``: the mean |Δ logits| a full-rank member
  and a low-rank member (σ·(x A)Bᵀ added inside every linear, so it never rounds into a
  weight) make on a random batch;
* one SGD step of size --learning_rate on the rewards (1, 0, ...): ``updated_fraction`` of
  entries it changes, and ``update_error``: ‖(θ_new − θ) − α ĝ‖ / ‖α ĝ‖, the share of the
  step lost or distorted by rounding (α ĝ: the same step taken on float32 copies); the
  same two with ``es.rounding="stochastic"`` (``..._stochastic``).

Prints one JSON object with the devices it ran on.
"""

import json

from absl import app, flags
import jax
import jax.numpy as jnp
import numpy as np

from agentic_esopt import es, models, sharding
from experiments import precision

_MODEL = flags.DEFINE_string("model", "tiny", "Model name or path for models.load.")
_SIGMAS = flags.DEFINE_list("sigmas", ["4e-3", "1e-3", "2.5e-4"], "Perturbation scales σ.")
_LEARNING_RATE = flags.DEFINE_float("learning_rate", 5e-4, "α of the SGD step.")
_POPULATION = flags.DEFINE_integer("population_size", 8, "Members G of the update.")
_DTYPES = flags.DEFINE_list("dtypes", ["float32", "bfloat16"], "Parameter dtypes.")
_JSON = flags.DEFINE_bool("json", False, "Print only the JSON result.")


def measure(model, sigma: float, learning_rate: float, size: int) -> dict:
    """The figures of the module docstring for one model and σ."""
    config, params = model.config, model.params
    tokens = jax.random.randint(jax.random.key(1), (4, 32), 0, config.vocab_size)
    base = models.logits(config, params, tokens)
    figures = {}
    for noise in ("full", "lowrank"):
        strategy = es.agentic_esopt(size, sigma, learning_rate, noise=noise)
        state = strategy.init(0, params)  # Only asked and perturbed: never told.
        population = strategy.ask(state)
        if noise == "full":
            member = strategy.perturb(state, population, 0)
            figures["perturbed_fraction"] = precision.changed_fraction(params, member)
            member_logits = models.logits(config, member, tokens)
            rewards = np.eye(size)[0]
            as_float32 = jax.tree.map(lambda p: p.astype(jnp.float32), params)
            intended = strategy.tell(strategy.init(0, jax.tree.map(jnp.copy, as_float32)),
                                     population, rewards)[0]
            step = jax.tree.map(jnp.subtract, intended.params, as_float32)
            for rounding, suffix in (("nearest", ""), ("stochastic", "_stochastic")):
                rounded = es.agentic_esopt(size, sigma, learning_rate, rounding=rounding)
                new_params = rounded.tell(rounded.init(0, jax.tree.map(jnp.copy, params)),
                                          population, rewards)[0].params
                error = jax.tree.map(lambda new, old, s: new.astype(jnp.float32) - old - s,
                                     new_params, as_float32, step)
                figures["updated_fraction" + suffix] = precision.changed_fraction(params,
                                                                                  new_params)
                figures["update_error" + suffix] = float(precision.tree_norm(error)
                                                         / precision.tree_norm(step))
        else:
            member_logits = models.logits(config, params, tokens, population=population,
                                          members=np.zeros(tokens.shape[0], np.int32))
        figures[f"logit_change_{noise}"] = float(jnp.mean(jnp.abs(member_logits - base)))
    return figures


def main(argv):
    del argv
    result = {"model": _MODEL.value, "learning_rate": _LEARNING_RATE.value,
              "population_size": _POPULATION.value,
              **sharding.describe(None), "dtypes": {}}
    for dtype in _DTYPES.value:
        model = models.load(_MODEL.value, dtype)
        magnitude = float(np.median(np.concatenate([np.abs(np.asarray(x, np.float32)).ravel()
                                                    for x in jax.tree.leaves(model.params)])))
        result["dtypes"][dtype] = {
            "median_abs_param": magnitude,
            "sigmas": {sigma: measure(model, float(sigma), _LEARNING_RATE.value,
                                      _POPULATION.value) for sigma in _SIGMAS.value}}
    print(json.dumps(result, indent=None if _JSON.value else 2))


if __name__ == "__main__":
    app.run(main)
