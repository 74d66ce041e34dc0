"""reasoning-gym on CPU: SmolLM2-135M picking the larger or smaller of two numbers
(``number_format``), the dataset where its base success is within reach (any by flag).

Base success on 64 eval tasks at T = 0.7 (seed 0, this file's rollout): number_format
with two candidates 0.11 ± 0.04; every other dataset tried scored 0-0.06 (countdown with
three numbers up to 20: 0; chain_sum of two digits, letter_counting, syllogism: <= 0.06;
docs/environments.md lists them). Switching ``cpu_default.py`` to this environment by
``--config.env.name`` alone keeps the Sudoku options in its ``env`` section, which
reasoning_gym rejects; this file has the right section. Needs ``pip install -e
".[reasoning]"``.

  python -m experiments.train --config=experiments/configs/reasoning_gym_cpu.py \
      --workdir=workdirs/reasoning_gym_cpu
  # another dataset needs its own generator options ('{}': its defaults):
  #   --config.env.dataset=countdown --config.env.dataset_options='{"min_numbers": 3,
  #   "max_numbers": 3, "max_value": 20, "min_target": 10, "max_target": 100}'
  # several answers per task, each wrong one coming back with its score:
  #   --config.env.max_turns=3 --config.env.episode_reward=best
"""

import json

from experiments.configs import common

# Two candidates of 10-1000 in mixed notations; the answer is one of them.
NUMBER_FORMAT = dict(min_num_candidates=2, max_num_candidates=2, min_n=10, max_n=1000)


def get_config():
    return common.base_config(
        "reasoning_gym",
        env=dict(dataset="number_format", dataset_options=json.dumps(NUMBER_FORMAT),
                 max_turns=1),
        model=dict(name="smollm2-135m", dtype="float32"),
        es=dict(population_size=8, noise="lowrank", rank=1, antithetic=True,
                sigma_schedule="cosine", sigma_start=4e-3, sigma_end=2e-3,
                learning_rate=2e-3, optimizer="sgd", fitness="zscore", scope="full"),
        rollout=dict(tasks_per_generation=16, max_new_tokens=12, temperature=0.7,
                     reply_prefix="<answer>"),
        eval=dict(split="eval", size=64, temperature=0.7),
        run=dict(seed=0, generations=14, eval_every=14, checkpoint_every=1))
