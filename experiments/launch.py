"""What every launcher shares: the ``--config`` flag, a checked config, one-line
configuration and plugin errors, and a quiet start.

A config file is read from the path given (relative to the current directory; a
launcher's default, relative to the repository, resolves wherever it runs), and its
folder goes last on ``sys.path``, so a config file imports the user's modules beside it
(environments, rules, strategies that register themselves; docs/extending.md) without
them shadowing an installed package (the repository's ``configs/miniwob.py`` and the
``miniwob`` package).
"""

import ast
import logging as std_logging
import os
import re
import sys
from collections.abc import Callable
from typing import Any

from absl import app, flags, logging
from ml_collections import config_flags

from agentic_esopt import registry, training

_OLD_SECTION = re.compile(r"^--?config\.update\.")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def config_argument(argv: list[str], default: str) -> str:
    """The ``--config`` value of ``argv`` (``FILE`` or ``FILE:ARGS``), else ``default``."""
    value = default
    for arg, following in zip(argv, [*argv[1:], None]):
        if arg.startswith(("--config=", "-config=")):
            value = arg.split("=", 1)[1]
        elif arg in ("--config", "-config") and following is not None:
            value = following
    return value


def config_file_problem(path: str) -> str | None:
    """What is wrong with config file ``path`` (None if it exists and has ``get_config``)."""
    if not os.path.isfile(path):
        beside_repo = os.path.join(REPO, path)
        if not os.path.isabs(path) and os.path.isfile(beside_repo):
            return (f"config file {path!r} does not exist in the current directory "
                    f"{os.getcwd()}; a relative --config is read from there: use "
                    f"--config={beside_repo}")
        return f"config file {path!r} does not exist ({os.path.abspath(path)})"
    with open(path, encoding="utf-8") as f:
        try:
            tree = ast.parse(f.read(), path)
        except SyntaxError as error:
            return f"config file {path!r} is not valid Python: {error}"
    names = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
    names |= {target.id for node in tree.body if isinstance(node, ast.Assign)
              for target in node.targets if isinstance(target, ast.Name)}
    names |= {alias.asname or alias.name for node in tree.body
              if isinstance(node, ast.ImportFrom) for alias in node.names}
    if "get_config" not in names:
        return (f"config file {path!r} has no get_config(); a config file defines "
                "get_config() returning an ml_collections.ConfigDict")
    return None


def define_config(default: str, help_text: str = "Config file (get_config() -> "
                                                 "ConfigDict).") -> flags.FlagHolder:
    """The ``--config`` flag: a config file and its dotted overrides.

    ``default`` is relative to the repository (or absolute). A config file that does not
    exist or lacks ``get_config`` ends the program with one line naming it; the file's
    folder goes last on ``sys.path``. An override of a key that the file's sections lack
    is kept, so that ``TrainConfig.from_dict`` names it with the closest key, beside every
    other problem (``train_config``). An override of a missing section (config_flags
    applies overrides when the flag is defined) ends the program with one line naming it.
    """
    old = [arg.split("=")[0] for arg in sys.argv[1:] if _OLD_SECTION.match(arg)]
    if old:
        _fail(f"the update section is called rule: use --config.rule.name=es|grpo|none "
              f"and --config.rule.<option> in place of {', '.join(old)}")
    if not os.path.isabs(default):
        default = os.path.join(REPO, default)
    path = config_argument(sys.argv[1:], default).split(":", 1)[0]
    problem = config_file_problem(path)
    if problem:
        _fail(problem)
    folder = os.path.dirname(os.path.abspath(path))
    if folder not in sys.path:
        sys.path.append(folder)
    try:
        return config_flags.DEFINE_config_file("config", default, help_text,
                                               lock_config=False, accept_new_attributes=True)
    except (KeyError, AttributeError) as error:
        detail = str(error).replace("\\n", "; ").replace("\\'", "").strip("\"'")
        _fail(f"unknown config section in an override: {detail}")
    raise AssertionError("unreachable")


def _fail(message: str) -> None:
    sys.exit(f"FATAL Flags parsing error: {message}")


def quiet_startup() -> None:
    """Keeps orbax's INFO chatter (one record per file written) out of the log. (The
    package's ``__init__`` already silenced transformers and JAX's accelerator probe.)"""
    std_logging.getLogger("jax._src.xla_bridge").setLevel(std_logging.ERROR)
    logging.get_absl_handler().addFilter(_QuietOrbax())


class _QuietOrbax:
    """Drops orbax's INFO chatter (one record per file written) from the log."""

    def filter(self, record) -> bool:
        return record.levelno > std_logging.INFO or "orbax" not in record.pathname


def train_config(config_dict) -> training.TrainConfig:
    """The checked ``TrainConfig`` of a config file; a UsageError listing every problem."""
    try:
        return training.TrainConfig.from_dict(config_dict.to_dict())
    except ValueError as error:
        raise app.UsageError(str(error)) from error


def define_workdir(help_text: str) -> flags.FlagHolder:
    """The required ``--workdir`` flag of a tool that reads a training workdir."""
    return flags.DEFINE_string("workdir", None, help_text, required=True)


def run_tool(action: Callable[[], Any]) -> None:
    """``run`` for a tool of flags alone (no positional arguments): prints ``action()``;
    its ValueErrors and OSErrors (a bad workdir, an output folder that exists) end it as
    one-line errors."""
    def main(argv: list[str]) -> None:
        if len(argv) > 1:
            raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
        try:
            result = action()
        except (ValueError, OSError) as error:
            raise app.UsageError(str(error)) from error
        print(result)

    run(main)


def run(main: Callable[[list[str]], None]) -> None:
    """``app.run(main)`` with a quiet start, and configuration errors and plugins that
    break their contract (``registry.PluginError``) printed as one message (no usage
    text, no traceback)."""
    def checked_main(argv: list[str]) -> None:
        try:
            main(argv)
        except (app.UsageError, registry.PluginError) as error:
            sys.exit(f"FATAL: {error}")

    quiet_startup()
    app.run(checked_main)
