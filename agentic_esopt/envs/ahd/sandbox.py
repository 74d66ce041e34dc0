"""Runs LLM-written heuristics in a separate, limited, network-less process group.

`run_candidate` writes a job into a private temporary directory and starts
``_sandbox_child.py`` (see its docstring for what happens inside) with its own process
group, stdin closed and stdout+stderr captured through a pipe. The parent enforces:

* a wall-clock timeout, after which the whole process group is SIGKILLed;
* an output cap: reading stops and the group is killed once it is exceeded;
* cleanup: the process group is killed and reaped even after a normal exit. When the
  parent is root, every run gets its own random unprivileged uid, so RLIMIT_NPROC
  counts only that run's processes, and afterwards the parent also kills every
  process of that uid (even ones that left the group; their existence fails the
  candidate) and deletes anything that uid created at the top of the world-writable
  temporary directories;
* the temporary directory (job file and the candidate's working directory) is removed.

A candidate fails, with a reason, on: syntax errors, a missing function, exceptions
(including ``SystemExit`` and the task's ``InvalidHeuristicOutput``), a non-finite or
non-numeric objective, any action the sandbox blocks, a timeout, exceeding the CPU,
memory or output limits, or dying without a result.

`Workspace` runs shell commands (an agent's tool calls) through the same child and the
same supervision: a working directory that a series of commands share, stdout and
stderr captured separately, and everything the uid left removed on `close`.
"""

import concurrent.futures
import dataclasses
import json
import os
import pickle
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import weakref
from typing import Any, Mapping, NamedTuple, Sequence

from agentic_esopt.envs.ahd import _sandbox_child

_CHILD_SCRIPT = _sandbox_child.__file__
_READ_CHUNK = 1 << 16
_TAIL_BYTES = 4096
_MAX_RESULT_BYTES = 1 << 16
_POLL_S = 0.05
_EXIT_POLL_S = 0.002
_CHECK_S = 0.2
_KILL_ROUNDS = 50
_SANDBOX_UIDS = (1 << 20, 1 << 30)  # [low, high): far from any real account
_SHARED_TEMP_DIRS = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")
_CHILD_ENV_THREADS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
                      "NUMEXPR_NUM_THREADS")


class InstanceSpec(NamedTuple):
    """Instances generated inside the child by ``task.generate_instances(size, n, seed)``."""

    size: int
    n: int
    seed: int


@dataclasses.dataclass(frozen=True)
class Result:
    """Outcome of one candidate.

    Attributes:
      valid: whether the candidate produced a finite objective without violations.
      objective: the task's objective (mean over instances) when valid, else None.
      error: why the candidate failed, else None.
      stdout_tail: the last few KiB of its stdout+stderr.
      wall_s: wall-clock seconds from start to reaping.
    """

    valid: bool
    objective: float | None
    error: str | None
    stdout_tail: str
    wall_s: float


def _check_limits(timeout_s, cpu_s, memory_mb, max_output_bytes, max_file_mb,
                  max_processes, max_open_files):
    positive = dict(timeout_s=timeout_s, cpu_s=cpu_s, memory_mb=memory_mb,
                    max_output_bytes=max_output_bytes, max_processes=max_processes)
    for name, value in positive.items():
        if not value > 0:
            raise ValueError(f"{name} must be positive, got {value!r}")
    if max_file_mb < 0:
        raise ValueError(f"max_file_mb must be non-negative, got {max_file_mb!r}")
    if max_open_files < 16:
        raise ValueError(f"max_open_files must be at least 16, got {max_open_files!r}")


def _check_call(source, function_name, task_name):
    if not isinstance(source, str):
        raise TypeError(f"source must be a str, got {type(source).__name__}")
    if not (isinstance(function_name, str) and function_name.isidentifier()):
        raise ValueError(f"function_name must be a Python identifier, got {function_name!r}")
    _sandbox_child.resolve_task(task_name)  # fails fast, in the caller, on a bad name


