"""Supervision of one sandbox child, shared by Python calls and shell commands.

The parent writes a job into a private temporary directory and starts ``_child.py`` (see
its docstring for what happens inside) with its own process group, stdin closed and its
output captured through pipes. The parent enforces:

* a wall-clock timeout, after which the whole process group is SIGKILLed;
* an output cap: reading stops and the group is killed once it is exceeded;
* cleanup: the process group is killed and reaped even after a normal exit. When the
  parent is root, every run gets its own random unprivileged uid, so RLIMIT_NPROC
  counts only that run's processes, and afterwards the parent also kills every
  process of that uid (even ones that left the group) and deletes anything that uid
  created at the top of the world-writable temporary directories.
"""

import json
import os
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable

from agentic_esopt.sandbox import _child

CHILD_SCRIPT = _child.__file__
SANDBOX_UIDS = (1 << 20, 1 << 30)  # [low, high): far from any real account
SHARED_TEMP_DIRS = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")
_READ_CHUNK = 1 << 16
_MAX_RESULT_BYTES = 1 << 16
_POLL_S = 0.05
_EXIT_POLL_S = 0.002
_CHECK_S = 0.2
_KILL_ROUNDS = 50
_CHILD_ENV_THREADS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
                      "NUMEXPR_NUM_THREADS")


def child_limits(timeout_s: float, cpu_s: float | None, memory_mb: int,
                 max_output_bytes: int, max_file_mb: int, max_processes: int,
                 max_open_files: int) -> dict[str, Any]:
    """The child's resource limits (``cpu_s`` defaults to ``timeout_s``), checked.

    Raises:
      ValueError: naming the first limit out of range.
    """
    cpu_s = timeout_s if cpu_s is None else cpu_s
    positive = dict(timeout_s=timeout_s, cpu_s=cpu_s, memory_mb=memory_mb,
                    max_output_bytes=max_output_bytes, max_processes=max_processes)
    for name, value in positive.items():
        if not value > 0:
            raise ValueError(f"{name} must be positive, got {value!r}")
    if max_file_mb < 0:
        raise ValueError(f"max_file_mb must be non-negative, got {max_file_mb!r}")
    if max_open_files < 16:
        raise ValueError(f"max_open_files must be at least 16, got {max_open_files!r}")
    return dict(cpu_s=cpu_s, memory_mb=memory_mb, max_file_mb=max_file_mb,
                max_processes=max_processes, max_open_files=max_open_files)


def new_uid() -> int | None:
    """A random unprivileged uid for a run when the caller is root, else None."""
    low, high = SANDBOX_UIDS
    return low + secrets.randbelow(high - low) if os.geteuid() == 0 else None


def make_root(prefix: str, uid: int | None) -> tuple[str, str]:
    """(a private temporary directory, its ``work`` subdirectory owned by ``uid``)."""
    root = tempfile.mkdtemp(prefix=prefix)
    try:
        os.chmod(root, 0o711)  # the sandbox uid may enter, not list
        workdir = os.path.join(root, "work")
        os.mkdir(workdir, 0o700)
        if uid is not None:
            os.chown(workdir, uid, uid)
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)
        raise
    return root, workdir


def write_private(path: str, data: bytes) -> None:
    """Creates `path` readable by its owner only (the sandboxed code must not see the job)."""
    with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as file:
        file.write(data)


def write_job(path: str, job: dict[str, Any]) -> None:
    """Writes the job the child reads (root-only when running as root)."""
    write_private(path, json.dumps(job).encode("utf-8"))


def child_env(workdir: str) -> dict[str, str]:
    """The child's whole environment: a home and temporary directory in ``workdir``."""
    env = {"PATH": os.defpath, "HOME": workdir, "TMPDIR": workdir, "LANG": "C.UTF-8",
           "JAX_PLATFORMS": "cpu"}  # should the code import jax, it never touches a GPU
    env.update({name: "1" for name in _CHILD_ENV_THREADS})
    return env


