"""The paper's WebArena-Lite run on Qwen3.5-27B: G=8, α=2.5e-4, σ=1.5e-3 constant, 70
generations of 8 tasks, T=0.7, top-p 0.8, top-k 20, presence penalty 1.5, 30 steps of up to
2,048 tokens per episode, bfloat16 weights; training on the 582 WebArena tasks outside
Lite and the 65 kept apart, evaluation on Lite's 165, each played 3 times.

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
        env=dict(max_turns=30, action_format="webrl", validation_tasks=65),
        model=dict(name=PLACEHOLDER_PATH, dtype="bfloat16"),
        es=dict(population_size=8, sigma_schedule="constant", sigma_start=1.5e-3,
                sigma_end=1.5e-3, learning_rate=2.5e-4, optimizer="sgd", fitness="zscore"),
        rollout=dict(tasks_per_generation=8, max_turns=30, max_new_tokens=2048,
                     temperature=0.7, top_p=0.8, top_k=20, presence_penalty=1.5),
        eval=dict(split="eval", size=165, temperature=0.7, repeats=3),
        run=dict(seed=0, generations=70, eval_every=10, checkpoint_every=1))