def _write_job(job_dir, job, instances_spec, evaluate_options):
    """Writes the job and its pickled payload (root-only when running as root)."""
    if isinstance(instances_spec, InstanceSpec):
        payload = {"generate": tuple(instances_spec)}
    else:
        payload = {"instances": instances_spec}
    payload["options"] = dict(evaluate_options or {})
    job["payload"] = os.path.join(job_dir, "payload.pkl")
    _write_private(job["payload"], pickle.dumps(payload, pickle.HIGHEST_PROTOCOL))
    job_path = os.path.join(job_dir, "job.json")
    _write_private(job_path, json.dumps(job).encode("utf-8"))
    return job_path


def _write_private(path, data):
    """Creates `path` readable by its owner only (the candidate must not see the job)."""
    with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as file:
        file.write(data)


def _child_env(workdir):
    env = {"PATH": os.defpath, "HOME": workdir, "TMPDIR": workdir, "LANG": "C.UTF-8",
           "JAX_PLATFORMS": "cpu"}  # should a task import jax, it never touches a GPU
    env.update({name: "1" for name in _CHILD_ENV_THREADS})
    return env


class _Stream:
    """One captured output stream: its first and last bytes and how many there were."""

    def __init__(self, head_bytes, tail_bytes):
        self.head = b""
        self.tail = b""
        self.total = 0
        self._head_bytes = head_bytes
        self._tail_bytes = tail_bytes

    def add(self, chunk):
        self.total += len(chunk)
        room = self._head_bytes - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk and self._tail_bytes:
            self.tail = (self.tail + chunk)[-self._tail_bytes:]

    def text(self, marker="\n[... {} bytes omitted ...]\n"):
        """Head and tail decoded, with ``marker`` (formatted with the gap) between them."""
        gap = self.total - len(self.head) - len(self.tail)
        middle = marker.format(gap).encode() if gap > 0 else b""
        return (self.head + middle + self.tail).decode("utf-8", errors="replace")


class _Capture:
    """Reads the child's output streams (keeping head and tail) and result pipe, capped.

    ``output_fds`` maps each output descriptor to its ``_Stream``; the byte cap counts
    all of them together.
    """

    def __init__(self, output_fds, result_fd, max_output_bytes):
        self.streams = dict(output_fds)
        self.output_bytes = 0
        self.result = b""
        self._max_output_bytes = max_output_bytes
        self._selector = selectors.DefaultSelector()
        for fd in (*self.streams, result_fd):
            os.set_blocking(fd, False)
            self._selector.register(fd, selectors.EVENT_READ)
        self._result_fd = result_fd

    @property
    def tail(self):
        """The last bytes of the first output stream."""
        return next(iter(self.streams.values())).tail

    @property
    def overflowed(self):
        return self.output_bytes > self._max_output_bytes

    @property
    def open(self):
        return bool(self._selector.get_map())

    def poll(self, timeout_s):
        """Reads whatever arrives within `timeout_s`."""
        for key, _ in self._selector.select(timeout_s):
            self._read(key.fd)

    def drain(self):
        """Reads what is buffered without waiting (writers may be dead or stuck)."""
        for fd in list(self._selector.get_map()):
            while fd in self._selector.get_map() and not self.overflowed:
                if not self._read(fd):
                    break
        self._selector.close()

    def _read(self, fd):
        try:
            chunk = os.read(fd, _READ_CHUNK)
        except BlockingIOError:
            return False
        if not chunk:
            self._selector.unregister(fd)
            return False
        if fd == self._result_fd:
            self.result = (self.result + chunk)[:_MAX_RESULT_BYTES]
        else:
            self.output_bytes += len(chunk)
            self.streams[fd].add(chunk)
        return True


def _has_exited(pid):
    """Whether the child has exited, without reaping it (its pgid stays reserved)."""
    return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


def _user_pids(uid):
    """Live (non-zombie) processes whose real or effective uid is `uid`."""
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status", encoding="utf-8") as file:
                fields = dict(line.split(":", 1) for line in file if ":" in line)
        except OSError:
            continue
        uids = fields.get("Uid", "").split()[:2]
        if str(uid) in uids and not fields.get("State", "").strip().startswith("Z"):
            pids.append(int(name))
    return pids


