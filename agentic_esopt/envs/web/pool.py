"""A bounded pool of browser worker processes shared by a task source's episodes.

Each worker (``worker.py``) is a process with one Chromium that serves many episodes, each
in its own browser context; requests to one worker run one at a time, different workers
run in parallel, so ``size`` bounds both the browsers and the parallelism. Workers start
on first use and are recycled across episodes and generations. ``close`` (also at exit
and when the pool is garbage-collected) ends every worker and every process it started,
Chromium included; a worker whose parent dies sees its input end and closes itself.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import weakref
from typing import Any

from agentic_esopt.envs.web import runtime

SHUTDOWN_WAIT_S = 10.0


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (Linux ``/proc``), whatever its process group."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8") as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(int(entry))
    found, stack = [], [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found


def _kill(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


class WorkerError(RuntimeError):
    """A browser worker could not carry out a request (the worker lives on)."""


class WorkerGone(RuntimeError):
    """A browser worker died."""


class BrowserWorker:
    """One worker process and the lock that serialises requests to it."""

    def __init__(self, environment: dict[str, str]):
        self.process = subprocess.Popen(  # pylint: disable=consider-using-with
            [sys.executable, "-m", "agentic_esopt.envs.web.worker"], env=environment,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            text=True, encoding="utf-8", start_new_session=True)
        self.lock = threading.Lock()
        self.episodes = 0

    def request(self, **message: Any) -> dict[str, Any]:
        """Sends one request and returns the reply.

        Raises:
          WorkerError: the worker failed the request.
          WorkerGone: the worker is dead.
        """
        with self.lock:
            try:
                self.process.stdin.write(json.dumps(message) + "\n")
                self.process.stdin.flush()
                line = self.process.stdout.readline()
            except (BrokenPipeError, ValueError, OSError) as error:
                raise WorkerGone(f"the browser worker is gone ({error})") from error
        if not line:
            raise WorkerGone(f"the browser worker exited (code {self.process.poll()})")
        reply = json.loads(line)
        if "failure" in reply:
            raise WorkerError(reply["failure"])
        return reply

    def close(self) -> None:
        """Asks the worker to close its browser, then kills whatever is left of it."""
        with self.lock:
            left = descendants(self.process.pid)
            try:
                self.process.stdin.close()
                self.process.wait(timeout=SHUTDOWN_WAIT_S)
            except (OSError, subprocess.TimeoutExpired):
                pass
            _kill([self.process.pid, *left, *descendants(self.process.pid)])
            self.process.wait()
            self.process.stdout.close()


def _close_workers(workers: list[BrowserWorker]) -> None:
    """Closes every worker, also when closing one fails (the first error is raised)."""
    errors = []
    while workers:
        try:
            workers.pop().close()
        except Exception as error:  # pylint: disable=broad-except  # the others still close
            errors.append(error)
    if errors:
        raise errors[0]


class BrowserPool:
    """Up to ``size`` browser workers; an episode goes to the least busy one.

    Args:
      size: the most browser processes (and episodes acting at once).
      cache_dir: the project cache holding the Playwright browser folder (None: default).
      miniwob: whether the workers serve MiniWoB tasks (checks and sets its URL).
      extra_environment: more environment variables for the workers.
    """

    def __init__(self, size: int, cache_dir: str | None = None, miniwob: bool = True,
                 extra_environment: dict[str, str] | None = None):
        if size < 1:
            raise ValueError(f"a browser pool needs size >= 1, got {size}")
        self.size = size
        self._environment = {**runtime.worker_environment(cache_dir, miniwob=miniwob),
                             **(extra_environment or {})}
        self._workers: list[BrowserWorker] = []
        self._lock = threading.Lock()
        # Runs on close, when the pool is garbage-collected, or at interpreter exit.
        self._finalizer = weakref.finalize(self, _close_workers, self._workers)

    def acquire(self) -> BrowserWorker:
        """A worker for one more episode (starting one while fewer than ``size`` run).

        Raises:
          RuntimeError: the pool is closed.
        """
        with self._lock:
            if not self._finalizer.alive:
                raise RuntimeError("the browser pool is closed")
            self._workers[:] = [w for w in self._workers if w.process.poll() is None]
            idle = [w for w in self._workers if w.episodes == 0]
            if not idle and len(self._workers) < self.size:
                self._workers.append(BrowserWorker(self._environment))
            worker = min(self._workers, key=lambda w: w.episodes)
            worker.episodes += 1
            return worker

    def release(self, worker: BrowserWorker) -> None:
        """Ends an episode's claim on ``worker``."""
        with self._lock:
            worker.episodes -= 1

    def open_episodes(self) -> int:
        """Episodes the running workers hold open (asked of each worker)."""
        return sum(w.request(op="ping")["episodes"] for w in list(self._workers)
                   if w.process.poll() is None)

    def pids(self) -> list[int]:
        """The worker processes and everything they started (Chromium, its helpers)."""
        return [pid for w in self._workers if w.process.poll() is None
                for pid in (w.process.pid, *descendants(w.process.pid))]

    def close(self) -> None:
        """Ends every worker and every process it started (idempotent)."""
        with self._lock:
            self._finalizer()

    def __enter__(self) -> "BrowserPool":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()


def wait_gone(pids: list[int], timeout_s: float = 10.0) -> list[int]:
    """The processes of ``pids`` still alive (not zombies) after up to ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        alive = [pid for pid in pids if _alive(pid)]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.1)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
