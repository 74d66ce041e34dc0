"""The paper's WebArena-Lite run on Qwen3.5-27B: G=8, α=2.5e-4, σ=1.5e-3 constant, 8 tasks
per generation, T=0.7, top-p 0.8, top-k 20, 30 steps per episode, bfloat16 weights.

Nothing downloads and the WebArena sites are yours to host: set the ``WA_*`` variables
(see README, "Web agents"), install ``pip install -e ".[webarena]"``, and point the model
at a local Hugging Face folder:

    python -m experiments.train --config=experiments/configs/webarena_lite.py \\
        --config.model.name=/path/to/Qwen3.5-27B --workdir=DIR
"""

from experiments.configs import common

PLACEHOLDER_PATH = "/path/to/Qwen3.5-27B"  # Replaced by --config.model.name=PATH.


def get_config():
    return common.base_config(
        "webarena_lite",
        env=dict(max_turns=30, action_format="webrl"),
        model=dict(name=PLACEHOLDER_PATH, dtype="bfloat16"),
        es=dict(population_size=8, sigma_schedule="constant", sigma_start=1.5e-3,
                sigma_end=1.5e-3, learning_rate=2.5e-4, optimizer="sgd", fitness="zscore"),
        rollout=dict(tasks_per_generation=8, max_turns=30, max_new_tokens=512,
                     temperature=0.7, top_p=0.8, top_k=20),
        eval=dict(split="eval", size=165, temperature=0.7),
        run=dict(seed=0, generations=70, eval_every=10, checkpoint_every=1))