def _kill_everything(pgid, uid):
    """SIGKILLs the process group (if any) and, when known, every process of the uid."""
    try:
        if pgid is not None:
            os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    for _ in range(_KILL_ROUNDS):  # later rounds catch processes forked meanwhile
        pids = [] if uid is None else _user_pids(uid)
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.01)


def _remove_files_of(uid):
    """Deletes what `uid` created at the top of the shared temporary directories."""
    for directory in _SHARED_TEMP_DIRS:
        try:
            entries = list(os.scandir(directory))
        except OSError:
            continue
        for entry in entries:
            try:
                if entry.stat(follow_symlinks=False).st_uid != uid:
                    continue
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path)
                else:
                    os.unlink(entry.path)
            except OSError:
                continue


def _exit_reason(returncode):
    if returncode < 0:
        return f"killed by signal {-returncode} ({signal.strsignal(-returncode)})"
    return f"exited with code {returncode}"


def _parse_result(raw, nonce):
    """The child's (valid, objective, error) report, or None when absent or forged."""
    try:
        report = json.loads(raw.decode("utf-8").splitlines()[-1])
    except (UnicodeDecodeError, ValueError, IndexError):
        return None
    if not isinstance(report, dict) or report.get("nonce") != nonce:
        return None
    return report


def _verdict(report, returncode, capture, timed_out, timeout_s, max_output_bytes,
             num_strays):
    """(valid, objective, error) from everything observed about the run."""
    if capture.overflowed:
        return False, None, f"output exceeded {max_output_bytes} bytes"
    if num_strays:
        return False, None, f"started {num_strays} process(es) that outlived the check"
    if report is None:
        if timed_out:
            return False, None, f"timed out after {timeout_s:g} s (wall clock)"
        return False, None, f"no result: {_exit_reason(returncode)}"
    if report["valid"]:
        return True, float(report["objective"]), None
    return False, None, str(report["error"])


def run_candidate(source: str, function_name: str, task_name: str, instances_spec: Any,
                  *, evaluate_options: Mapping[str, Any] | None = None,
                  timeout_s: float = 10.0, memory_mb: int = 1024,
                  cpu_s: float | None = None, max_output_bytes: int = 1 << 20,
                  max_file_mb: int = 16, max_processes: int = 4,
                  max_open_files: int = 64) -> Result:
    """Evaluates one candidate heuristic in the sandbox.

    Args:
      source: Python source that defines `function_name`.
      function_name: the heuristic's name in the task interface.
      task_name: a name in ``agentic_esopt.envs.ahd.tasks.TASKS`` or a
        ``"package.module:attribute"`` path to an object with the same
        ``generate_instances(size, n, seed)`` and ``evaluate(fn, instances)`` methods.
      instances_spec: an `InstanceSpec` (instances generated in the child) or the
        instances themselves (pickled to the child).
      evaluate_options: keyword arguments for ``task.evaluate`` (pickled), e.g.
        ``{"settings": aco.FAST_SETTINGS}`` for the ACO tasks.
      timeout_s: wall-clock limit; the whole process group is killed after it.
      memory_mb: address-space limit (RLIMIT_AS).
      cpu_s: CPU-time limit (RLIMIT_CPU); defaults to `timeout_s`.
      max_output_bytes: stdout+stderr cap; the run fails and is killed beyond it.
      max_file_mb: largest file the candidate may write (RLIMIT_FSIZE).
      max_processes: RLIMIT_NPROC (threads count too). It binds per run when the
        caller is root (each run gets its own uid); otherwise it counts all of the
        caller's processes, which usually means the candidate cannot fork at all.
      max_open_files: RLIMIT_NOFILE.

    Returns:
      The `Result`. Candidate failures never raise; bad arguments do.
    """
    cpu_s = timeout_s if cpu_s is None else cpu_s
    _check_limits(timeout_s, cpu_s, memory_mb, max_output_bytes, max_file_mb,
                  max_processes, max_open_files)
    _check_call(source, function_name, task_name)
    low, high = _SANDBOX_UIDS
    uid = low + secrets.randbelow(high - low) if os.geteuid() == 0 else None
    nonce = secrets.token_hex(16)
    job_dir = tempfile.mkdtemp(prefix="ahd_sandbox_")
    try:
        os.chmod(job_dir, 0o711)  # the sandbox uid may enter, not list
        workdir = os.path.join(job_dir, "work")
        os.mkdir(workdir, 0o700)
        if uid is not None:
            os.chown(workdir, uid, uid)
        job = dict(source=source, function_name=function_name, task=task_name, uid=uid,
                   nonce=nonce, workdir=workdir,
                   sys_path=[os.path.abspath(entry) for entry in sys.path],
                   limits=dict(cpu_s=cpu_s, memory_mb=memory_mb, max_file_mb=max_file_mb,
                               max_processes=max_processes,
                               max_open_files=max_open_files))
        job_path = _write_job(job_dir, job, instances_spec, evaluate_options)
        return _supervise(job_path, workdir, uid, nonce, timeout_s, max_output_bytes)
    finally:
        if uid is not None:
            _remove_files_of(uid)
        shutil.rmtree(job_dir, ignore_errors=True)


