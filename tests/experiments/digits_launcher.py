"""``experiments.train`` with the toy digits environment registered (for subprocess tests)."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "training"))

import digits_env  # pylint: disable=wrong-import-position,unused-import  # registers "digits"
from experiments import launch, train  # pylint: disable=wrong-import-position

if __name__ == "__main__":
    launch.run(train.main)
