"""The sandboxed side of every sandbox run: one Python call or one shell command.

Started by the parent (``process.start_child``) as ``python -I -B _child.py JOB_JSON
RESULT_FD`` in a new session. Until the sandboxed code runs, this is trusted code and
imports only the standard library (the job's entry module is imported after ``sys.path``
is set from the job). A Python job (from ``programs.run_python``), in order:

1. moves into a fresh network namespace (``unshare(CLONE_NEWNET)``; with
   ``CLONE_NEWUSER`` too when not root; skipped where the kernel refuses);
2. applies the resource limits (CPU, address space, file size, processes, open files,
   no core dumps);
3. loads the pickled payload and calls the job's entry (``"package.module:function"``)
   on it: trusted set-up (e.g. loading a task and its instances) that returns the call to
   sandbox;
4. when started as root, drops to the job's unprivileged uid/gid (no supplementary
   groups, ``no_new_privs``), after re-rooting import paths that uid could not read;
5. installs an audit hook (`Guard`) that vetoes sockets, process creation, signals,
   ctypes, limit changes and file-system writes outside the working directory;
6. makes the call and writes one JSON line ``{"nonce", "value", "error"}`` to RESULT_FD,
   then ``os._exit(0)``.

Any blocked action fails the call even when the sandboxed code catches the error.

A job with a ``command`` (from ``workspace.Workspace.run``) takes steps 1, 2 and 4, moves
into the working directory and replaces itself with ``SHELL -c COMMAND`` (no audit hook:
the shell is not Python); the result descriptor is closed by the exec and written only
when the setup or the exec fails.
Threat model: this protects the host from buggy or hostile code; it does not claim that
the code cannot tamper with its own result from inside the same interpreter (the
per-run nonce only rules out naive forgeries).
"""

import ctypes
import importlib
import json
import math
import os
import pickle
import resource
import signal
import stat
import sys

_CLONE_NEWNET = 0x40000000
_CLONE_NEWUSER = 0x10000000
_PR_SET_DUMPABLE = 4
_PR_SET_NO_NEW_PRIVS = 38
_MAX_ERROR_CHARS = 1000
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND

_BLOCKED_EVENTS = frozenset({
    "os.system", "os.fork", "os.forkpty", "os.posix_spawn", "os.exec", "os.spawn",
    "os.kill", "os.killpg", "signal.pthread_kill", "pty.spawn", "subprocess.Popen",
    "resource.setrlimit", "resource.prlimit", "sys.addaudithook", "gc.get_objects",
    "gc.get_referrers", "gc.get_referents", "os.link", "os.symlink", "os.truncate",
    "os.chmod", "os.chown", "os.chflags", "os.lchflags", "os.utime", "os.setxattr",
    "os.removexattr", "sqlite3.connect", "webbrowser.open",
})
_BLOCKED_PREFIXES = ("socket.", "ctypes.", "syslog.", "winreg.", "msvcrt.")
# Mutating file-system events allowed inside the working directory:
# event -> (positions of path arguments, positions of their dir_fd arguments).
_PATH_EVENTS = {
    "os.mkdir": ((0,), (2,)),
    "os.remove": ((0,), (1,)),
    "os.rmdir": ((0,), (1,)),
    "os.rename": ((0, 1), (2, 3)),
    "shutil.rmtree": ((0,), (1,)),
}


def describe_exception(exc):
    """One line naming an exception, truncated for reports."""
    text = f"{type(exc).__name__}: {exc}".strip().rstrip(":")
    return text[:_MAX_ERROR_CHARS]


def resolve(reference):
    """The object a ``"package.module:attribute"`` reference names (attributes may be
    dotted)."""
    module_name, _, attribute = reference.partition(":")
    target = importlib.import_module(module_name)
    for part in attribute.split("."):
        target = getattr(target, part)
    return target


class Guard:
    """Audit hook that vetoes (and remembers) anything sandboxed code has no need to do."""

    def __init__(self, workdir):
        self._root = os.path.realpath(workdir)
        self.violations = []

    def __call__(self, event, args):
        reason = self._check(event, args)
        if reason is not None:
            self.violations.append(reason)
            raise PermissionError(f"sandbox: {reason}")

    def _check(self, event, args):
        if event in _BLOCKED_EVENTS or event.startswith(_BLOCKED_PREFIXES):
            return f"{event} is not allowed"
        if event == "open":
            return self._check_open(*args[:3])
        if event in _PATH_EVENTS:
            path_positions, dir_fd_positions = _PATH_EVENTS[event]
            for path_at, dir_fd_at in zip(path_positions, dir_fd_positions):
                if not self._inside(args[path_at], args[dir_fd_at]):
                    return f"{event} outside the working directory ({args[path_at]!r})"
        return None

    def _check_open(self, path, mode, flags):
        if not flags & _WRITE_FLAGS:
            return None
        if isinstance(path, int):
            return None if path in (1, 2) else f"writing to descriptor {path} is not allowed"
        # os.open (mode None) may use an invisible dir_fd: only absolute paths pass.
        if mode is None and not os.path.isabs(os.fsdecode(path)):
            return f"os.open for writing needs an absolute path ({path!r})"
        if not self._inside(path):
            return f"writing outside the working directory ({path!r})"
        return None

    def _inside(self, path, dir_fd=None):
        """Whether `path` (relative to `dir_fd` when given) is in the working directory."""
        if isinstance(path, int):
            return False
        path = os.fsdecode(os.fspath(path))
        if dir_fd not in (None, -1):
            path = os.path.join(os.readlink(f"/proc/self/fd/{dir_fd}"), path)
        real = os.path.realpath(path)
        return real == self._root or real.startswith(self._root + os.sep)


