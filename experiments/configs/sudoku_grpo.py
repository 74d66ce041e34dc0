"""The reference's Sudoku GRPO baseline: 100 steps of 8 rollouts × 32 puzzles, AdamW lr
1e-6, β 1e-3, ε 0.2, 512 turns per policy batch, evaluation every 20 steps (each puzzle 3
times at T=0.7, top-p 0.8, top-k 20).

Profiles: ``--config=experiments/configs/sudoku_grpo.py`` trains at T = 0.7 (top-p 0.8,
top-k 20), ``--config=experiments/configs/sudoku_grpo.py:t1`` at T = 1 (no truncation).
The board is the paper's 9×9 with 15 blanks (``--config.env.mask_count`` changes it).
"""

from experiments.configs import common
from experiments.configs.sudoku_paper import SAMPLING, paper_sudoku

PROFILES = {"t0.7": dict(temperature=0.7, top_p=0.8, top_k=20),
            "t1": dict(temperature=1.0, top_p=1.0, top_k=0)}


def get_config(profile: str = "t0.7"):
    if profile not in PROFILES:
        raise ValueError(f"unknown profile {profile!r}; choose from {sorted(PROFILES)}")
    config = paper_sudoku(mask_count=15)
    config.rule = common.rule_section("grpo", group_size=8, learning_rate=1e-6, kl_beta=1e-3,
                                      clip_epsilon=0.2, minibatch_size=512)
    config.rollout.update(PROFILES[profile])
    config.eval.update(temperature=SAMPLING["temperature"], repeats=3)
    config.run.eval_every = 20
    return config
