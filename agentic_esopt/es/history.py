"""Append-only run history and exact replay.

The history is a JSON-lines file: a header (strategy spec, run key) and one record per
generation (σ, α, member keys and signs, the rewards ``tell`` got, shaped weights, update norm, wall
time). Every line carries a CRC32 of its content, and every write replaces the whole file
atomically (temp file + ``os.replace``), so a crash leaves either the old or the new file.

Because members' noise is a function of (run key, generation, member, leaf), the rewards
alone determine the run: ``replay(params, path)`` rebuilds the final parameters bitwise,
without a single rollout.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import zlib
from typing import Any, Iterator

import jax
import jax.numpy as jnp
import numpy as np

from agentic_esopt import fileio
from agentic_esopt.es import strategies
from agentic_esopt.es import strategy as strategy_lib

PyTree = Any
FORMAT_VERSION = 1


class HistoryError(ValueError):
    """A history that cannot be read past some point.

    Attributes:
      last_good_generation: index of the last intact generation record, or -1 if none.
      header: the header, if it was intact.
      records: the intact generation records before the damage.
    """

    def __init__(self, message: str, last_good_generation: int,
                 header: dict | None, records: list[dict]):
        super().__init__(message)
        self.last_good_generation = last_good_generation
        self.header = header
        self.records = records


def _encode(record: dict) -> str:
    body = json.dumps(record, sort_keys=True, separators=(",", ":"))
    return json.dumps({"crc": zlib.crc32(body.encode()), "record": record},
                      sort_keys=True, separators=(",", ":")) + "\n"


def _decode(line: str) -> dict:
    wrapped = json.loads(line)
    record = wrapped["record"]
    body = json.dumps(record, sort_keys=True, separators=(",", ":"))
    if zlib.crc32(body.encode()) != wrapped["crc"]:
        raise ValueError("checksum mismatch")
    return record


def read_intact(path: str) -> tuple[dict | None, list[dict], HistoryError | None]:
    """(header, the intact generation records, the damage or None) of a history; a missing
    file reads as no header, no records and no damage."""
    if not os.path.exists(path):
        return None, [], None
    try:
        header, records = read(path)
    except HistoryError as error:
        return error.header, error.records, error
    return header, records, None


def read(path: str) -> tuple[dict, list[dict]]:
    """Reads a history: (header, generation records), or raises ``HistoryError``."""
    with open(path) as f:
        text = f.read()
    lines = text.split("\n")
    complete, tail = lines[:-1], lines[-1]  # A well-formed file ends with "\n".
    header, records = None, []

    def fail(reason: str):
        last = records[-1]["generation"] if records else -1
        raise HistoryError(f"history {path} is damaged ({reason}); the last good "
                           f"generation is {last}", last, header, records)

    for number, line in enumerate(complete):
        try:
            record = _decode(line)
        except (ValueError, KeyError, TypeError) as e:
            fail(f"line {number + 1} is corrupt: {e}")
        if number == 0:
            if record.get("type") != "header":
                fail("the first line is not a header")
            header = record
        elif record.get("type") != "generation" or record["generation"] != len(records):
            fail(f"line {number + 1} is not generation {len(records)}")
        else:
            records.append(record)
    if tail:
        fail("the last line is truncated")
    if header is None:
        fail("no header")
    return header, records


class HistoryWriter:
    """Appends generation records to a history file, atomically."""

    def __init__(self, path: str, header: dict, records: list[dict]):
        self.path = path
        self.header = header
        self.records = list(records)

    @classmethod
    def create(cls, path: str, strategy_spec: dict, run_key: jax.Array,
               **extra: Any) -> "HistoryWriter":
        """Starts a new history (overwriting any file at ``path``)."""
        header = dict(type="header", version=FORMAT_VERSION, strategy=strategy_spec,
                      run_key=[int(k) for k in np.asarray(run_key)], **extra)
        writer = cls(path, header, [])
        writer._flush()
        return writer

    @classmethod
    def resume(cls, path: str, header: dict, records: list[dict]) -> "HistoryWriter":
        """Rewrites the history as ``header`` and ``records`` (the intact ones a resumed run
        keeps) and continues it."""
        writer = cls(path, header, records)
        writer._flush()
        return writer

    def append(self, population, rewards, metrics: dict, wall_time: float,
               **extra: Any) -> None:
        """Records one generation (``population`` and ``metrics`` from ask / tell)."""
        record = dict(
            type="generation", generation=len(self.records),
            sigma=float(metrics["sigma"]), learning_rate=float(metrics["learning_rate"]),
            keys=np.asarray(population.keys).tolist(),
            signs=np.asarray(population.signs).tolist(),
            rewards=[float(r) for r in np.asarray(rewards, np.float32)],
            weights=[float(w) for w in np.asarray(metrics["weights"])],
            update_norm=float(metrics["update_norm"]), wall_time=float(wall_time), **extra)
        if int(population.generation) != record["generation"]:
            raise ValueError(f"population is generation {int(population.generation)} but "
                             f"the history expects {record['generation']}")
        self.records.append(record)
        self._flush()

    def _flush(self) -> None:
        fileio.atomic_write_text(self.path, "".join(_encode(r) for r in [self.header, *self.records]))


def replay_state(params: PyTree, path: str, strategy: strategy_lib.Strategy | None = None,
                 strict: bool = True, generations: int | None = None) -> strategy_lib.ESState:
    """Re-applies the recorded generations to ``params``; returns the final ES state.

    Args:
      params: the initial parameters of the run.
      path: the history file.
      strategy: the run's strategy; rebuilt from the header when None (runs with a custom
        optax optimizer must pass it).
      strict: if False, a damaged history replays up to its last good generation (with a
        warning) instead of raising ``HistoryError``.
      generations: replay only the first ``generations`` records (default: all).

    Raises:
      ValueError: if the history holds fewer than ``generations`` records.
    """
    try:
        header, records = read(path)
    except HistoryError as e:
        if strict or e.header is None:
            raise
        logging.warning("%s; replaying up to it", e)
        header, records = e.header, e.records
    if generations is not None:
        if generations > len(records):
            raise ValueError(f"{path} holds {len(records)} generations, not {generations}")
        records = records[:generations]
    return replay_records(params, header, records, strategy)


def replay_generations(params: PyTree, header: dict, records: list[dict],
                       strategy: strategy_lib.Strategy | None = None
                       ) -> Iterator[strategy_lib.ESState]:
    """The ES state after each of ``records`` (read from a history) in turn, starting from
    a copy of ``params``. The next generation's ``tell`` consumes each state: read what you
    need of it before advancing."""
    strategy = strategy or strategies.from_spec(header["strategy"])
    state = strategy.init(np.asarray(header["run_key"], np.uint32),
                          jax.tree.map(jnp.copy, params))
    yield state
    for record in records:
        population = strategy.ask(state)
        if not np.array_equal(np.asarray(population.keys), np.asarray(record["keys"])):
            raise ValueError(f"generation {record['generation']}: member keys differ from "
                             "the history's; wrong strategy or initial state")
        state, _ = strategy.tell(state, population, np.asarray(record["rewards"], np.float32))
        yield state


def replay_records(params: PyTree, header: dict, records: list[dict],
                   strategy: strategy_lib.Strategy | None = None) -> strategy_lib.ESState:
    """The ES state after applying ``records`` (read from a history) to a copy of
    ``params`` (``tell`` consumes its state)."""
    return collections.deque(replay_generations(params, header, records, strategy),
                             maxlen=1)[0]


def replay(params: PyTree, path: str, strategy: strategy_lib.Strategy | None = None,
           strict: bool = True, generations: int | None = None) -> PyTree:
    """The parameters of a recorded run after ``generations`` generations (default: all),
    rebuilt bitwise without any rollout."""
    return replay_state(params, path, strategy, strict, generations).params
