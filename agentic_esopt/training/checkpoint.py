"""A run's files, checkpoints and resumption.

A workdir holds ``config.json`` (the run's ``TrainConfig``), ``history.jsonl`` (the es
history), ``metrics.jsonl``, ``trajectories/``, ``tensorboard/``, ``checkpoints/`` (orbax:
the update rule's full state and the reward source's state every K generations, with a
checksum) and the final reports.

Resuming from a checkpoint taken after generation k trims every other file back to k:
the history keeps k generation records, metrics and trajectories of later generations are
deleted (evaluations from k on are redone), and TensorBoard purges steps >= k. Every write
is atomic or trimmed on resume, so a run killed at any moment and rerun ends bitwise where
an uninterrupted run ends.
"""

from __future__ import annotations

import contextlib
import glob
import logging as std_logging
import json
import os
import re
import shutil
import tempfile
import time
import zlib
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils
from absl import logging

from agentic_esopt import sharding
from agentic_esopt.fileio import atomic_write_text
from agentic_esopt.training import config as config_lib
from agentic_esopt.training import metrics, rules
from agentic_esopt.training.config import TrainConfig
from agentic_esopt.training.files import RunFiles

_TRAJECTORY_FILE = re.compile(r"(gen|eval)_(\d+)\.jsonl$")


def load_config(files: RunFiles) -> TrainConfig:
    """The ``TrainConfig`` a workdir was started with."""
    if not os.path.isfile(files.config):
        raise FileNotFoundError(f"{files.workdir!r} is not a training workdir: no "
                                f"{os.path.basename(files.config)}")
    with open(files.config, encoding="utf-8") as f:
        return TrainConfig.from_dict(json.load(f))


def _flatten(values: dict, prefix: str = "") -> dict:
    flat = {}
    for name, value in values.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{name}."))
        else:
            flat[f"{prefix}{name}"] = value
    return flat


def _without_layout(values: dict) -> dict:
    """The flattened settings of a config dict less its layout (which may change)."""
    flat = _flatten({name: section for name, section in values.items()
                     if name not in config_lib.LAYOUT_SECTIONS})
    return {name: value for name, value in flat.items()
            if name not in config_lib.LAYOUT_FIELDS}


def save_or_check_config(files: RunFiles, config: TrainConfig, write: bool = True) -> None:
    """Records ``config`` in a new workdir, or checks it equals the one recorded there
    (``mesh``, ``distributed`` and ``model.cache_layout`` may differ: a run resumes under
    another layout).

    Args:
      files: the workdir's files.
      config: the run's config.
      write: record a new workdir's config (False: only check, as processes other than
        the first do).

    Raises:
      ValueError: listing every field that differs from the recorded run (a resumed run
        must be the same run), or if the workdir holds checkpoints but no config.
    """
    if not os.path.isfile(files.config):
        if os.path.isdir(files.checkpoints) and os.listdir(files.checkpoints):
            raise ValueError(f"{files.workdir!r} has checkpoints but no config.json; it was "
                             "not made by this trainer, use another workdir")
        if write:
            atomic_write_text(files.config, json.dumps(config.to_dict(), indent=2) + "\n")
        return
    with open(files.config, encoding="utf-8") as f:
        recorded = json.load(f)
    try:  # Fields added since the run was recorded take their defaults.
        recorded = TrainConfig.from_dict(recorded).to_dict()
    except ValueError:  # Fields since removed or renamed: compared as recorded.
        pass
    saved = _without_layout(recorded)
    current = _without_layout(config.to_dict())
    changed = [f"{name}: {saved.get(name, '<missing>')!r} in the workdir, "
               f"{current.get(name, '<missing>')!r} now"
               for name in sorted(set(saved) | set(current))
               if saved.get(name) != current.get(name)]
    if changed:
        raise ValueError(f"workdir {files.workdir!r} holds a run with a different "
                         "configuration, so it cannot be resumed with these settings:\n  "
                         + "\n  ".join(changed)
                         + "\nrerun with the original settings or use a new workdir")


class _DropOrbaxRecords(std_logging.Filter):
    def filter(self, record: std_logging.LogRecord) -> bool:
        return "orbax" not in record.pathname


@contextlib.contextmanager
def _orbax_errors_silenced():
    """Keeps orbax's own error records (and their tracebacks) out of the log while a
    checkpoint that may be damaged is read: the caller reports the failure once."""
    drop = _DropOrbaxRecords()
    handlers = [h for logger in (std_logging.getLogger(), std_logging.getLogger("absl"))
                for h in logger.handlers]
    for handler in handlers:
        handler.addFilter(drop)
    try:
        yield
    finally:
        for handler in handlers:
            handler.removeFilter(drop)


