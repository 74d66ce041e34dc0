"""The reference's Sudoku setting (9×9, G=32, α=5e-4, 100 generations of 32 puzzles),
sampled as the reference samples: T=0.7, top-p 0.8, top-k 20, presence penalty 1.5, 64
tokens per turn, 3 × blanks turns, evaluation every 10 generations with every held-out
puzzle played 3 times.

Two σ profiles per mask count, chosen after the config file's name with a colon:
``agentic`` (default; Agentic ESOpt's cosine σ) and ``vanilla`` (the reference's
constant-σ ES), e.g. ``--config=experiments/configs/sudoku_mask15.py:vanilla``.
"""

from experiments.configs import common

# mask count -> profile -> (σ start, σ end); the reference's published run settings.
SIGMAS = {5: {"agentic": (1e-3, 2.5e-4), "vanilla": (1e-3, 1e-3)},
          10: {"agentic": (1e-3, 2.5e-4), "vanilla": (1e-3, 1e-3)},
          15: {"agentic": (7e-4, 5e-4), "vanilla": (5e-4, 5e-4)}}
SAMPLING = dict(temperature=0.7, top_p=0.8, top_k=20, presence_penalty=1.5)


def paper_sudoku(mask_count: int, profile: str = "agentic"):
    """The published Sudoku run for one mask count and σ profile (generated puzzles
    unless ``--config.env.anchor_path`` is given)."""
    if profile not in SIGMAS[mask_count]:
        raise ValueError(f"unknown profile {profile!r}; choose from "
                         f"{sorted(SIGMAS[mask_count])}")
    sigma_start, sigma_end = SIGMAS[mask_count][profile]
    return common.base_config(
        "sudoku",
        env=dict(board_size=9, mask_count=mask_count, partial_credit=False),
        model=dict(name="smollm2-135m", dtype="float32"),
        es=dict(population_size=32, noise="full", antithetic=False,
                sigma_schedule="constant" if profile == "vanilla" else "cosine",
                sigma_start=sigma_start, sigma_end=sigma_end, learning_rate=5e-4,
                optimizer="sgd", fitness="zscore", scope="full"),
        rollout=dict(tasks_per_generation=32, max_turns=3 * mask_count, max_new_tokens=64,
                     history_turns=4, **SAMPLING),
        eval=dict(split="eval", size=32, temperature=SAMPLING["temperature"], repeats=3),
        run=dict(seed=0, generations=100, eval_every=10, checkpoint_every=5))
