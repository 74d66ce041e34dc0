"""The one run loop: config sections, update rules, checkpoints, metrics and reports."""

from agentic_esopt.training import (checkpoint, config, evaluation, files, machine, metrics,
                                    report, rules, trainer)
from agentic_esopt.training.config import TrainConfig
from agentic_esopt.training.rules.es import make_strategy
from agentic_esopt.training.evaluation import evaluate_skill_effect, evaluate_workdir
from agentic_esopt.training.files import RunFiles
from agentic_esopt.training.trainer import TrainResult, train

__all__ = ["RunFiles", "TrainConfig", "TrainResult", "checkpoint", "config",
           "evaluate_skill_effect", "evaluate_workdir", "evaluation", "files", "machine",
           "make_strategy", "metrics", "report", "rules", "train", "trainer"]
