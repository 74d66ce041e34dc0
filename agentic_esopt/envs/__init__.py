"""Text environments behind one protocol (``base``) and the registry (``make``)."""

from agentic_esopt.envs import base, registry, sudoku
from agentic_esopt.envs.base import (EnvFactory, Environment, Splits, StepResult, Task,
                                     TaskSource)
from agentic_esopt.envs.registry import build_options, default_options, make, names
from agentic_esopt.envs.sudoku import SudokuEnv, SudokuTask, generate_tasks, load_anchor_tasks

__all__ = ["EnvFactory", "Environment", "Splits", "StepResult", "SudokuEnv", "SudokuTask",
           "Task", "TaskSource", "base", "build_options", "default_options",
           "generate_tasks", "load_anchor_tasks", "make", "names", "registry", "sudoku"]