def state_checksum(state: Any) -> int:
    """CRC32 over every leaf's dtype, shape and bytes, in tree order."""
    crc = 0
    for leaf in jax.tree.leaves(state):
        array = np.asarray(leaf)
        crc = zlib.crc32(f"{array.dtype}{array.shape}".encode(), crc)
        crc = zlib.crc32(array.tobytes(), crc)
    return crc


def remove_unfinished_saves(directory: str) -> None:
    """Deletes the temporary folders that saves cut short left in ``directory`` (process 0
    deletes, every process waits). Done here rather than by orbax's
    ``cleanup_tmp_directories``, whose thread ``close()`` does not wait for: a run stopped
    right after opening its checkpoints printed that thread's traceback at exit."""
    if sharding.is_primary() and os.path.isdir(directory):
        for name in ocp.step.tmp_checkpoints(directory):
            shutil.rmtree(os.path.join(directory, name))
    sharding.sync("checkpoint: unfinished saves removed")


class Checkpointer:
    """Saves and restores an update rule's state (a pytree with a ``generation``) and the
    reward source's JSON state with orbax, falling back past corrupt steps. A step is the
    state's generation. With a multi-host ``layout`` every process calls every method: the
    state (the same on every process) is written once, as global arrays on the layout's
    mesh, and each process restores its own copy."""

    def __init__(self, directory: str, max_to_keep: int = 3,
                 layout: sharding.Layout | None = None):
        options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True,
                                               enable_async_checkpointing=False)
        self.directory = os.path.abspath(directory)
        self._layout = layout
        remove_unfinished_saves(self.directory)
        with _orbax_errors_silenced():  # a damaged step's metadata is reported on restore
            self._manager = ocp.CheckpointManager(self.directory, options=options)

    def save(self, state: Any, source_state: dict | None = None) -> None:
        """Writes ``state`` (and the source's state) as step ``state.generation``; on
        several processes, first checks that every process holds the same state
        (AssertionError naming the generation if not)."""
        step = int(state.generation)
        checksum = state_checksum(state)
        if jax.process_count() > 1:
            multihost_utils.assert_equal(  # As bytes: JAX would narrow a uint32 to int32.
                np.frombuffer(checksum.to_bytes(4, "little"), np.uint8),
                f"processes hold different states at generation {step}")
        meta = {"step": step, "generation": step, "checksum": checksum,
                "source": source_state or {}, "time": time.time()}
        self._manager.save(step, args=ocp.args.Composite(
            state=ocp.args.StandardSave(self._global(state)), meta=ocp.args.JsonSave(meta)))
        self._manager.wait_until_finished()

    def restore_latest(self, template: Any, quarantine_dir: str | None = None,
                       max_step: int | None = None) -> tuple[Any, dict] | None:
        """(state, source state) of the newest checkpoint at or before ``max_step`` that
        restores and passes its checksum, else None.

        Args:
          template: a state with the run's structure, shapes, dtypes and shardings.
          quarantine_dir: if given, corrupt steps (with a warning each) and steps after
            ``max_step`` are moved there (so the run can save those steps again);
            otherwise they are left.
          max_step: the newest step the caller can use (e.g. the generations its history
            holds); None for no limit.
        """
        for step in sorted(self._manager.all_steps(), reverse=True):
            if max_step is None or step <= max_step:
                try:
                    with _orbax_errors_silenced():
                        return self.restore(step, template)
                except Exception as error:  # pylint: disable=broad-except
                    logging.warning("checkpoint at step %d in %s is unusable (%s: %s); "
                                    "falling back to the previous one", step, self.directory,
                                    type(error).__name__, error)
            if quarantine_dir is not None:
                self._quarantine(step, quarantine_dir)
        return None

    def steps(self) -> list[int]:
        """The saved steps, oldest first."""
        return sorted(self._manager.all_steps())

    def restore(self, step: int, template: Any) -> tuple[Any, dict]:
        """(state, source state) saved as ``step``, checked against the checksum.

        Raises:
          FileNotFoundError: if there is no such step.
          ValueError (or orbax's error): if the step is unreadable or fails its checks.
        """
        if step not in self._manager.all_steps():
            raise FileNotFoundError(f"no checkpoint of step {step} in {self.directory}")
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, self._global(template))
        restored = self._manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()))
        state, meta = restored.state, restored.meta
        if self._layout is not None:
            state = self._layout.to_local(state)
        if meta["generation"] != step or int(state.generation) != step:
            raise ValueError(f"step {step} holds generation {int(state.generation)}, "
                             f"recorded as generation {meta['generation']}")
        if state_checksum(state) != meta["checksum"]:
            raise ValueError(f"checksum mismatch in step {step}")
        return state, meta.get("source", {})

    def _global(self, state: Any) -> Any:
        return state if self._layout is None else self._layout.to_global(state)

    def _quarantine(self, step: int, quarantine_dir: str) -> None:
        os.makedirs(quarantine_dir, exist_ok=True)
        target = tempfile.mkdtemp(prefix=f"{step}-", dir=quarantine_dir)
        shutil.move(os.path.join(self.directory, str(step)), target)
        logging.info("moved checkpoint step %d to %s", step, target)
        with _orbax_errors_silenced():
            self._manager.reload()

    def close(self) -> None:
        self._manager.close()


