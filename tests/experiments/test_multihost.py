"""Pods on one CPU: a mesh run equals the plain run; 2 processes (jax.distributed with CPU
collectives on 127.0.0.1) equal 1 process, run from the start until kill -9 of the whole job
and then rerun to the end (the slicing of rows over processes does not depend on their
number).

Runs use the digits environment (rewards that vary); the launcher runs in subprocesses
that cache every program they compile in the session's persistent compilation cache (later
runs load them); each process sees the 8 fake devices of ``tests/conftest.py``.
"""

import os
import signal
import socket
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

GENERATIONS = 6
FLAGS = [f"--config.run.generations={GENERATIONS}", "--config.run.checkpoint_every=2"]
CONFIG = digits_env.TINY.replace(run=dict(generations=GENERATIONS, checkpoint_every=2))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(env, workdir, log_path, *flags):
    return subprocess.Popen(
        [sys.executable, os.path.join(HERE, "digits_launcher.py"),
         f"--config={os.path.join(HERE, 'digits_config.py')}", *FLAGS, *flags,
         f"--workdir={workdir}"], cwd=REPO, env=env, stdout=open(log_path, "w"),
        stderr=subprocess.STDOUT)


def launch_processes(env, workdir, logs, count):
    """The same command as ``count`` processes of one job."""
    coordinator = f"127.0.0.1:{free_port()}"
    return [launch(env, workdir, f"{logs}-{p}.log",
                   f"--config.distributed.num_processes={count}",
                   f"--config.distributed.process_id={p}",
                   f"--config.distributed.coordinator={coordinator}") for p in range(count)]


def finish(processes, logs):
    for p, process in enumerate(processes):
        assert process.wait(timeout=300) == 0, open(f"{logs}-{p}.log").read()[-3000:]


def assert_only_process_0_reports(logs):
    assert "| mean reward |" in open(f"{logs}-0.log").read()
    assert "| mean reward |" not in open(f"{logs}-1.log").read()


def generations_logged(workdir):
    path = os.path.join(workdir, "metrics.jsonl")
    return (sum(r["kind"] == "train" for r in metrics.read_metrics(path))
            if os.path.exists(path) else 0)


def final_state(workdir):
    return checkpoint.restore_workdir_state(training.RunFiles(workdir), CONFIG,
                                            models.load("tiny").params)


def records(workdir):
    """History and metrics records without timings (seconds), and every trajectory file."""
    _, generations = es.history.read(os.path.join(workdir, "history.jsonl"))
    logged = metrics.read_metrics(os.path.join(workdir, "metrics.jsonl"))
    folder = os.path.join(workdir, "trajectories")
    files = {name: open(os.path.join(folder, name)).read() for name in os.listdir(folder)}
    return [{k: v for k, v in r.items() if k != "wall_time" and not k.endswith("_s")}
            for r in generations + logged], files


def assert_same_run(workdir, reference):
    final, expected = final_state(workdir), final_state(reference)
    assert int(final.generation) == GENERATIONS
    for a, b in zip(jax.tree.leaves(final), jax.tree.leaves(expected), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert records(workdir) == records(reference)


@pytest.fixture(scope="module")
def reference(tmp_path_factory, fast_compile_env):
    """The one-process run."""
    folder = tmp_path_factory.mktemp("multihost")
    logs = str(folder / "reference")
    finish([launch(fast_compile_env, folder / "reference", f"{logs}-0.log")], logs)
    rewards = [r["rewards"] for r in es.history.read(folder / "reference" / "history.jsonl")[1]]
    assert len(set(map(tuple, rewards))) > 1  # The rewards vary: the comparison means something.
    return folder / "reference"


def test_kill_9_of_both_processes_then_the_same_command_resumes_bitwise(reference, tmp_path,
                                                                       fast_compile_env):
    killed, logs = tmp_path / "killed", str(tmp_path / "first")
    processes = launch_processes(fast_compile_env, killed, logs, 2)
    while generations_logged(killed) < 3:  # A checkpoint after 2, the history at 3.
        assert all(p.poll() is None for p in processes), open(f"{logs}-0.log").read()[-3000:]
        time.sleep(0.02)
    for process in processes:
        process.send_signal(signal.SIGKILL)
    assert [p.wait() for p in processes] == [-signal.SIGKILL] * 2
    logs = str(tmp_path / "second")
    finish(launch_processes(fast_compile_env, killed, logs, 2), logs)
    assert "resuming" in open(f"{logs}-0.log").read()
    assert_same_run(killed, reference)
    assert_only_process_0_reports(logs)


def test_a_mesh_run_writes_the_same_history_as_a_plain_run(reference, tmp_path):
    result = training.train(CONFIG.replace(mesh=dict(shape="data:4,model:2")), tmp_path)
    expected = [r["rewards"] for r in es.history.read(reference / "history.jsonl")[1]]
    assert [r["rewards"] for r in es.history.read(tmp_path / "history.jsonl")[1]] == expected
    kernel = result.state.params["layers"]["mlp"]["down_proj"]["kernel"]
    # The fsdp preset (L, in/2, out) on each of the 8 devices, kept through every tell.
    assert [shard.data.shape for shard in kernel.addressable_shards] == [(2, 64, 64)] * 8
    for a, b in zip(jax.tree.leaves(result.state.params),
                    jax.tree.leaves(final_state(reference).params), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-7)
