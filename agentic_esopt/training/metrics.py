"""Run metrics: one JSON line per record, mirrored to TensorBoard and the log.

Records are ``{"kind": "train" | "eval", "generation": t, ...}``. A train record at t
describes generation t (the population around θ_t); an eval record at g describes θ_g,
the parameters after g generations (g = 0 is the initial model). TensorBoard uses the same
numbers as steps, so purging steps >= k on resume matches ``trim_metrics(path, k)``.
"""

from __future__ import annotations

import json
import numbers
import os

from absl import logging

from agentic_esopt.fileio import read_jsonl, write_jsonl

KINDS = ("train", "eval")


def read_metrics(path: str) -> list[dict]:
    """All intact records of a metrics file (a truncated last line is skipped)."""
    return [r for r in read_jsonl(path) if isinstance(r, dict) and r.get("kind") in KINDS]


def trim_metrics(path: str, generation: int) -> None:
    """Keeps only records with generation < ``generation`` (rewritten atomically)."""
    if not os.path.exists(path):
        return
    kept = [r for r in read_metrics(path) if r["generation"] < generation]
    write_jsonl(path, kept)


class MetricsLogger:
    """Appends records to metrics.jsonl, TensorBoard (tensorboardX) and absl logging."""

    def __init__(self, metrics_path: str, tensorboard_dir: str, purge_step: int | None = None,
                 write: bool = True):
        """Opens the sinks.

        Args:
          metrics_path: the JSONL file (appended to).
          tensorboard_dir: TensorBoard log folder.
          purge_step: on resume, TensorBoard discards earlier events at steps >= this.
          write: False (processes other than the first) only builds the records.
        """
        self.metrics_path = metrics_path
        self._writer = None
        if write:
            # Imported here, by writers only: tensorboardX imports torch wherever it is
            # installed (about 2 s a process), which launchers that never log should not pay.
            from tensorboardX import SummaryWriter  # pylint: disable=import-outside-toplevel
            os.makedirs(os.path.dirname(os.path.abspath(metrics_path)), exist_ok=True)
            self._writer = SummaryWriter(tensorboard_dir, purge_step=purge_step or None)

    def log(self, kind: str, generation: int, values: dict) -> dict:
        """Writes one record; numeric values also go to TensorBoard as ``kind/name``."""
        if kind not in KINDS:
            raise ValueError(f"unknown metrics kind {kind!r}; choose one of {KINDS}")
        record = {"kind": kind, "generation": int(generation), **values}
        if self._writer is None:
            return record
        with open(self.metrics_path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
            f.flush()
            os.fsync(f.fileno())
        scalars = {name: value for name, value in values.items()
                   if isinstance(value, numbers.Real) and not isinstance(value, bool)}
        for name, value in scalars.items():
            self._writer.add_scalar(f"{kind}/{name}", value, int(generation))
        self._writer.flush()
        logging.info("%s %d: %s", kind, generation,
                     ", ".join(f"{k}={v:.4g}" for k, v in scalars.items()))
        return record

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
