"""The paper's 9×9 Sudoku with 15 blanks: σ cosine 7e-4 → 5e-4."""

from experiments.configs.sudoku_paper import paper_sudoku


def get_config():
    return paper_sudoku(mask_count=15, sigma_start=7e-4, sigma_end=5e-4)
