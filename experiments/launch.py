"""What every launcher shares: a checked config from a ConfigDict, and a quiet start."""

import logging as std_logging
import os

from absl import app, logging

from agentic_esopt import training


def quiet_startup() -> None:
    """Silences start-up chatter that is not ours: transformers' "PyTorch was not found"
    advisory, JAX's TPU probe on machines without a TPU, orbax's per-file INFO lines."""
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("JAX_PLATFORMS", _jax_platforms())
    std_logging.getLogger("jax._src.xla_bridge").setLevel(std_logging.ERROR)
    logging.get_absl_handler().addFilter(_QuietOrbax())


def _jax_platforms() -> str:
    """"" (JAX's own choice) unless only the CPU can be used, when probing TPUs is noise."""
    has_accelerator = (os.path.exists("/dev/accel0") or os.path.exists("/dev/nvidia0")
                       or os.path.exists("/dev/vfio"))
    return "" if has_accelerator else "cpu"


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
