"""The paper's Sudoku run on Qwen3.5-4B: G=32, α=5e-4, σ cosine 1e-3 → 2.5e-4, 100
generations, bfloat16 weights.

Nothing downloads: point the model at a local Hugging Face folder of Qwen3.5-4B (the
multimodal checkpoint works; its vision tower is not loaded). The preset is valid only
once ``--config.model.name`` names an existing folder:

    python -m experiments.train --config=experiments/configs/sudoku_qwen3_5_4b.py \\
        --config.model.name=/path/to/Qwen3.5-4B --workdir=DIR
"""

from experiments.configs.sudoku_paper import paper_sudoku

PLACEHOLDER_PATH = "/path/to/Qwen3.5-4B"  # Replaced by --config.model.name=PATH.


def get_config():
    config = paper_sudoku(mask_count=5)  # the agentic profile: σ cosine 1e-3 → 2.5e-4
    config.model.name = PLACEHOLDER_PATH
    config.model.dtype = "bfloat16"
    return config
