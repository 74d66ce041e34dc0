"""The sandbox: calls return their value, hostile code fails and leaves no trace."""

import os
import socket
import subprocess
import sys
import tempfile
import time
import uuid

import pytest

from agentic_esopt import sandbox
from agentic_esopt.sandbox import _child
from agentic_esopt.sandbox import process

REPO_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
IS_ROOT = os.geteuid() == 0
MEAN = "def score(xs):\n    return sum(xs) / len(xs)\n"


def run(source, xs=(1.0, 2.0, 6.0), **limits):
    """``score(xs)`` of ``source`` in the sandbox (``sandbox_entry`` is on sys.path)."""
    limits.setdefault("timeout_s", 3)
    return sandbox.run_python("sandbox_entry:call_score", {"source": source, "xs": list(xs)},
                              **limits)


def test_call_returns_its_value_as_json():
    result = run(MEAN)
    assert result.error is None and result.value == 3.0
    listed = run("def score(xs):\n    return {'xs': xs, 'n': len(xs)}\n", xs=(1.5,))
    assert listed.value == {"xs": [1.5], "n": 1}


def test_stdout_is_captured_and_working_directory_is_writable():
    source = ("import os, tempfile\ndef score(xs):\n    print('hello from the candidate')\n"
              "    with open('scratch.txt', 'w') as f:\n        f.write('42')\n"
              "    with tempfile.TemporaryDirectory() as scratch:\n"
              "        os.mkdir(os.path.join(scratch, 'sub'))\n"
              "    return float(open('scratch.txt').read())\n")
    result = run(source)
    assert result.error is None and result.value == 42.0
    assert "hello from the candidate" in result.stdout_tail


