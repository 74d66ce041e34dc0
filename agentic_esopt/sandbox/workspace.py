"""Shell commands in the sandbox: a `Workspace` whose directory a series of them share.

Each command runs through the same child and the same supervision as `run_python`, with
stdout and stderr captured separately; everything the workspace's uid left is removed on
`close`.
"""

import dataclasses
import os
import secrets
import shutil
import subprocess
import time
import weakref
from typing import Any

from agentic_esopt.sandbox import process

_COMMAND_HEAD_BYTES = 1 << 14  # per stream, kept from the start and from the end
_COMMAND_TAIL_BYTES = 1 << 14
_MAX_WORKSPACE_ENTRIES = 100_000


@dataclasses.dataclass(frozen=True)
class CommandResult:
    """Outcome of one shell command run by `Workspace.run`.

    Attributes:
      stdout: what the command wrote to stdout (its first and last 16 KiB when longer,
        with a note of the bytes omitted in between).
      stderr: the same for stderr.
      exit_code: the shell's exit status, or -N when killed by signal N.
      timed_out: killed at the wall-clock limit.
      output_exceeded: killed for writing more than the output cap.
      disk_exceeded: killed because the working directory outgrew its cap; everything
        in it was deleted.
      error: why the sandbox could not run the command at all, else None.
      wall_s: wall-clock seconds from start to reaping.
    """

    stdout: str
    stderr: str
    exit_code: int
    timed_out: bool
    output_exceeded: bool
    disk_exceeded: bool
    error: str | None
    wall_s: float


