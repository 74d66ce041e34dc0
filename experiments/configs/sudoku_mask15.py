"""The reference's 9×9 Sudoku with 15 blanks (profiles: ``sudoku_paper.SIGMAS[15]``)."""

from experiments.configs.sudoku_paper import paper_sudoku


def get_config(profile: str = "agentic"):
    return paper_sudoku(mask_count=15, profile=profile)
