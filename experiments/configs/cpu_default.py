"""The main CPU job: SmolLM2-135M on small Sudoku boards (the numbers to tune live here)."""

from agentic_esopt.training import TrainConfig


def get_config():
    return TrainConfig(
        env="sudoku", board_size=4, mask_count=2, partial_credit=True, list_legal_moves=True,
        model="smollm2-135m", dtype="float32",
        population_size=8, noise="lowrank", rank=1, antithetic=True,
        sigma_schedule="cosine", sigma_start=4e-3, sigma_end=2e-3, sigma_warmup=0,
        learning_rate=2e-3, optimizer="sgd", fitness="zscore", scope="full",
        generations=14, tasks_per_generation=4, max_turns=2, max_new_tokens=8,
        temperature=0.7, history_turns=0, reply_prefix="set ", stop_at_newline=True,
        eval_split="eval", eval_size=64, eval_every=14,
        eval_temperature=0.7, checkpoint_every=1, workdir="workdirs/cpu_default", seed=0)
