"""``experiments.train`` with the toy digits environment added (for subprocess tests)."""

import functools
import os
import sys

from absl import app

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "training"))

import digits_env  # pylint: disable=wrong-import-position
from experiments import train  # pylint: disable=wrong-import-position

if __name__ == "__main__":
    app.run(functools.partial(train.main, envs=digits_env.ENVS))