def _watch(proc, capture, uid, timeout_s, wait_for_exit=False, check=None):
    """Watches `proc` until exit, timeout or overflow; kills everything and reaps it.

    Without `wait_for_exit` the watch also ends when the child closes all its pipes;
    with it, the child then still gets until the deadline to exit by itself (a shell
    closes its output just before it exits, and its exit status matters). `check`, when
    given, is called every `_CHECK_S` seconds; the watch ends when it returns True.

    Returns:
      (returncode, timed_out, number of the uid's processes still alive at the end).
    """
    deadline = time.monotonic() + timeout_s
    next_check = time.monotonic() + _CHECK_S
    timed_out = False
    try:
        while ((capture.open or wait_for_exit) and not capture.overflowed
               and not _has_exited(proc.pid)):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                timed_out = True
                break
            if check is not None and time.monotonic() >= next_check:
                if check():
                    break
                next_check = time.monotonic() + _CHECK_S
            if capture.open:
                capture.poll(min(remaining, _POLL_S))
            else:
                time.sleep(min(remaining, _EXIT_POLL_S))
    finally:
        strays = [] if uid is None else [p for p in _user_pids(uid) if p != proc.pid]
        _kill_everything(proc.pid, uid)
        capture.drain()
        returncode = proc.wait()
    return returncode, timed_out, len(strays)


def _supervise(job_path, workdir, uid, nonce, timeout_s, max_output_bytes):
    """Starts the child, watches it until exit/timeout/overflow, kills and reaps."""
    result_read, result_write = os.pipe()
    start = time.monotonic()
    try:
        proc = subprocess.Popen(  # pylint: disable=consider-using-with
            [sys.executable, "-I", "-B", _CHILD_SCRIPT, job_path, str(result_write)],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            pass_fds=(result_write,), cwd=workdir, env=_child_env(workdir),
            start_new_session=True)
    finally:
        os.close(result_write)
    capture = _Capture({proc.stdout.fileno(): _Stream(0, _TAIL_BYTES)}, result_read,
                       max_output_bytes)
    try:
        returncode, timed_out, num_strays = _watch(proc, capture, uid, timeout_s)
    finally:
        proc.stdout.close()
        os.close(result_read)
    wall_s = time.monotonic() - start
    report = _parse_result(capture.result, nonce)
    valid, objective, error = _verdict(report, returncode, capture, timed_out, timeout_s,
                                       max_output_bytes, num_strays)
    tail = capture.tail.decode("utf-8", errors="replace")
    return Result(valid, objective, error, tail, wall_s)


def evaluate_many(sources: Sequence[str], function_name: str, task_name: str,
                  instances_spec: Any, *, max_workers: int | None = None,
                  **options: Any) -> list[Result]:
    """`run_candidate` for each source, `max_workers` (default: CPU count) at a time.

    Args:
      sources, function_name, task_name, instances_spec: as for `run_candidate`.
      max_workers: candidates run at once (threads, each waiting on one child).
      **options: the keyword arguments of `run_candidate` (limits, evaluate_options).

    Returns:
      One `Result` per source, in order.
    """
    if not sources:
        return []
    max_workers = max_workers or os.cpu_count() or 1
    with concurrent.futures.ThreadPoolExecutor(max_workers=max_workers) as pool:
        futures = [pool.submit(run_candidate, source, function_name, task_name,
                               instances_spec, **options) for source in sources]
        return [future.result() for future in futures]


