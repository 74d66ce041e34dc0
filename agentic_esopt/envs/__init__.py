"""Text environments behind one protocol (see ``base``)."""

from agentic_esopt.envs import base, sudoku
from agentic_esopt.envs.base import EnvFactory, Environment, StepResult, Task
from agentic_esopt.envs.sudoku import SudokuEnv, SudokuTask, generate_tasks, load_anchor_tasks

__all__ = ["EnvFactory", "Environment", "StepResult", "SudokuEnv", "SudokuTask", "Task", "base",
           "generate_tasks", "load_anchor_tasks", "sudoku"]
