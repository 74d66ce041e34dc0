"""Automatic heuristic design (AHD) tasks: instances, evaluators, seeds and baselines."""

from agentic_esopt.envs.ahd.aco import ACOSettings
from agentic_esopt.envs.ahd.aco import FAST_SETTINGS
from agentic_esopt.envs.ahd.tasks import AHDTask
from agentic_esopt.envs.ahd.tasks import TASKS
from agentic_esopt.envs.ahd.tasks import compile_heuristic
from agentic_esopt.envs.ahd.tasks import evaluate_heuristic
from agentic_esopt.envs.ahd.validation import InvalidHeuristicOutput
