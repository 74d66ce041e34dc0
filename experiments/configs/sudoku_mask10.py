"""The reference's 9×9 Sudoku with 10 blanks (profiles: ``sudoku_paper.SIGMAS[10]``)."""

from experiments.configs.sudoku_paper import paper_sudoku


def get_config(profile: str = "agentic"):
    return paper_sudoku(mask_count=10, profile=profile)
