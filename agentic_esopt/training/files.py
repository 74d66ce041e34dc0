"""The layout of a run's workdir, and atomic text writes."""

from __future__ import annotations

import dataclasses
import os
import tempfile


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


def atomic_write_text(path: str, text: str) -> None:
    """Writes ``text`` to ``path`` via a temporary file and ``os.replace``."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