def _isolate_network():
    """Enters a new, empty network namespace when the kernel allows it."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(_CLONE_NEWNET) == 0:
        return True
    return os.geteuid() != 0 and libc.unshare(_CLONE_NEWUSER | _CLONE_NEWNET) == 0


def _apply_limits(limits):
    """Lowers the resource limits of this process (and anything it starts)."""
    cpu_s = max(1, math.ceil(limits["cpu_s"]))
    memory = limits["memory_mb"] << 20
    settings = {
        resource.RLIMIT_CPU: (cpu_s, cpu_s + 1),
        resource.RLIMIT_AS: (memory, memory),
        resource.RLIMIT_FSIZE: (limits["max_file_mb"] << 20,) * 2,
        resource.RLIMIT_NPROC: (limits["max_processes"],) * 2,
        resource.RLIMIT_NOFILE: (limits["max_open_files"],) * 2,
        resource.RLIMIT_CORE: (0, 0),
    }
    for kind, value in settings.items():
        resource.setrlimit(kind, value)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # oversized writes raise instead


def _others_can_read(directory):
    """Whether a user with no owner or group rights can list and enter `directory`."""
    real = os.path.realpath(directory)
    ancestors = [real[:i] or os.sep for i, c in enumerate(real) if c == os.sep]
    if any(not os.stat(a).st_mode & stat.S_IXOTH for a in ancestors):
        return False
    mode = os.stat(real).st_mode
    return bool(mode & stat.S_IXOTH and mode & stat.S_IROTH)


def _reroot_unreadable_import_paths():
    """Makes import directories the sandbox uid could not reach readable through fds.

    An interpreter installed under a private directory (e.g. pyenv in /root) stays
    importable after the privilege drop: each such directory is opened now, as root,
    and reached afterwards through ``/proc/self/fd/N``, which skips the ancestors'
    permission checks. Package ``__path__`` entries are rewritten to match.
    """
    aliases = {}

    def alias(directory):
        for old, new in aliases.items():
            if directory == old or directory.startswith(old + os.sep):
                return new + directory[len(old):]
        if not os.path.isdir(directory) or _others_can_read(directory):
            return directory
        descriptor = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        aliases[directory] = f"/proc/self/fd/{descriptor}"
        return aliases[directory]

    sys.path[:] = [alias(entry) for entry in sys.path]
    for module in list(sys.modules.values()):
        package_path = getattr(module, "__path__", None)
        if isinstance(package_path, list):
            package_path[:] = [alias(entry) for entry in package_path]
    sys.path_importer_cache.clear()


def _drop_privileges(uid):
    """Becomes `uid`/`uid` for good: no groups, no capabilities, no new privileges."""
    libc = ctypes.CDLL(None, use_errno=True)
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
    if os.getuid() != uid or os.geteuid() != uid:
        raise OSError(f"could not become uid {uid}")
    libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    libc.prctl(_PR_SET_DUMPABLE, 1, 0, 0, 0)  # keeps /proc/self/fd usable after setuid


def _prepare(job):
    """Steps 1-5 of a Python job: returns (the call to make, the installed guard)."""
    _isolate_network()
    _apply_limits(job["limits"])
    sys.path[:] = job["sys_path"]
    with open(job["payload"], "rb") as file:
        payload = pickle.load(file)
    call = resolve(job["entry"])(payload)
    os.umask(0o077)
    if job["uid"] is not None:
        _reroot_unreadable_import_paths()
        _drop_privileges(job["uid"])
    guard = Guard(job["workdir"])
    sys.addaudithook(guard)
    return call, guard


def _guarded_call(call, guard):
    """(value, None) of ``call()``, or (None, why it failed or what it tried)."""
    value, error = None, None
    try:
        value = call()
    except BaseException as exc:  # pylint: disable=broad-except  # SystemExit included.
        error = describe_exception(exc)
    if guard.violations:
        return None, f"sandbox violation: {guard.violations[0]}"
    return value, error


def _exec_command(job, result_fd):
    """Limits and isolates this process, then becomes ``SHELL -c COMMAND``."""
    _isolate_network()
    _apply_limits(job["limits"])
    signal.signal(signal.SIGXFSZ, signal.SIG_DFL)  # the shell's children get the default
    os.umask(0o077)
    if job["uid"] is not None:
        _drop_privileges(job["uid"])
    os.chdir(job["workdir"])
    os.set_inheritable(result_fd, False)  # closed by a successful exec, kept by a failed one
    shell = job["shell"]
    os.execve(shell, [shell, "-c", job["command"]], dict(os.environ))


def main(job_path, result_fd):
    """Runs the job in `job_path` and reports on `result_fd`; never returns."""
    with open(job_path, encoding="utf-8") as file:
        job = json.load(file)
    write, dumps = os.write, json.dumps  # bound before any sandboxed code runs
    if "command" in job:
        try:
            _exec_command(job, result_fd)
        except BaseException as exc:  # pylint: disable=broad-except
            report = {"nonce": job["nonce"], "error": describe_exception(exc)}
            try:
                write(result_fd, (dumps(report) + "\n").encode())
            except OSError:
                pass
            os._exit(126)
    try:
        call, guard = _prepare(job)
    except BaseException as exc:  # pylint: disable=broad-except
        value, error = None, f"sandbox setup failed: {describe_exception(exc)}"
    else:
        value, error = _guarded_call(call, guard)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:  # pylint: disable=broad-except  # a replaced stream.
            pass
    try:
        line = dumps({"nonce": job["nonce"], "value": value, "error": error})
    except (TypeError, ValueError) as exc:
        line = dumps({"nonce": job["nonce"], "value": None,
                      "error": f"the result is not JSON: {describe_exception(exc)}"})
    write(result_fd, (line + "\n").encode())
    os._exit(0)  # skips atexit handlers and non-daemon threads the code left


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
