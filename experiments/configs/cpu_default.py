"""The main CPU job: SmolLM2-135M on small Sudoku boards (the numbers to tune live here)."""

from experiments.configs import common


def get_config():
    return common.base_config(
        "sudoku",
        env=dict(board_size=4, mask_count=2, partial_credit=True, list_legal_moves=True),
        model=dict(name="smollm2-135m", dtype="float32"),
        es=dict(population_size=8, noise="lowrank", rank=1, antithetic=True,
                sigma_schedule="cosine", sigma_start=4e-3, sigma_end=2e-3,
                learning_rate=2e-3, optimizer="sgd", fitness="zscore", scope="full"),
        rollout=dict(tasks_per_generation=4, max_turns=2, max_new_tokens=8, temperature=0.7,
                     history_turns=0, reply_prefix="set ", stop_at_newline=True),
        eval=dict(split="eval", size=64, temperature=0.7),
        run=dict(seed=0, generations=14, eval_every=14, checkpoint_every=1))
