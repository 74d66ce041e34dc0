"""ES at Scale's Countdown recipe (Qiu et al. 2025) on any Hugging Face Qwen2.5 folder.

Nothing downloads: point the model at a local folder (they ran Qwen2.5 0.5B-7B Instruct).
The preset is valid only once ``--config.model.name`` names an existing folder:

    python -m experiments.train --config=experiments/configs/countdown_es_at_scale.py \\
        --config.model.name=/path/to/Qwen2.5-3B-Instruct --workdir=DIR

Sources: their repository github.com/VsonicV/es-fine-tuning-paper, read at three stages:
``countdown/es_fine-tuning_countdown.py`` (the original script), ``es_fine-tuning_
countdown_accl.py`` (vLLM) and ``es_at_scale/`` (train.py, trainer/es_trainer.py,
utils/worker_extension.py, reward_function/countdown_grader.py).

Matched, with where each comes from:

* population 30, σ = 1e-3 constant, α = 5e-4: all three (es_at_scale's ``alpha`` default
  is σ/2); plain SGD ``θ += α/N Σ z_i ε_i``, no division by σ (the update loops);
  z-scored rewards ``(r - mean) / (std + 1e-8)``, population std (``np.std``;
  ``reward_shaping.z_score``); full-rank Gaussian noise on every parameter
  (``named_parameters``), one draw per member, no antithetic pairs.
* 300 iterations: es_at_scale/train.py's ``--n-iterations`` default (the original script
  has 500, the vLLM one 1000).
* 200 prompts per iteration, the same for every member (each member generates for the
  whole batch); the original takes ``dataset[:200]`` every iteration, so
  ``env.train_pool=200`` plays one fixed set of 200 training puzzles each generation
  (es_at_scale draws 200 from a shuffled training split each iteration; that split's size,
  in a binary file, could not be read here).
* greedy decoding (``do_sample=False``; ``temperature=0.0`` in vLLM) for training and
  evaluation, up to 1024 new tokens (original and vLLM scripts and their evaluation
  scripts; es_at_scale/train.py's default is 512), stopping only at the end token.
* the prompt, plain text with no chat template (their data's ``context`` field, passed
  through by es_at_scale's ``countdown_template``) and the reward ``0.1 * format +
  answer``: ``envs.es_at_scale`` gives both, with the sources.
* puzzles of 3 or 4 numbers in 1-99 with targets 1-100, like their
  ``countdown/data/countdown.json`` (2200 puzzles: 1071 of 3 numbers, 1129 of 4; numbers
  1-99; 96% of targets integers in 1-100).
* bfloat16 weights (the original's ``--precision`` default and es_at_scale's engines),
  updates rounded to nearest (they add the update in the weights' dtype).

Differences we keep or could not confirm:

* the puzzles are reasoning-gym's, not their file (not shipped here): same shape and
  ranges, other puzzles; held-out: 2000 of our eval split (theirs: the file's last 2000).
* their noise seeds every tensor with the member's seed (same-shaped tensors get the
  same noise; their README calls it partially correlated, the ``_iid`` scripts fix
  it); ours is independent per tensor, as their ``_iid`` variant.
* they perturb the weights in place and subtract the noise again (in bfloat16 that
  leaves rounding residue); we never modify θ to evaluate a member.
* ``**`` in an answer scores 0 here (their ``eval`` would compute it).
* the paper's own text on iterations, token limit and evaluation could not be read here;
  the numbers above are their code's. Evaluation every 50 generations and checkpoints
  every 10 are ours (their original script evaluates after training).
"""

import json

from agentic_esopt.envs import es_at_scale
from experiments.configs import common

PLACEHOLDER_PATH = "/path/to/Qwen2.5-3B-Instruct"  # Replaced by --config.model.name=PATH.
COUNTDOWN = dict(min_numbers=3, max_numbers=4, min_value=1, max_value=99, min_target=1,
                 max_target=100)
PROMPTS_PER_ITERATION = 200


def get_config():
    return common.base_config(
        "reasoning_gym",
        env=dict(dataset="countdown", dataset_options=json.dumps(COUNTDOWN),
                 prompt_style="es_at_scale", max_turns=1, train_pool=PROMPTS_PER_ITERATION),
        model=dict(name=PLACEHOLDER_PATH, dtype="bfloat16"),
        es=dict(population_size=30, noise="full", antithetic=False,
                sigma_schedule="constant", sigma_start=1e-3, sigma_end=1e-3,
                learning_rate=5e-4, optimizer="sgd", scale_by_sigma=False,
                fitness="zscore", scope="full", rounding="nearest", master_weights=False),
        rollout=dict(tasks_per_generation=PROMPTS_PER_ITERATION, max_new_tokens=1024,
                     temperature=0.0, reply_prefix=es_at_scale.REPLY_PREFIX,
                     chat_template=False),
        eval=dict(split="eval", size=2000, temperature=0.0),
        run=dict(seed=0, generations=300, eval_every=50, checkpoint_every=10))