class Workspace:
    """A working directory for sandboxed shell commands, shared by a series of them.

    Every command runs as ``bash -c COMMAND`` in the workspace's directory, through the
    same child as `run_python` (own process group, network namespace, resource limits,
    and when the caller is root an unprivileged uid chosen for this workspace, so the
    process limit binds per workspace). There is no audit hook: the shell is a real
    program, so what keeps it in is the uid (it can write only in its directory and the
    world-writable temporary directories, which are swept after every command), the
    limits and the kills. After each command every process of the group and of the uid is
    killed, background jobs included. Files in the directory persist between commands
    until `close`.

    Without root the command runs as the caller, which contains runaway processes, time,
    memory and output, but not writes elsewhere or signals to the caller's processes;
    and the process limit then counts all of the caller's processes.

    ``python`` is on PATH as an alias of the system ``python3`` (as small models type it).
    """

    def __init__(self, prefix: str = "sandbox_ws_"):
        self.uid = process.new_uid()
        self._root, self.path = process.make_root(prefix, self.uid)
        self.closed = False
        try:
            self._bin = os.path.join(self._root, "bin")
            os.mkdir(self._bin, 0o755)
            python3 = shutil.which("python3", path=os.defpath)
            if python3 is not None:
                os.symlink(python3, os.path.join(self._bin, "python"))
        except BaseException:
            shutil.rmtree(self._root, ignore_errors=True)
            raise
        # Removes everything even when close() is never called (garbage collection, exit).
        self._finalizer = weakref.finalize(self, _close_workspace, self._root, self.uid)

    def run(self, command: str, *, timeout_s: float = 20.0, memory_mb: int = 1024,
            cpu_s: float | None = None, max_output_bytes: int = 1 << 20,
            max_file_mb: int = 16, max_processes: int = 32, max_open_files: int = 64,
            max_disk_mb: int = 256, shell: str = "/bin/bash") -> CommandResult:
        """Runs ``shell -c command`` in the workspace.

        Args:
          command: the command line.
          timeout_s: wall-clock limit; the group and the uid's processes are killed after.
          memory_mb: address-space limit per process (RLIMIT_AS).
          cpu_s: CPU-time limit per process (RLIMIT_CPU); defaults to `timeout_s`.
          max_output_bytes: stdout+stderr cap; the command is killed beyond it.
          max_file_mb: largest file a process may write (RLIMIT_FSIZE).
          max_processes: RLIMIT_NPROC (per workspace when the caller is root).
          max_open_files: RLIMIT_NOFILE.
          max_disk_mb: cap on the size of the working directory plus what the uid
            wrote in the shared temporary directories, checked while the command runs
            (every 0.2 s) and after it: beyond it the command is killed and the
            directory emptied (the temporary files go after every command anyway).
          shell: the shell that runs the command.

        Returns:
          The `CommandResult`. Whatever the command does, this never raises; bad
          arguments, a closed workspace or a command that is not a str do.
        """
        if self.closed:
            raise RuntimeError("the workspace is closed")
        if not isinstance(command, str):
            raise TypeError(f"command must be a str, got {type(command).__name__}")
        limits = process.child_limits(timeout_s, cpu_s, memory_mb, max_output_bytes,
                                      max_file_mb, max_processes, max_open_files)
        if not max_disk_mb > 0:
            raise ValueError(f"max_disk_mb must be positive, got {max_disk_mb!r}")
        nonce = secrets.token_hex(16)
        job_path = os.path.join(self._root, f"job_{nonce}.json")
        process.write_job(job_path, dict(command=command, shell=shell, uid=self.uid,
                                         nonce=nonce, workdir=self.path, limits=limits))
        try:
            return self._supervise(job_path, nonce, timeout_s, max_output_bytes,
                                   max_disk_mb << 20)
        finally:
            os.unlink(job_path)
            if self.uid is not None:
                process.remove_files_of(self.uid)

    def _disk_usage_exceeds(self, max_bytes):
        """Whether the working directory and what the uid made at the top of the shared
        temporary directories hold more than `max_bytes` (or too many files)."""
        tops = [self.path]
        if self.uid is not None:
            for directory in process.SHARED_TEMP_DIRS:
                try:
                    tops += [e.path for e in os.scandir(directory)
                             if e.stat(follow_symlinks=False).st_uid == self.uid]
                except OSError:
                    continue
        total, entries = 0, 0
        for top in tops:
            try:
                total += os.lstat(top).st_blocks * 512
            except OSError:
                continue
            for root, dirs, files in os.walk(top):
                for name in dirs + files:
                    entries += 1
                    try:
                        total += os.lstat(os.path.join(root, name)).st_blocks * 512
                    except OSError:
                        continue
                if total > max_bytes or entries > _MAX_WORKSPACE_ENTRIES:
                    return True
        return total > max_bytes

    def _empty(self):
        for entry in os.scandir(self.path):
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, ignore_errors=True)
            else:
                try:
                    os.unlink(entry.path)
                except OSError:
                    pass

    def _supervise(self, job_path, nonce, timeout_s, max_output_bytes, max_disk_bytes):
        env = process.child_env(self.path)
        env["PATH"] = f"{self._bin}:{os.defpath}"
        start = time.monotonic()
        proc, result_read = process.start_child(job_path, self.path, env, subprocess.PIPE)
        out, err = (process.Stream(_COMMAND_HEAD_BYTES, _COMMAND_TAIL_BYTES)
                    for _ in range(2))
        capture = process.Capture({proc.stdout.fileno(): out, proc.stderr.fileno(): err},
                                  result_read, max_output_bytes)
        full = [False]

        def disk_full():
            full[0] = self._disk_usage_exceeds(max_disk_bytes)
            return full[0]

        try:
            returncode, timed_out, _ = process.watch(proc, capture, self.uid, timeout_s,
                                                     wait_for_exit=True, check=disk_full)
        finally:
            proc.stdout.close()
            proc.stderr.close()
            os.close(result_read)
        if full[0] or self._disk_usage_exceeds(max_disk_bytes):
            full[0] = True
            self._empty()
        report = process.parse_report(capture.result, nonce)
        error = None if report is None else f"sandbox setup failed: {report.get('error')}"
        return CommandResult(stdout=out.text(), stderr=err.text(), exit_code=returncode,
                             timed_out=timed_out, output_exceeded=capture.overflowed,
                             disk_exceeded=full[0], error=error,
                             wall_s=time.monotonic() - start)

    def close(self) -> None:
        """Kills what is left of the uid's processes and removes every file (idempotent)."""
        self.closed = True
        self._finalizer()

    def __enter__(self) -> "Workspace":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()


def _close_workspace(root, uid):
    if uid is not None:
        process.kill_everything(None, uid)
        process.remove_files_of(uid)
    shutil.rmtree(root, ignore_errors=True)


def run_command(command: str, **limits: Any) -> CommandResult:
    """`Workspace.run` in a fresh workspace that is removed afterwards."""
    with Workspace() as workspace:
        return workspace.run(command, **limits)