def restore_workdir_state(files: RunFiles, config: TrainConfig, params: Any) -> Any:
    """The newest usable update-rule state checkpointed in a workdir (None if none).

    Args:
      files: the workdir's files.
      config: the run's config (gives the state's structure).
      params: the model's initial parameters (shapes and dtypes of the template).
    """
    template = rules.make(config).init(params)
    checkpointer = Checkpointer(files.checkpoints)
    try:
        restored = checkpointer.restore_latest(template)
    finally:
        checkpointer.close()
    return None if restored is None else restored[0]


def trim_run_files(files: RunFiles, start: int) -> None:
    """Brings metrics, trajectories, TensorBoard events and reports back to ``start``
    completed generations (evaluations after ``start`` generations or more go)."""
    for report in (files.reward_curve, files.summary_json, files.summary_markdown):
        if os.path.exists(report):
            os.remove(report)
    for path in glob.glob(os.path.join(files.trajectories, "*.jsonl")):
        match = _TRAJECTORY_FILE.search(path)
        if match and int(match.group(2)) >= start:
            os.remove(path)
    metrics.trim_metrics(files.metrics, start)
    if start == 0:
        shutil.rmtree(files.tensorboard, ignore_errors=True)


def _aside(steps: list[int]) -> str:
    return f" (checkpoints {steps} set aside)" if steps else ""


def resume(files: RunFiles, config: TrainConfig, rule: rules.Rule, source: Any,
           checkpointer: Checkpointer, initial: Any, primary: bool = True
           ) -> tuple[Any, rules.base.HistoryRecorder | None]:
    """The state to continue a run from, and its history recorder (None if the rule keeps
    no history, or on processes that do not write).

    The run continues from the newest state that the history and the checkpoints both
    support: the newest usable checkpoint at or before the history's last intact
    generation; else, for reward sources without state of their own, a replay of the
    intact history from the initial parameters; else the start. Checkpoints newer than
    that state and damaged ones are set aside in ``corrupt_checkpoints/``, the history is
    cut back to it, and every other file is trimmed to it (``trim_run_files``). Each fault
    gets one warning.

    Args:
      files: the workdir's files.
      config: the run's config (written into a new history).
      rule: the update rule (``rules.make``).
      source: the reward source; its state is restored from the checkpoint.
      checkpointer: the run's checkpoints.
      initial: the rule's initial state (also the restore template).
      primary: whether this process writes (sets checkpoints aside, trims files, writes
        the history); the others only read, and every process waits for every other to
        have read before anything is trimmed.
    """
    history = rule.history(files.history)
    header, records, damage = history.read() if history else (None, [], None)
    max_step = len(records) if history else None
    newer = [step for step in checkpointer.steps() if max_step is not None and step > max_step]
    if damage is not None:
        logging.warning("%s; resuming at or before it%s", damage, _aside(newer))
    elif newer and header is None:
        logging.warning("the run history %s is missing; restarting%s", files.history,
                        _aside(newer))
    elif newer:
        logging.warning("the run history %s holds %d generations, fewer than the newest "
                        "checkpoint%s", files.history, len(records), _aside(newer))
    candidates = len(checkpointer.steps()) - len(newer)  # each unusable one is warned of
    restored = checkpointer.restore_latest(
        initial, quarantine_dir=files.corrupt_checkpoints if primary else None,
        max_step=max_step)
    state = initial
    if restored is not None:
        state, source_state = restored
        source.restore(source_state)
    elif records and source.state() == {}:
        (logging.info if candidates or damage or newer else logging.warning)(
            "no usable checkpoint at or before generation %d; replaying the history",
            len(records))
        state = history.replay(initial, header, records)
    else:
        source.restore(source.state())
    if int(state.generation) < len(records):
        logging.info("redoing generations %d to %d, which the history records after the "
                     "newest usable checkpoint", int(state.generation), len(records) - 1)
    start = int(state.generation)
    sharding.sync("resume: every process has read the run")
    if not primary:
        return state, None
    trim_run_files(files, start)
    if history is None:
        return state, None
    return state, history.recorder(header if start else None, records[:start],
                                   config.to_dict())
