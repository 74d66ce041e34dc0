"""The bfloat16 table: nearest rounding, stochastic rounding and a float32 master copy
against the float32 run, from finished runs' histories (no rollout is repeated).

    python -m experiments.precision_table experiments/results/precision

The folder holds one sweep cell per variant (``experiments/configs/cpu_default.py`` with
``--grid='model.dtype+es.rounding+es.master_weights=...'``), the float32 cell among them.
Each run's history is replayed generation by generation (bitwise the run's own updates)
to measure, per variant:

* ``changed_per_step``: the median over generations of the share of matrix entries that
  one update changes (vectors: ``changed_per_step_vectors``);
* ``movement_error``: ‖Δθ − Δθ_f32‖ / ‖Δθ_f32‖ after the last generation, Δθ the run's
  whole movement from its initial parameters, Δθ_f32 the float32 run's (the runs' rewards
  differ, as their rollouts do); ``movement_ratio``: ‖Δθ‖ / ‖Δθ_f32‖;
* ``movement_error_same_rewards``: the same, with the variant's arithmetic replaying the
  float32 run's rewards: what rounding alone does to the float32 run's updates;
* the held-out mean reward and success rate before and after, from ``summary.json``.

Writes ``precision_table.json`` and ``precision_table.md`` (beside the sweep's own table) into the folder and prints the JSON. (No flags:
tests import this module beside the benchmarks, whose absl flags are global.)
"""

import json
import os

from absl import app
import jax
import jax.numpy as jnp
import numpy as np

from agentic_esopt import es, models, training
from experiments import precision



def run_dirs(root: str) -> list[str]:
    """Every finished run (a folder holding summary.json) under ``root``, sorted."""
    return sorted(folder for folder, _, files in os.walk(root) if "summary.json" in files)


def variant(config: training.TrainConfig) -> str:
    """A run's precision setting, e.g. ``bfloat16, stochastic``."""
    if config.model.dtype == "float32":
        return "float32"
    return f"{config.model.dtype}, " + ("float32 master" if config.es.master_weights
                                        else f"{config.es.rounding} rounding")


def replayed(params, header: dict, records: list[dict], strategy=None):
    """(per-generation changed shares, the whole movement Δθ in float32)."""
    changed, previous = [], None
    for state in es.history.replay_generations(params, header, records, strategy):
        if previous is not None:
            changed.append(precision.changed_fraction(previous, state.params))
        previous = jax.tree.map(jnp.copy, state.params)
    as_float32 = lambda tree: jax.tree.map(lambda leaf: jnp.asarray(leaf, jnp.float32), tree)
    return changed, jax.tree.map(jnp.subtract, as_float32(previous), as_float32(params))


def held_out(summary: dict) -> dict:
    return {f"{metric}_{when}": summary[metric][when] for metric in ("mean_reward",
                                                                     "success_rate")
            for when in ("initial", "final")}


def table(root: str) -> list[dict]:
    runs = []
    for folder in run_dirs(root):
        files = training.RunFiles(folder)
        config = training.checkpoint.load_config(files)
        header, records = es.history.read(files.history)
        summary = json.loads(open(files.summary_json).read())
        runs.append((folder, config, header, records, summary))
    reference = [run for run in runs if run[1].model.dtype == "float32"]
    if len(reference) != 1:
        raise ValueError(f"{root}: needs exactly one float32 run, found {len(reference)}")
    _, ref_config, ref_header, ref_records, _ = reference[0]
    loaded = {}

    def params(config):
        key = (config.model.name, config.model.dtype)
        if key not in loaded:
            loaded.clear()
            loaded[key] = models.load(*key).params
        return loaded[key]

    _, ref_movement = replayed(params(ref_config), ref_header, ref_records)
    ref_norm = float(precision.tree_norm(ref_movement))
    rows = []
    for folder, config, header, records, summary in runs:
        changed, movement = replayed(params(config), header, records)
        strategy = es.from_spec(header["strategy"])
        _, same_rewards = replayed(params(config), ref_header, ref_records, strategy)
        rows.append(dict(
            variant=variant(config), run=os.path.relpath(folder, root),
            generations=len(records),
            changed_per_step=float(np.median([c["matrices"] for c in changed])),
            changed_per_step_vectors=float(np.median([c["vectors"] for c in changed])),
            movement_ratio=float(precision.tree_norm(movement)) / ref_norm,
            movement_error=precision.tree_distance(movement, ref_movement) / ref_norm,
            movement_error_same_rewards=precision.tree_distance(same_rewards, ref_movement)
            / ref_norm,
            wall_time_s=summary["wall_time_s"], **held_out(summary)))
    return rows


def markdown(rows: list[dict]) -> str:
    lines = ["| variant | entries changed per update (matrices / vectors) | ‖Δθ‖ / ‖Δθ_f32‖ "
             "| ‖Δθ − Δθ_f32‖ / ‖Δθ_f32‖ (own run / f32 rewards) | held-out mean reward "
             "before → after | success before → after | wall time |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['variant']} | {r['changed_per_step']:.1%} / "
            f"{r['changed_per_step_vectors']:.1%} | {r['movement_ratio']:.3f} | "
            f"{r['movement_error']:.3f} / {r['movement_error_same_rewards']:.3f} | "
            f"{r['mean_reward_initial']:.3f} → {r['mean_reward_final']:.3f} | "
            f"{r['success_rate_initial']:.3f} → {r['success_rate_final']:.3f} | "
            f"{r['wall_time_s']:.0f} s |")
    return "\n".join(lines) + "\n"


def main(argv):
    if len(argv) != 2:
        raise app.UsageError("usage: python -m experiments.precision_table FOLDER")
    rows = table(argv[1])
    with open(os.path.join(argv[1], "precision_table.json"), "w") as f:
        json.dump({"rows": rows}, f, indent=1)
    with open(os.path.join(argv[1], "precision_table.md"), "w") as f:
        f.write(markdown(rows))
    print(json.dumps({"rows": rows}))


if __name__ == "__main__":
    app.run(main)
