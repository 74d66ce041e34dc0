"""The process sandbox for model-written code (heuristics, an agent's tool commands).

Code runs in a child process with its own process group and network namespace, resource
limits (CPU, memory, files, processes, output), a wall-clock kill of everything it
started, when the caller is root an unprivileged uid of its own, and its own temporary
directory, removed afterwards. Python code runs under an audit hook as well.

    result = sandbox.run_python("my.module:prepare", payload, timeout_s=5)
    with sandbox.Workspace() as workspace:
        workspace.run("python3 -c 'print(6 * 7)'").stdout   # "42\\n"

This package imports nothing else of ``agentic_esopt``.
"""

from agentic_esopt.sandbox._child import resolve
from agentic_esopt.sandbox.programs import RunResult, run_python
from agentic_esopt.sandbox.workspace import CommandResult, Workspace, run_command

__all__ = ["CommandResult", "RunResult", "Workspace", "resolve", "run_command",
           "run_python"]
