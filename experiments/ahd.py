r"""Automatic heuristic design: one EoH / Sample run (with or without ES on the LLM), or
the score of one program.

The run is the trainer with the AHD config (``experiments.train`` does the same); at the
end one JSON line with the final evaluation is printed: the best heuristic's objective on
the held-out instances and the seed heuristic's (the baseline). Rerunning resumes.

  python -m experiments.ahd --config.env.task=tsp_constructive --config.env.size=20 \
      --config.env.search=sample --workdir=workdirs/ahd/tsp20_sample_es

Score one program file on the held-out instances (one JSON line {valid, objective, error}):

  python -m experiments.ahd --task=kp_constructive --size=50 --score_program=heuristic.py
"""

import contextlib
import json
import os
import sys

from absl import app, flags

from agentic_esopt import envs, training
from experiments import launch

_CONFIG = launch.define_config("experiments/configs/ahd.py")
_WORKDIR = flags.DEFINE_string("workdir", "workdirs/ahd/run", "Run directory; rerunning "
                                                              "resumes there.")
_TASK = flags.DEFINE_string("task", None, "Shorthand for --config.env.task.")
_SIZE = flags.DEFINE_integer("size", None, "Shorthand for --config.env.size.")
_SCORE_PROGRAM = flags.DEFINE_string("score_program", None, "Only score this Python file on "
                                     "the held-out instances and print one JSON line.")


def checked_config() -> training.TrainConfig:
    """The config file with the shorthand flags applied, checked before any compute."""
    values = _CONFIG.value.to_dict()
    shorthand = {"task": _TASK.value, "size": _SIZE.value}
    values["env"].update({k: v for k, v in shorthand.items() if v is not None})
    try:
        config = training.TrainConfig.from_dict(values)
    except ValueError as error:
        raise app.UsageError(str(error)) from error
    if config.env_name != "ahd":
        raise app.UsageError(f"experiments.ahd runs the 'ahd' environment, not "
                             f"{config.env_name!r}")
    return config


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    config = checked_config()
    if _SCORE_PROGRAM.value is not None:
        if not os.path.isfile(_SCORE_PROGRAM.value):
            raise app.UsageError(f"--score_program: no file {_SCORE_PROGRAM.value!r}")
        with open(_SCORE_PROGRAM.value, encoding="utf-8", errors="replace") as file:
            source = file.read()
        with contextlib.redirect_stdout(sys.stderr):
            scored = envs.registry.make_from_options("ahd", config.env,
                                                     config.splits).score(source)
        print(json.dumps(scored), flush=True)
        return
    with contextlib.redirect_stdout(sys.stderr):
        result = training.train(config, _WORKDIR.value)
    print(json.dumps(result.summary["final_eval"]), flush=True)


if __name__ == "__main__":
    launch.run(main)
