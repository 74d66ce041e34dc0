"""What every launcher shares: a checked config from a ConfigDict, and a quiet start."""

import logging as std_logging

from absl import app, logging

from agentic_esopt import training


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
