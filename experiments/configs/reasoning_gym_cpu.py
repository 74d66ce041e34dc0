"""reasoning-gym on CPU: SmolLM2-135M on small Countdown puzzles (any dataset by flag).

Switching ``cpu_default.py`` to this environment by ``--config.env.name`` alone keeps the
Sudoku options in its ``env`` section, which reasoning_gym rejects; this file has the
right section. Needs ``pip install -e ".[reasoning]"``.

  python -m experiments.train --config=experiments/configs/reasoning_gym_cpu.py \
      --config.env.dataset=countdown --workdir=workdirs/reasoning_gym_cpu
  # another dataset needs its own generator options ('{}': its defaults):
  #   --config.env.dataset=chain_sum --config.env.dataset_options='{"max_terms": 3}'
  # several answers per task, each wrong one coming back with its score:
  #   --config.env.max_turns=3 --config.env.episode_reward=best
"""

import json

from experiments.configs import common

# Three numbers up to 20 and a two-digit target: within reach of a 135M model.
COUNTDOWN = dict(min_numbers=3, max_numbers=3, max_value=20, min_target=10, max_target=100)


def get_config():
    return common.base_config(
        "reasoning_gym",
        env=dict(dataset="countdown", dataset_options=json.dumps(COUNTDOWN), max_turns=1),
        model=dict(name="smollm2-135m", dtype="float32"),
        es=dict(population_size=8, noise="lowrank", rank=1, antithetic=True,
                sigma_schedule="cosine", sigma_start=4e-3, sigma_end=2e-3,
                learning_rate=2e-3, optimizer="sgd", fitness="zscore", scope="full"),
        rollout=dict(tasks_per_generation=8, max_new_tokens=24, temperature=0.7,
                     reply_prefix="<answer>"),
        eval=dict(split="eval", size=64, temperature=0.7),
        run=dict(seed=0, generations=14, eval_every=14, checkpoint_every=1))
