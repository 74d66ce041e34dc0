r"""Evaluates a training workdir on held-out tasks and prints JSON.

  python -m experiments.evaluate --workdir=workdirs/cpu_default          # latest checkpoint
  python -m experiments.evaluate --workdir=workdirs/cpu_default --base   # the base model
  python -m experiments.evaluate --workdir=... --eval_split=test --eval_size=128
  python -m experiments.evaluate --workdir=... --skill=skill.md          # without and with

Reports the mean reward and the success rate with standard errors. With ``--skill`` the
parameters are evaluated without and with the skill on the same tasks and sampling keys,
and the skill's effect is reported in pooled and paired standard errors. The workdir's
config gives the model, the environment and the rollout settings; nothing there is
modified.
"""

import json

from absl import flags

from agentic_esopt import envs, training
from experiments import launch

_WORKDIR = launch.define_workdir("Training workdir to evaluate.")
_BASE = flags.DEFINE_bool("base", False, "Evaluate the base model instead of the latest "
                          "checkpoint.")
_EVAL_SPLIT = flags.DEFINE_enum("eval_split", None, envs.base.EVAL_SPLITS,
                                "Held-out split (default: the run's).")
_EVAL_SIZE = flags.DEFINE_integer("eval_size", None, "Held-out tasks (default: the run's).")
_EVAL_TEMPERATURE = flags.DEFINE_float("eval_temperature", None, "Sampling temperature "
                                       "(default: the run's).")
_SKILL = flags.DEFINE_string("skill", None, "A skill file appended to the system prompt: "
                             "evaluates without and with it.")


def evaluate() -> str:
    """The evaluation's JSON."""
    overrides = {name: flag.value for name, flag in (("split", _EVAL_SPLIT),
                                                     ("size", _EVAL_SIZE),
                                                     ("temperature", _EVAL_TEMPERATURE))
                 if flag.value is not None}
    if _SKILL.value is None:
        result = training.evaluate_workdir(_WORKDIR.value, _BASE.value, overrides)
    else:
        result = training.evaluate_skill_effect(_WORKDIR.value, _SKILL.value, _BASE.value,
                                                overrides)
    return json.dumps(result, indent=2)


if __name__ == "__main__":
    launch.run_tool(evaluate)
