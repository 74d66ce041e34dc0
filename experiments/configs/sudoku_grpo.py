"""The reference's Sudoku GRPO baseline: G = 8 rollouts × 32 tasks, AdamW lr 1e-6.

Profiles: ``--config=experiments/configs/sudoku_grpo.py`` samples at T = 0.7 (top-p 0.8,
top-k 20), ``--config=experiments/configs/sudoku_grpo.py:t1`` at T = 1 (no truncation).
The board is the paper's 9×9 with 15 blanks (``--config.env.mask_count`` changes it).
"""

from experiments.configs.sudoku_paper import paper_sudoku

PROFILES = {"t0.7": dict(temperature=0.7, top_p=0.8, top_k=20),
            "t1": dict(temperature=1.0, top_p=1.0, top_k=0)}


def get_config(profile: str = "t0.7"):
    if profile not in PROFILES:
        raise ValueError(f"unknown profile {profile!r}; choose from {sorted(PROFILES)}")
    config = paper_sudoku(mask_count=15, sigma_start=7e-4, sigma_end=5e-4)
    config.update.name = "grpo"
    config.update.group_size = 8
    config.update.learning_rate = 1e-6
    config.rollout.update(PROFILES[profile])
    config.eval.temperature = PROFILES[profile]["temperature"]
    return config
