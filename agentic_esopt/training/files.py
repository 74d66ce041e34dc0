"""The layout of a run's workdir, and atomic text writes."""

from __future__ import annotations

import dataclasses
import os


@dataclasses.dataclass(frozen=True)
class RunFiles:
    """Paths inside one run's workdir."""

    workdir: str

    def _join(self, *names: str) -> str:
        return os.path.join(self.workdir, *names)

    @property
    def config(self) -> str:
        return self._join("config.json")

    @property
    def history(self) -> str:
        return self._join("history.jsonl")

    @property
    def metrics(self) -> str:
        return self._join("metrics.jsonl")

    @property
    def checkpoints(self) -> str:
        return self._join("checkpoints")

    @property
    def corrupt_checkpoints(self) -> str:
        return self._join("corrupt_checkpoints")

    @property
    def trajectories(self) -> str:
        return self._join("trajectories")

    @property
    def tensorboard(self) -> str:
        return self._join("tensorboard")

    @property
    def reward_curve(self) -> str:
        return self._join("reward_curve.png")

    @property
    def summary_json(self) -> str:
        return self._join("summary.json")

    @property
    def summary_markdown(self) -> str:
        return self._join("summary.md")

    def train_trajectories(self, generation: int) -> str:
        """JSONL of generation ``generation``'s training episodes."""
        return self._join("trajectories", f"gen_{generation:05d}.jsonl")

    def eval_trajectories(self, generation: int) -> str:
        """JSONL of the evaluation after ``generation`` generations."""
        return self._join("trajectories", f"eval_{generation:05d}.jsonl")
