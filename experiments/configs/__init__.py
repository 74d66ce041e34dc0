"""Config presets: one small file per preset, each with ``get_config() -> TrainConfig``."""

import importlib

from agentic_esopt.training import TrainConfig

PRESETS = ("cpu_default", "sudoku_mask5", "sudoku_mask10", "sudoku_mask15")


def get_config(name: str) -> TrainConfig:
    """The preset called ``name``; ValueError listing the presets if there is none."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose one of {PRESETS}")
    return importlib.import_module(f"experiments.configs.{name}").get_config()
