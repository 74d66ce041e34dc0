"""Resume when the run history and the checkpoints disagree: every kind of damage is
repaired with one warning per fault, no traceback, and the run ends bitwise equal."""

import json
import logging
import os
import shutil

import jax
import numpy as np
import pytest

from agentic_esopt import es, training

import digits_env

CONFIG = digits_env.TINY.replace(run=dict(eval_every=3))  # checkpoints 1, 2, 3


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("reference")
    return workdir, training.train(CONFIG, str(workdir))


def history_lines(workdir):
    return (workdir / "history.jsonl").read_text().splitlines(keepends=True)


def truncate_last_history_line(workdir):
    lines = history_lines(workdir)
    (workdir / "history.jsonl").write_text("".join(lines[:-1]) + lines[-1][:25])


def break_a_middle_checksum(workdir):
    lines = history_lines(workdir)
    record = json.loads(lines[2])  # generation 1
    record["record"]["rewards"][0] += 1.0
    lines[2] = json.dumps(record) + "\n"
    (workdir / "history.jsonl").write_text("".join(lines))


def remove_the_history(workdir):
    os.remove(workdir / "history.jsonl")


def set_aside(workdir):
    """The steps moved to corrupt_checkpoints/ (each as '<step>-<suffix>')."""
    folder = workdir / "corrupt_checkpoints"
    return sorted(int(p.name.split("-")[0]) for p in folder.iterdir()) if folder.exists() else []


def garble(step_dir):
    for root, _, names in os.walk(step_dir):
        for name in names:
            with open(os.path.join(root, name), "wb") as f:
                f.write(b"not a checkpoint")


def corrupt_the_newest_checkpoint(workdir):
    garble(workdir / "checkpoints" / "3")


def flip_a_byte_in_the_newest_checkpoint(workdir):
    paths = [os.path.join(root, n) for root, _, names in os.walk(workdir / "checkpoints" / "3")
             for n in names]
    largest = max(paths, key=os.path.getsize)
    data = bytearray(open(largest, "rb").read())
    data[len(data) // 2] ^= 0xFF
    open(largest, "wb").write(bytes(data))


def corrupt_every_checkpoint(workdir):
    for step in ("1", "2", "3"):
        garble(workdir / "checkpoints" / step)


def drop_the_last_history_generation(workdir):
    """A well-formed history one generation behind the newest checkpoint."""
    (workdir / "history.jsonl").write_text("".join(history_lines(workdir)[:-1]))


def remove_the_newer_checkpoints(workdir):
    """The history is ahead of every checkpoint."""
    for step in ("2", "3"):
        shutil.rmtree(workdir / "checkpoints" / step)


def remove_every_checkpoint(workdir):
    shutil.rmtree(workdir / "checkpoints")


DAMAGES = [  # (damage, warnings it must cause, checkpoint steps it must set aside)
    (truncate_last_history_line, 1, [3]),
    (break_a_middle_checksum, 1, [2, 3]),  # generation 0 stays intact
    (remove_the_history, 1, [1, 2, 3]),
    (corrupt_the_newest_checkpoint, 1, [3]),
    (flip_a_byte_in_the_newest_checkpoint, 1, [3]),
    (corrupt_every_checkpoint, 3, [1, 2, 3]),
    (drop_the_last_history_generation, 1, [3]),
    (remove_the_newer_checkpoints, 0, []),
    (remove_every_checkpoint, 1, []),
]


@pytest.mark.parametrize("damage, warnings, aside", DAMAGES,
                         ids=[d.__name__ for d, _, _ in DAMAGES])
def test_rerun_repairs_the_damage_and_ends_bitwise_equal(reference, tmp_path, caplog, capfd,
                                                         damage, warnings, aside):
    original, expected = reference
    workdir = shutil.copytree(original, tmp_path / "damaged")
    damage(workdir)
    capfd.readouterr()
    with caplog.at_level(logging.INFO):
        result = training.train(CONFIG, str(workdir))
    for a, b in zip(jax.tree.leaves(result.state), jax.tree.leaves(expected.state),
                    strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    _, want = es.history.read(original / "history.jsonl")
    _, got = es.history.read(workdir / "history.jsonl")
    assert [r["rewards"] for r in got] == [r["rewards"] for r in want]
    assert set_aside(workdir) == aside
    assert len(got) == 3
    ours = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(ours) == warnings, [r.getMessage() for r in ours]
    output = capfd.readouterr()
    assert "Traceback" not in output.err + output.out + caplog.text
