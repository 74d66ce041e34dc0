"""What every launcher shares: the ``--config`` flag, a checked config, one-line
configuration errors, and a quiet start."""

import logging as std_logging
import re
import sys
from collections.abc import Callable

from absl import app, flags, logging
from ml_collections import config_flags

from agentic_esopt import training

_OLD_SECTION = re.compile(r"^--?config\.update\.")


def define_config(default: str, help_text: str = "Config file (get_config() -> "
                                                 "ConfigDict).") -> flags.FlagHolder:
    """The ``--config`` flag: a config file and its dotted overrides.

    An override of a key that the file's sections lack is kept, so that
    ``TrainConfig.from_dict`` names it with the closest key, beside every other problem
    (``train_config``). An override of a missing section (config_flags applies overrides
    when the flag is defined) ends the program with one line naming it.
    """
    old = [arg.split("=")[0] for arg in sys.argv[1:] if _OLD_SECTION.match(arg)]
    if old:
        _fail(f"the update section is called rule: use --config.rule.name=es|grpo|none "
              f"and --config.rule.<option> in place of {', '.join(old)}")
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


def run(main: Callable[[list[str]], None]) -> None:
    """``app.run(main)`` with a quiet start and configuration errors printed as one
    message (no usage text)."""
    def checked_main(argv: list[str]) -> None:
        try:
            main(argv)
        except app.UsageError as error:
            sys.exit(f"FATAL: {error}")

    quiet_startup()
    app.run(checked_main)
