"""Trains the example environment with the example rule, both registered from here.

    python -m experiments.train --config=PATH/TO/examples/config.py --workdir=DIR

The launcher puts this file's folder last on ``sys.path``, so the modules beside it
import from any working directory.
"""

import guess_env
import hill_climb
from agentic_esopt import envs
from agentic_esopt.training import rules
from experiments.configs import common

envs.registry.register("guess", guess_env)
rules.register("hill_climb", hill_climb)


def get_config():
    return common.base_config(
        "guess", env=dict(level=1), rule=dict(name="hill_climb", sigma=1e-3),
        model=dict(name="smollm2-135m"),
        rollout=dict(tasks_per_generation=2, max_new_tokens=4, temperature=0.0),
        eval=dict(size=4), run=dict(generations=4, eval_every=4, checkpoint_every=1))
