"""Heuristic design with prompt–parameter co-evolution: EoH + ES on SmolLM2-135M.

Each generation answers one EoH batch (every member answers once per operator); the
paper's AHD setting is σ cosine 1e-3 → 0, α = 5e-4. ``--config.env.search=sample`` runs
Sample + ES; ``--config.rule.name=none`` the search alone with the unperturbed model.
"""

from experiments.configs import common


def get_config():
    return common.base_config(
        "ahd",
        env=dict(task="tsp_constructive", search="eoh", eoh_population=4, train_size=8,
                 timeout_s=10.0),
        model=dict(name="smollm2-135m", dtype="float32"),
        es=dict(population_size=4, noise="lowrank", rank=1, sigma_schedule="cosine",
                sigma_start=1e-3, sigma_end=0.0, learning_rate=5e-4, fitness="zscore"),
        rollout=dict(max_new_tokens=384, temperature=0.7, top_p=0.9),
        eval=dict(size=64, split="test"),
        run=dict(seed=0, generations=4, eval_every=4, checkpoint_every=1))
