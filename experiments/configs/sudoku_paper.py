"""The paper's Sudoku setting (9×9, G=32, α=5e-4, cosine σ, 100 generations)."""

from agentic_esopt.training import TrainConfig


def paper_sudoku(mask_count: int, sigma_start: float, sigma_end: float) -> TrainConfig:
    """The published Sudoku run for one mask count (generated puzzles unless an anchor
    folder is passed); members decode greedily, as the noise already explores."""
    return TrainConfig(
        env="sudoku", board_size=9, mask_count=mask_count, partial_credit=False,
        model="smollm2-135m", dtype="float32",
        population_size=32, noise="full", rank=1, antithetic=False,
        sigma_schedule="cosine", sigma_start=sigma_start, sigma_end=sigma_end,
        sigma_warmup=0, learning_rate=5e-4, optimizer="sgd", fitness="zscore", scope="full",
        generations=100, tasks_per_generation=32, max_new_tokens=128, temperature=0.0,
        history_turns=4, eval_split="eval", eval_size=32, eval_every=10,
        eval_temperature=0.0, checkpoint_every=5,
        workdir=f"workdirs/sudoku_mask{mask_count}", seed=0)
