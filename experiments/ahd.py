r"""Automatic heuristic design with EoH / Sample, with or without ES on the LLM.

One run: the search (and, for --method=eoh_es / sample_es, ES on the model) in --workdir,
then the best heuristic and the task's seed heuristic (the baseline) are scored on the
evaluation instances; a JSON summary is printed. Rerunning the same command resumes.

  python -m experiments.ahd --task=tsp_constructive --size=20 --method=sample_es \
      --budget=16 --workdir=workdirs/ahd/tsp20_sample_es

Score one program file on the evaluation instances (one JSON line on stdout):

  python -m experiments.ahd --task=kp_constructive --size=50 --score_program=heuristic.py
"""

import contextlib
import json
import os
import sys

from absl import app, flags

from agentic_esopt.agents import coevolution

for _name, _type, _default, _help in coevolution.field_specs():
    {bool: flags.DEFINE_boolean, int: flags.DEFINE_integer, float: flags.DEFINE_float,
     str: flags.DEFINE_string}[_type](_name, _default, _help)
flags.DEFINE_string("workdir", "workdirs/ahd/run", "Run directory; rerunning resumes there.")
flags.DEFINE_string("score_program", None, "Only score this Python file on the "
                                           "evaluation instances and print one JSON line.")
FLAGS = flags.FLAGS


def config_from_flags() -> coevolution.AHDConfig:
    """The run's config, checked (a UsageError, before any compute, if it is invalid)."""
    config = coevolution.AHDConfig(**{name: FLAGS[name].value
                                      for name, *_ in coevolution.field_specs()})
    try:
        return coevolution.check(config)
    except ValueError as error:
        raise app.UsageError(str(error)) from error


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    config = config_from_flags()
    if FLAGS.score_program is not None:
        if not os.path.isfile(FLAGS.score_program):
            raise app.UsageError(f"--score_program: no file {FLAGS.score_program!r}")
        with open(FLAGS.score_program, encoding="utf-8", errors="replace") as file:
            source = file.read()
        with contextlib.redirect_stdout(sys.stderr):
            result = coevolution.score_program(source, config)
        print(json.dumps(result), flush=True)
        return
    with contextlib.redirect_stdout(sys.stderr):
        summary = coevolution.run(config, FLAGS.workdir)
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    app.run(main)