HOSTILE = {
    "infinite_loop": ("def score(xs):\n    while True:\n        pass\n", "timed out"),
    "fork_bomb": ("import os\ndef score(xs):\n    while True:\n        os.fork()\n",
                  "os.fork is not allowed"),
    "multiprocessing": ("import multiprocessing\ndef score(xs):\n"
                        "    multiprocessing.Process(target=print).start()\n    return 0.0\n",
                        "os.fork is not allowed"),
    "subprocess": ("import subprocess\ndef score(xs):\n"
                   "    subprocess.run(['true'])\n    return 0.0\n", "not allowed"),
    "memory_bomb": ("def score(xs):\n    hog = bytearray(8 << 30)\n    return 0.0\n",
                    "MemoryError"),
    "kill_parent": ("import os\ndef score(xs):\n    os.kill(os.getppid(), 9)\n    return 0.0\n",
                    "os.kill is not allowed"),
    "sys_exit": ("import sys\ndef score(xs):\n    sys.exit(0)\n", "SystemExit"),
    "raise_system_exit": ("raise SystemExit(3)\n", "SystemExit: 3"),
    "os_exit": ("import os\ndef score(xs):\n    os._exit(0)\n", "no result: exited with code 0"),
    "print_gigabytes": ("def score(xs):\n    while True:\n        print('x' * 1_000_000)\n",
                        "output exceeded"),
    "syntax_error": ("def score(xs)\n    return 1.0\n", "SyntaxError"),
    "not_json": ("def score(xs):\n    return b'bytes'\n", "the result is not JSON"),
    "ctypes": ("import ctypes\ndef score(xs):\n    ctypes.CDLL(None).fork()\n    return 0.0\n",
               "ctypes"),
    "raise_limits": ("import resource\ndef score(xs):\n"
                     "    resource.setrlimit(resource.RLIMIT_CPU, (-1, -1))\n    return 0.0\n",
                     "resource.setrlimit is not allowed"),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_code_fails_with_a_reason(name):
    source, reason = HOSTILE[name]
    start = time.monotonic()
    result = run(source, timeout_s=2, cpu_s=30, memory_mb=512)
    assert result.value is None and reason in result.error, result.error
    assert time.monotonic() - start < 10


def test_cpu_limit_kills_busy_code_before_the_wall_clock():
    result = run("def score(xs):\n    while True:\n        pass\n", timeout_s=20, cpu_s=1)
    assert "CPU time limit exceeded" in result.error
    assert result.wall_s < 10


def test_violation_fails_even_when_the_code_swallows_the_error():
    source = ("import os\ndef score(xs):\n    try:\n        os.kill(os.getppid(), 9)\n"
              "    except Exception:\n        pass\n    return 1.0\n")
    result = run(source)
    assert result.value is None and "sandbox violation: os.kill" in result.error


def test_writes_outside_the_working_directory_leave_no_file():
    targets = [os.path.join(tempfile.gettempdir(), f"pwned_{uuid.uuid4().hex}"),
               os.path.join(REPO_DIR, f"pwned_{uuid.uuid4().hex}"),
               os.path.join("/dev/shm", f"pwned_{uuid.uuid4().hex}")]
    fifo = os.path.join(tempfile.gettempdir(), f"pwned_fifo_{uuid.uuid4().hex}")
    attempts = "".join(
        f"    for attempt in (lambda: open({t!r}, 'w').write('x'),\n"
        f"                    lambda: os.close(os.open({t!r}, os.O_CREAT | os.O_WRONLY)),\n"
        f"                    lambda: os.mkdir({t!r}),\n"
        f"                    lambda: os.rename('mine.txt', {t!r})):\n"
        f"        try:\n            attempt()\n        except Exception:\n            pass\n"
        for t in targets)
    source = ("import os\ndef score(xs):\n    open('mine.txt', 'w').close()\n" + attempts
              + f"    os.mkfifo({fifo!r})  # unaudited: cleaned up by uid\n    return 1.0\n")
    result = run(source)
    assert result.value is None and "sandbox violation" in result.error
    for path in targets + ([fifo] if IS_ROOT else []):
        assert not os.path.lexists(path), path


def test_socket_to_a_local_listener_delivers_nothing():
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        source = ("import socket\ndef score(xs):\n"
                  f"    with socket.create_connection(('127.0.0.1', {port}), timeout=1) as s:\n"
                  "        s.sendall(b'leak')\n    return 0.0\n")
        result = run(source)
        listener.settimeout(0.5)
        with pytest.raises(socket.timeout):
            listener.accept()
    assert result.value is None and "socket" in result.error


def test_network_namespace_isolates_the_child_without_the_audit_hook():
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        probe = ("import socket, sys\n"
                 f"sys.path.insert(0, {os.path.dirname(_child.__file__)!r})\n"
                 "from _child import _isolate_network\n"
                 "if not _isolate_network():\n    sys.exit(3)\n"
                 f"socket.create_connection(('127.0.0.1', {port}), timeout=1)\n")
        completed = subprocess.run([sys.executable, "-c", probe], capture_output=True,
                                   timeout=30, check=False)
        if completed.returncode == 3:
            pytest.skip("this kernel refuses new network namespaces")
        listener.settimeout(0.5)
        with pytest.raises(socket.timeout):
            listener.accept()
    assert completed.returncode == 1
    assert b"Network is unreachable" in completed.stderr


@pytest.mark.skipif(not IS_ROOT, reason="privileges are dropped only when running as root")
def test_code_runs_as_an_unprivileged_uid_with_a_binding_process_limit():
    uid = run("import os\ndef score(xs):\n    return os.getuid()\n")
    assert uid.error is None and uid.value >= process.SANDBOX_UIDS[0]
    threads = ("import threading, time\ndef score(xs):\n"
               "    for _ in range(8):\n"
               "        threading.Thread(target=time.sleep, args=(1,), daemon=True).start()\n"
               "    return 0.0\n")
    result = run(threads, max_processes=4)
    assert "can't start new thread" in result.error


def _processes_running(command_line):
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as file:
                found += [pid] if file.read().replace(b"\0", b" ").strip() == command_line else []
        except OSError:
            continue
    return found


def test_process_escaping_the_audit_hook_and_the_group_fails_and_is_killed():
    # _posixsubprocess.fork_exec raises no audit event; call_setsid leaves the group.
    source = ("import _posixsubprocess, os, time\ndef score(xs):\n"
              "    _posixsubprocess.fork_exec([b'sleep', b'314.159'], [b'/bin/sleep'], True,"
              " (), None, None, -1, -1, -1, -1, -1, -1, *os.pipe(), False, True, -1, None,"
              " None, None, -1, None, True)\n"
              "    time.sleep(0.2)\n    return 1.0\n")
    result = run(source)
    assert result.error, result
    time.sleep(0.2)
    assert not _processes_running(b"sleep 314.159")


@pytest.mark.skipif(not IS_ROOT, reason="the uid sweep needs root")
def test_cleanup_kills_processes_that_left_the_process_group():
    uid = process.SANDBOX_UIDS[1] - 1
    escaped = subprocess.Popen(["sleep", "60"], user=uid, group=uid,  # own session
                               start_new_session=True)
    try:
        process.kill_everything(os.getpid() + 10**7, uid)  # no such group
        assert escaped.wait(timeout=5) == -9
    finally:
        escaped.kill()


def test_temporary_directories_are_removed():
    prefix = f"sandbox_{uuid.uuid4().hex}_"
    result = run("open('left_behind.txt', 'w').write('x')\n" + MEAN, prefix=prefix)
    assert result.value == 3.0
    assert not [n for n in os.listdir(tempfile.gettempdir()) if n.startswith(prefix)]


@pytest.mark.parametrize("kwargs, message", [
    (dict(timeout_s=0), "timeout_s must be positive"),
    (dict(memory_mb=-1), "memory_mb must be positive"),
    (dict(max_open_files=3), "max_open_files"),
])
def test_bad_limits_raise(kwargs, message):
    with pytest.raises(ValueError, match=message):
        run(MEAN, **kwargs)


def test_a_bad_entry_raises_in_the_caller():
    with pytest.raises(ModuleNotFoundError):
        sandbox.run_python("no_such_module_xyz:call", {})
    with pytest.raises(AttributeError):
        sandbox.run_python("sandbox_entry:no_such_function", {})


def test_a_failed_set_up_is_reported():
    result = sandbox.run_python("sandbox_entry:fail_setup", 7, timeout_s=3)
    assert result.value is None
    assert result.error == "sandbox setup failed: RuntimeError: no set-up for 7"


def test_guard_allows_reads_and_workdir_writes_only(tmp_path):
    guard = _child.Guard(str(tmp_path))
    assert guard._check("open", ("/etc/hostname", "r", os.O_RDONLY)) is None
    assert guard._check("open", (str(tmp_path / "a"), "w", os.O_WRONLY | os.O_CREAT)) is None
    assert "outside" in guard._check("open", ("/tmp/x", "w", os.O_WRONLY))
    assert "outside" in guard._check("open", (str(tmp_path / ".." / "x"), "a", os.O_APPEND))
    assert "absolute" in guard._check("open", ("x", None, os.O_WRONLY | os.O_CREAT))
    assert guard._check("os.mkdir", (str(tmp_path / "d"), 0o777, -1)) is None
    inside, outside = os.open(tmp_path, os.O_RDONLY), os.open("/tmp", os.O_RDONLY)
    try:
        assert guard._check("os.remove", ("f", inside)) is None
        assert "outside" in guard._check("os.remove", ("f", outside))
        assert "outside" in guard._check("os.rename", (str(tmp_path / "a"), "b", -1, outside))
    finally:
        os.close(inside)
        os.close(outside)
    assert "not allowed" in guard._check("socket.__new__", (None, 2, 1, 0))
    assert guard.violations == []
    with pytest.raises(PermissionError, match="sandbox"):
        guard("os.system", ("ls",))
    assert guard.violations == ["os.system is not allowed"]


def test_workspace_reports_a_failed_setup():
    with sandbox.Workspace() as workspace:
        result = workspace.run("echo hi", shell="/no/such/shell")
        assert result.error and "sandbox setup failed" in result.error
        assert result.exit_code == 126 and result.stdout == ""
        assert workspace.run("echo hi").stdout == "hi\n"
    with pytest.raises(RuntimeError, match="closed"):
        workspace.run("echo hi")
