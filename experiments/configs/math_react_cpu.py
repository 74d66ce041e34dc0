"""Math ReAct on CPU: SmolLM2-135M on one-line arithmetic under the ``code`` protocol.

The reference protocol is out of a 135M model's reach (README "Tool-using agents"), so
this setting shapes it as the Sudoku default does: the problem comes with the code block
that computes it, a code block is the tool call, the observation asks for the final
answer, and the answer is read leniently. The reward is unchanged: 1 iff the tool ran and
the answer is right.

  python -m experiments.train --config=experiments/configs/math_react_cpu.py \
      --workdir=workdirs/math_react_cpu
"""

from experiments.configs import common


def get_config():
    return common.base_config(
        "math_react",
        env=dict(difficulty="easy", hint="command", protocol="code", max_turns=3),
        model=dict(name="smollm2-135m", dtype="float32"),
        es=dict(population_size=8, noise="lowrank", rank=1, antithetic=True,
                sigma_schedule="cosine", sigma_start=4e-3, sigma_end=2e-3,
                learning_rate=2e-3, optimizer="sgd", fitness="zscore", scope="full"),
        rollout=dict(tasks_per_generation=8, max_new_tokens=48, temperature=0.7),
        eval=dict(split="eval", size=64, temperature=0.7),
        run=dict(seed=0, generations=14, eval_every=14, checkpoint_every=1))
