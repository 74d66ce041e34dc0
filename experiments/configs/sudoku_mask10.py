"""The paper's 9×9 Sudoku with 10 blanks: σ cosine 1e-3 → 2.5e-4."""

from experiments.configs.sudoku_paper import paper_sudoku


def get_config():
    return paper_sudoku(mask_count=10, sigma_start=1e-3, sigma_end=2.5e-4)
