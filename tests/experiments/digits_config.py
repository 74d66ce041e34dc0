"""A config file for the toy digits environment: ``digits_env.TINY``."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "training"))

import digits_env  # pylint: disable=wrong-import-position  # registers "digits"
from experiments.configs import common  # pylint: disable=wrong-import-position


def get_config():
    values = {name: dict(section) for name, section in digits_env.TINY_VALUES.items()}
    values["env"].pop("name")
    return common.base_config("digits", **values)
