"""Python code in the sandbox: ``run_python(entry, payload, **limits) -> RunResult``.

The child imports ``entry`` (``"package.module:function"``) and calls it on the
unpickled ``payload`` while still trusted (before the privilege drop and the audit hook),
so it may import modules and load data; it returns the call to sandbox, a function of no
arguments that runs the untrusted code. That call's return value must be JSON and comes
back as ``RunResult.value``.

A run fails, with a reason, on: an exception in the call (``SystemExit`` included), any
action the sandbox blocks, a timeout, exceeding the CPU, memory or output limits, dying
without a result, a process that outlives the run (as root) or a failed set-up. The
temporary directory (job files and the code's working directory) is removed afterwards.
"""

import dataclasses
import os
import pickle
import secrets
import shutil
import subprocess
import sys
import time
from typing import Any

from agentic_esopt.sandbox import _child, process

_TAIL_BYTES = 4096


@dataclasses.dataclass(frozen=True)
class RunResult:
    """Outcome of one sandboxed call.

    Attributes:
      value: what the call returned (after a JSON round trip) when it succeeded, else None.
      error: why the run failed, else None.
      stdout_tail: the last few KiB of its stdout+stderr.
      wall_s: wall-clock seconds from start to reaping.
    """

    value: Any
    error: str | None
    stdout_tail: str
    wall_s: float


def run_python(entry: str, payload: Any, *, timeout_s: float = 10.0,
               memory_mb: int = 1024, cpu_s: float | None = None,
               max_output_bytes: int = 1 << 20, max_file_mb: int = 16,
               max_processes: int = 4, max_open_files: int = 64,
               prefix: str = "sandbox_") -> RunResult:
    """Makes the call ``entry(payload)`` returns, in a sandbox child.

    Args:
      entry: ``"package.module:function"`` importable from this ``sys.path``; called on
        `payload` in the child before it is locked down, it returns the call to sandbox.
      payload: anything picklable.
      timeout_s: wall-clock limit; the whole process group is killed after it.
      memory_mb: address-space limit (RLIMIT_AS).
      cpu_s: CPU-time limit (RLIMIT_CPU); defaults to `timeout_s`.
      max_output_bytes: stdout+stderr cap; the run fails and is killed beyond it.
      max_file_mb: largest file the code may write (RLIMIT_FSIZE).
      max_processes: RLIMIT_NPROC (threads count too). It binds per run when the
        caller is root (each run gets its own uid); otherwise it counts all of the
        caller's processes, which usually means the code cannot fork at all.
      max_open_files: RLIMIT_NOFILE.
      prefix: the name prefix of the run's temporary directory.

    Returns:
      The `RunResult`. Failures of the sandboxed code never raise; bad arguments do (a
      bad `entry` raises its ImportError or AttributeError here, in the caller).
    """
    limits = process.child_limits(timeout_s, cpu_s, memory_mb, max_output_bytes,
                                  max_file_mb, max_processes, max_open_files)
    _child.resolve(entry)
    uid = process.new_uid()
    nonce = secrets.token_hex(16)
    root, workdir = process.make_root(prefix, uid)
    try:
        payload_path = os.path.join(root, "payload.pkl")
        process.write_private(payload_path, pickle.dumps(payload, pickle.HIGHEST_PROTOCOL))
        job_path = os.path.join(root, "job.json")
        process.write_job(job_path, dict(
            entry=entry, payload=payload_path, uid=uid, nonce=nonce, workdir=workdir,
            sys_path=[os.path.abspath(path) for path in sys.path], limits=limits))
        return _supervise(job_path, workdir, uid, nonce, timeout_s, max_output_bytes)
    finally:
        if uid is not None:
            process.remove_files_of(uid)
        shutil.rmtree(root, ignore_errors=True)


def _supervise(job_path, workdir, uid, nonce, timeout_s, max_output_bytes):
    """Starts the child, watches it until exit/timeout/overflow, kills and reaps."""
    start = time.monotonic()
    proc, result_read = process.start_child(job_path, workdir, process.child_env(workdir),
                                            subprocess.STDOUT)
    output = process.Stream(0, _TAIL_BYTES)
    capture = process.Capture({proc.stdout.fileno(): output}, result_read, max_output_bytes)
    try:
        returncode, timed_out, num_strays = process.watch(proc, capture, uid, timeout_s)
    finally:
        proc.stdout.close()
        os.close(result_read)
    report = process.parse_report(capture.result, nonce)
    error = _failure(report, returncode, capture, timed_out, timeout_s, max_output_bytes,
                     num_strays)
    return RunResult(None if error else report.get("value"), error,
                     output.tail.decode("utf-8", errors="replace"),
                     time.monotonic() - start)


def _failure(report, returncode, capture, timed_out, timeout_s, max_output_bytes,
             num_strays):
    """Why the run failed, from everything observed about it, or None."""
    if capture.overflowed:
        return f"output exceeded {max_output_bytes} bytes"
    if num_strays:
        return f"started {num_strays} process(es) that outlived the check"
    if report is None:
        if timed_out:
            return f"timed out after {timeout_s:g} s (wall clock)"
        return f"no result: {process.exit_reason(returncode)}"
    return None if report.get("error") is None else str(report["error"])