# ----------------------------------------------------------------------------- shell commands

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
    same child as `run_candidate` (own process group, network namespace, resource limits,
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
        low, high = _SANDBOX_UIDS
        self.uid = low + secrets.randbelow(high - low) if os.geteuid() == 0 else None
        self._root = tempfile.mkdtemp(prefix=prefix)
        self.closed = False
        try:
            os.chmod(self._root, 0o711)  # the sandbox uid may enter, not list
            self.path = os.path.join(self._root, "work")
            os.mkdir(self.path, 0o700)
            if self.uid is not None:
                os.chown(self.path, self.uid, self.uid)
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
        cpu_s = timeout_s if cpu_s is None else cpu_s
        _check_limits(timeout_s, cpu_s, memory_mb, max_output_bytes, max_file_mb,
                      max_processes, max_open_files)
        if not max_disk_mb > 0:
            raise ValueError(f"max_disk_mb must be positive, got {max_disk_mb!r}")
        nonce = secrets.token_hex(16)
        job = dict(command=command, shell=shell, uid=self.uid, nonce=nonce,
                   workdir=self.path,
                   limits=dict(cpu_s=cpu_s, memory_mb=memory_mb, max_file_mb=max_file_mb,
                               max_processes=max_processes,
                               max_open_files=max_open_files))
        job_path = os.path.join(self._root, f"job_{nonce}.json")
        _write_private(job_path, json.dumps(job).encode("utf-8"))
        try:
            return self._supervise(job_path, nonce, timeout_s, max_output_bytes,
                                   max_disk_mb << 20)
        finally:
            os.unlink(job_path)
            if self.uid is not None:
                _remove_files_of(self.uid)

    def _disk_usage_exceeds(self, max_bytes):
        """Whether the working directory and what the uid made at the top of the shared
        temporary directories hold more than `max_bytes` (or too many files)."""
        tops = [self.path]
        if self.uid is not None:
            for directory in _SHARED_TEMP_DIRS:
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
        result_read, result_write = os.pipe()
        env = _child_env(self.path)
        env["PATH"] = f"{self._bin}:{os.defpath}"
        start = time.monotonic()
        try:
            proc = subprocess.Popen(  # pylint: disable=consider-using-with
                [sys.executable, "-I", "-B", _CHILD_SCRIPT, job_path, str(result_write)],
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                pass_fds=(result_write,), cwd=self.path, env=env, start_new_session=True)
        finally:
            os.close(result_write)
        out, err = (_Stream(_COMMAND_HEAD_BYTES, _COMMAND_TAIL_BYTES) for _ in range(2))
        capture = _Capture({proc.stdout.fileno(): out, proc.stderr.fileno(): err},
                           result_read, max_output_bytes)
        full = [False]

        def disk_full():
            full[0] = self._disk_usage_exceeds(max_disk_bytes)
            return full[0]

        try:
            returncode, timed_out, _ = _watch(proc, capture, self.uid, timeout_s,
                                              wait_for_exit=True, check=disk_full)
        finally:
            proc.stdout.close()
            proc.stderr.close()
            os.close(result_read)
        if full[0] or self._disk_usage_exceeds(max_disk_bytes):
            full[0] = True
            self._empty()
        report = _parse_result(capture.result, nonce)
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

    def __exit__(self, *exc_info) -> None:
        self.close()


def _close_workspace(root, uid):
    if uid is not None:
        _kill_everything(None, uid)
        _remove_files_of(uid)
    shutil.rmtree(root, ignore_errors=True)


def run_command(command: str, **limits: Any) -> CommandResult:
    """`Workspace.run` in a fresh workspace that is removed afterwards."""
    with Workspace() as workspace:
        return workspace.run(command, **limits)