def start_child(job_path: str, workdir: str, env: dict[str, str],
                stderr: int) -> tuple[subprocess.Popen, int]:
    """Starts the child on ``job_path`` in a new session.

    Args:
      job_path: the job file.
      workdir: the child's working directory.
      env: its environment.
      stderr: ``subprocess.STDOUT`` (one stream) or ``subprocess.PIPE`` (two).

    Returns:
      (the process, the read end of its result pipe).
    """
    result_read, result_write = os.pipe()
    try:
        proc = subprocess.Popen(  # pylint: disable=consider-using-with
            [sys.executable, "-I", "-B", CHILD_SCRIPT, job_path, str(result_write)],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=stderr,
            pass_fds=(result_write,), cwd=workdir, env=env, start_new_session=True)
    except BaseException:
        os.close(result_read)
        raise
    finally:
        os.close(result_write)
    return proc, result_read


class Stream:
    """One captured output stream: its first and last bytes and how many there were."""

    def __init__(self, head_bytes: int, tail_bytes: int):
        self.head = b""
        self.tail = b""
        self.total = 0
        self._head_bytes = head_bytes
        self._tail_bytes = tail_bytes

    def add(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self._head_bytes - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk and self._tail_bytes:
            self.tail = (self.tail + chunk)[-self._tail_bytes:]

    def text(self, marker: str = "\n[... {} bytes omitted ...]\n") -> str:
        """Head and tail decoded, with ``marker`` (formatted with the gap) between them."""
        gap = self.total - len(self.head) - len(self.tail)
        middle = marker.format(gap).encode() if gap > 0 else b""
        return (self.head + middle + self.tail).decode("utf-8", errors="replace")


class Capture:
    """Reads the child's output streams (keeping head and tail) and result pipe, capped.

    ``output_fds`` maps each output descriptor to its ``Stream``; the byte cap counts
    all of them together.
    """

    def __init__(self, output_fds: dict[int, Stream], result_fd: int,
                 max_output_bytes: int):
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
    def overflowed(self) -> bool:
        return self.output_bytes > self._max_output_bytes

    @property
    def open(self) -> bool:
        return bool(self._selector.get_map())

    def poll(self, timeout_s: float) -> None:
        """Reads whatever arrives within `timeout_s`."""
        for key, _ in self._selector.select(timeout_s):
            self._read(key.fd)

    def drain(self) -> None:
        """Reads what is buffered without waiting (writers may be dead or stuck)."""
        for fd in list(self._selector.get_map()):
            while fd in self._selector.get_map() and not self.overflowed:
                if not self._read(fd):
                    break
        self._selector.close()

    def _read(self, fd: int) -> bool:
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


def _has_exited(pid: int) -> bool:
    """Whether the child has exited, without reaping it (its pgid stays reserved)."""
    return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


def user_pids(uid: int) -> list[int]:
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


def kill_everything(pgid: int | None, uid: int | None) -> None:
    """SIGKILLs the process group (if any) and, when known, every process of the uid."""
    try:
        if pgid is not None:
            os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    for _ in range(_KILL_ROUNDS):  # later rounds catch processes forked meanwhile
        pids = [] if uid is None else user_pids(uid)
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.01)


def remove_files_of(uid: int) -> None:
    """Deletes what `uid` created at the top of the shared temporary directories."""
    for directory in SHARED_TEMP_DIRS:
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


def exit_reason(returncode: int) -> str:
    """How the child ended, in words."""
    if returncode < 0:
        return f"killed by signal {-returncode} ({signal.strsignal(-returncode)})"
    return f"exited with code {returncode}"


def parse_report(raw: bytes, nonce: str) -> dict[str, Any] | None:
    """The child's last JSON line on the result pipe, or None when absent or forged."""
    try:
        report = json.loads(raw.decode("utf-8").splitlines()[-1])
    except (UnicodeDecodeError, ValueError, IndexError):
        return None
    if not isinstance(report, dict) or report.get("nonce") != nonce:
        return None
    return report


def watch(proc: subprocess.Popen, capture: Capture, uid: int | None, timeout_s: float,
          wait_for_exit: bool = False,
          check: Callable[[], bool] | None = None) -> tuple[int, bool, int]:
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
        strays = [] if uid is None else [p for p in user_pids(uid) if p != proc.pid]
        kill_everything(proc.pid, uid)
        capture.drain()
        returncode = proc.wait()
    return returncode, timed_out, len(strays)
