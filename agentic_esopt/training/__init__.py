"""ES training end to end: config, task sources, the trainer, checkpoints, metrics, reports."""

from agentic_esopt.training import checkpoint, config, evaluation, files, metrics, report, tasks
from agentic_esopt.training.config import TrainConfig, make_strategy
from agentic_esopt.training.evaluation import evaluate, evaluate_workdir
from agentic_esopt.training.files import RunFiles
from agentic_esopt.training.tasks import ENVS, EnvSpec, TaskSource
from agentic_esopt.training.trainer import TrainResult, run_generation, train

__all__ = ["ENVS", "EnvSpec", "RunFiles", "TaskSource", "TrainConfig", "TrainResult",
           "checkpoint", "config", "evaluate", "evaluate_workdir", "evaluation", "files",
           "make_strategy", "metrics", "report", "run_generation", "tasks", "train"]
