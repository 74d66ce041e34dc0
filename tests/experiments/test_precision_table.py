"""precision_table: each variant's run replayed from its history against the float32 run."""

import json

import numpy as np

from agentic_esopt import es, models, training
from agentic_esopt.training.rules import es as es_rule
from experiments import precision_table

VARIANTS = {"f32": ("float32", "nearest", False), "nearest": ("bfloat16", "nearest", False),
            "stochastic": ("bfloat16", "stochastic", False),
            "master": ("bfloat16", "nearest", True)}
GENERATIONS = 3


def write_run(folder, dtype, rounding, master_weights, rewards):
    """A finished tiny run's config, history and summary (the rollouts' rewards given)."""
    config = training.TrainConfig.from_dict({}).replace(
        model=dict(name="tiny", dtype=dtype), run=dict(generations=GENERATIONS),
        es=dict(population_size=4, rounding=rounding, master_weights=master_weights,
                sigma_start=1e-3, sigma_end=1e-3, learning_rate=1e-3))
    files = training.RunFiles(str(folder))
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config.to_dict()))
    strategy = es_rule.make_strategy(config)
    state = strategy.init(config.run.seed, models.load("tiny", dtype).params)
    writer = es.history.HistoryWriter.create(files.history, strategy.spec, state.key)
    for generation_rewards in rewards:
        population = strategy.ask(state)
        state, metrics = strategy.tell(state, population, generation_rewards)
        writer.append(population, generation_rewards, metrics, wall_time=1.0)
    stats = {"initial": 0.5, "final": 0.5}
    (folder / "summary.json").write_text(json.dumps(
        {"mean_reward": stats, "success_rate": stats, "wall_time_s": 3.0}))


def test_variants_against_the_float32_run(tmp_path):
    rng = np.random.default_rng(0)
    rewards = {name: rng.normal(size=(GENERATIONS, 4)).astype(np.float32)
               for name in VARIANTS}
    for name, settings in VARIANTS.items():
        write_run(tmp_path / name / "seed0", *settings, rewards[name])
    rows = {row["run"].split("/")[0]: row for row in precision_table.table(str(tmp_path))}
    assert rows.keys() == VARIANTS.keys()
    f32 = rows["f32"]
    assert f32["variant"] == "float32" and f32["generations"] == GENERATIONS
    assert f32["movement_ratio"] == 1.0 and f32["movement_error"] == 0.0
    assert f32["movement_error_same_rewards"] == 0.0 and f32["changed_per_step"] > 0.99
    # Other rewards, other updates: a run's own movement differs from float32's.
    assert all(rows[name]["movement_error"] > 0.5 for name in ("nearest", "stochastic",
                                                              "master"))
    # On float32's own rewards, the master copy loses only the final cast; nearest rounding
    # drops steps below bfloat16's spacing, stochastic rounding keeps them on average.
    nearest, stochastic, master = (rows[n] for n in ("nearest", "stochastic", "master"))
    assert master["movement_error_same_rewards"] < stochastic["movement_error_same_rewards"]
    assert stochastic["changed_per_step"] > nearest["changed_per_step"]
    assert nearest["variant"] == "bfloat16, nearest rounding"
    assert master["variant"] == "bfloat16, float32 master"


def test_markdown_has_a_row_per_variant():
    row = dict(variant="float32", changed_per_step=1.0, changed_per_step_vectors=0.5,
               movement_ratio=1.0, movement_error=0.0, movement_error_same_rewards=0.0,
               mean_reward_initial=0.5, mean_reward_final=0.6, success_rate_initial=0.2,
               success_rate_final=0.3, wall_time_s=12.0)
    text = precision_table.markdown([row, dict(row, variant="bfloat16, stochastic rounding")])
    assert text.count("\n") == 4 and "| bfloat16, stochastic rounding | 100.0% / 50.0% |" in text
