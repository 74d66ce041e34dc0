"""kill -9 at a random generation, rerun the same command: the run ends bitwise identical."""

import os
import random
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from agentic_esopt import es, models, training
from agentic_esopt.training import checkpoint, metrics

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(HERE, "..", "training"))
import digits_env  # pylint: disable=wrong-import-position

# 5 generations, checkpoints after 2, 4 and 5: a kill usually loses generations to redo.
CONFIG = digits_env.TINY.replace(run=dict(generations=5, checkpoint_every=2))
# Each update rule's config and its flags on top of the digits config file.
RULES = {"es": (CONFIG, []),
         "grpo": (CONFIG.replace(rule=dict(name="grpo", group_size=4, learning_rate=1e-3)),
                  ["--config.rule.name=grpo", "--config.rule.group_size=4",
                   "--config.rule.learning_rate=1e-3"])}


def command_line(workdir, rule):
    """The digits launcher on the digits config file, overridden to ``RULES[rule]``."""
    return [sys.executable, os.path.join(HERE, "digits_launcher.py"),
            f"--config={os.path.join(HERE, 'digits_config.py')}",
            "--config.run.generations=5", "--config.run.checkpoint_every=2",
            *RULES[rule][1], f"--workdir={workdir}"]


def launch(workdir, log_path, rule="es"):
    log = open(log_path, "w")
    return subprocess.Popen(command_line(workdir, rule), cwd=REPO, stdout=log,
                            stderr=subprocess.STDOUT)


def finish(process, log_path):
    assert process.wait(timeout=300) == 0, open(log_path).read()[-3000:]


def generations_recorded(workdir):
    """Training generations logged so far."""
    try:
        return sum(r["kind"] == "train"
                   for r in metrics.read_metrics(os.path.join(workdir, "metrics.jsonl")))
    except FileNotFoundError:
        return 0


def restore_final_state(workdir, config):
    return checkpoint.restore_workdir_state(training.RunFiles(workdir), config,
                                            models.load("tiny").params)


def run_records(workdir):
    """History generation records (ES) and metrics records, without timings (seconds)."""
    history = os.path.join(workdir, "history.jsonl")
    generations = es.history.read(history)[1] if os.path.exists(history) else []
    logged = metrics.read_metrics(os.path.join(workdir, "metrics.jsonl"))
    return [{k: v for k, v in r.items() if k != "wall_time" and not k.endswith("_s")}
            for r in generations + logged]


@pytest.mark.parametrize("rule", sorted(RULES))
def test_kill_and_rerun_ends_bitwise_identical(tmp_path, rule):
    # Drawn in the test, not as a parameter: parallel workers must collect the same tests.
    kill_after = random.Random().randint(1, 4)
    print(f"killing after generation {kill_after}")  # shown if the test fails
    config = RULES[rule][0]
    reference = str(tmp_path / "reference")
    finish(launch(reference, tmp_path / "reference.log", rule),
           tmp_path / "reference.log")
    assert training.checkpoint.load_config(training.RunFiles(reference)) == config

    killed = str(tmp_path / "killed")
    process = launch(killed, tmp_path / "first.log", rule)
    while generations_recorded(killed) < kill_after:
        assert process.poll() is None, open(tmp_path / "first.log").read()[-3000:]
        time.sleep(0.02)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert process.returncode == -signal.SIGKILL, "the run ended before it was killed"
    finish(launch(killed, tmp_path / "second.log", rule), tmp_path / "second.log")

    final, expected = restore_final_state(killed, config), restore_final_state(reference,
                                                                               config)
    assert int(final.generation) == 5
    for a, b in zip(jax.tree.leaves(final), jax.tree.leaves(expected), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    initial = models.load("tiny").params
    assert any(not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(initial),
                                                        jax.tree.leaves(final.params)))
    assert run_records(killed) == run_records(reference)
    trajectories = sorted(os.listdir(os.path.join(killed, "trajectories")))
    assert trajectories == sorted(os.listdir(os.path.join(reference, "trajectories")))
    for name in trajectories:
        assert open(os.path.join(killed, "trajectories", name)).read() == open(
            os.path.join(reference, "trajectories", name)).read()
