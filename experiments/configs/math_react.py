"""Math ReAct with a sandboxed code tool: the reference's setting (G=16 full-rank, α=5e-4,
σ cosine 1e-3 → 5e-4, 25 generations of 16 problems, 50 turns of up to 4,096 tokens, T=1,
top-k 40, presence penalty 2.0, evaluation every 10 generations).

Pass the published problems and a model that can follow the protocol, e.g.

  python -m experiments.train --config=experiments/configs/math_react.py \
      --config.model.name=/path/to/Qwen3.5-4B \
      --config.env.data=../shared/data/anchors/trace2skill/math_reasoning/dapo_evolve.jsonl \
      --config.env.eval_data=../shared/data/anchors/trace2skill/math_reasoning/dapo_test.jsonl
"""

from experiments.configs import common


def get_config():
    return common.base_config(
        "math_react",
        env=dict(max_turns=50),
        model=dict(name="smollm2-135m", dtype="float32"),
        es=dict(population_size=16, noise="full", sigma_schedule="cosine", sigma_start=1e-3,
                sigma_end=5e-4, learning_rate=5e-4, fitness="zscore", scope="full"),
        rollout=dict(tasks_per_generation=16, max_turns=50, max_new_tokens=4096,
                     temperature=1.0, top_p=1.0, top_k=40, presence_penalty=2.0),
        eval=dict(size=32, temperature=1.0),
        run=dict(generations=25, eval_every=10, checkpoint_every=1))
