"""ES vs GRPO where the task has headroom (docs/results/es_vs_grpo.md, "Headroom grid").

The main job's model and sampling on 4×4 Sudoku shaped like the reference's runs where
SmolLM2-135M still has a signal: a binary reward (1 iff solved), the legal moves listed
(with only the empty cells listed its base success is 0: ``experiments.base_success``),
1.5 turns per blank (``es_vs_grpo --turns_per_blank=1.5``; the reference's 3 puts the base
success at 0.96 with 4 blanks). Both methods play G = 8 episodes of each of 2 tasks a
generation; GRPO takes 6 steps evaluated every 3, ES 24 generations evaluated every 6
(``--es_generations=24 --es_eval_every=6``), 96 held-out puzzles.
"""

from experiments.configs import cpu_default


def get_config():
    config = cpu_default.get_config()
    config.env.update(partial_credit=False, list_legal_moves=True)
    config.rollout.tasks_per_generation = 2
    config.eval.size = 96
    config.run.update(generations=6, eval_every=3)
    return config
