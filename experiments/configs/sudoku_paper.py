"""The paper's Sudoku setting (9×9, G=32, α=5e-4, cosine σ, 100 generations)."""

from experiments.configs import common


def paper_sudoku(mask_count: int, sigma_start: float, sigma_end: float):
    """The published Sudoku run for one mask count (generated puzzles unless
    ``--config.env.anchor_path`` is given); members decode greedily, as the noise
    already explores."""
    return common.base_config(
        "sudoku",
        env=dict(board_size=9, mask_count=mask_count, partial_credit=False),
        model=dict(name="smollm2-135m", dtype="float32"),
        es=dict(population_size=32, noise="full", antithetic=False, sigma_schedule="cosine",
                sigma_start=sigma_start, sigma_end=sigma_end, learning_rate=5e-4,
                optimizer="sgd", fitness="zscore", scope="full"),
        rollout=dict(tasks_per_generation=32, max_new_tokens=128, temperature=0.0,
                     history_turns=4),
        eval=dict(split="eval", size=32, temperature=0.0),
        run=dict(seed=0, generations=100, eval_every=10, checkpoint_every=5))
