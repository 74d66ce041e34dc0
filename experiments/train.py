r"""Trains an LLM agent: any environment, any update rule, one loop.

  python -m experiments.train                                   # the cpu_default config
  python -m experiments.train --config=experiments/configs/sudoku_mask5.py \
      --workdir=workdirs/sudoku_mask5                           # the paper's 9×9, 5 blanks
  python -m experiments.train --config.model.name=tiny --config.run.generations=2 \
      --config.es.population_size=4 --config.eval.size=8 --workdir=/tmp/smoke

Any field of the config file can be overridden with a dotted flag. Every problem of every
section is reported before the model loads. Rerunning the same command resumes the run in
its workdir. With ``--config.distributed.*`` set, every process runs this same command
(``jax.distributed`` starts before anything touches a device); only process 0 prints.
"""

import dataclasses
from collections.abc import Sequence

import jax

from absl import app, flags

from agentic_esopt import sharding, targets, training
from agentic_esopt.models import published
from agentic_esopt.training import plan
from experiments import launch

_CONFIG = launch.define_config("experiments/configs/cpu_default.py")
_WORKDIR = flags.DEFINE_string("workdir", "workdirs/cpu_default",
                               "Folder for checkpoints, history, metrics and reports; "
                               "rerunning resumes there.")
_CHECK_PLAN = flags.DEFINE_bool("check_plan", True, "On an accelerator, compile the run's "
                                "programs before loading weights and stop if they do not fit "
                                "(experiments.plan).")
_DEVICE_MEMORY = flags.DEFINE_integer("device_memory_bytes", None, "Memory per device the "
                                      "plan is checked against (default: the device's); "
                                      "set, the check also runs on CPU.")


def check_plan(config: training.TrainConfig) -> None:
    """Stops (UsageError with the per-device figures) if the run's programs do not fit its
    devices; nothing is loaded (``training.plan``)."""
    target = targets.target("host")
    if not config.mesh.shape:  # One device of each process.
        target = dataclasses.replace(target, devices=tuple(
            jax.local_devices(process_index=p)[0] for p in range(jax.process_count())))
    if _DEVICE_MEMORY.value is not None:
        target = dataclasses.replace(target, device_memory_bytes=_DEVICE_MEMORY.value)
    result = plan.plan(config, published.model_config(config.model.name)[0], target,
                       plan.Shapes.of(config))
    if not result["fits"]:
        largest = max(result["programs"], key=lambda p: p["per_device_bytes"])
        raise app.UsageError(
            f"the run does not fit its devices: {largest['name']} needs "
            f"{result['per_device_bytes'] / 2**30:.2f} GiB per device of "
            f"{result['device_memory_bytes'] / 2**30:.2f} GiB; would fit with: "
            f"{'; '.join(result['suggestions'])} (experiments.plan shows every program; "
            f"--nocheck_plan skips this check)")


def main(argv: Sequence[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    config = launch.train_config(_CONFIG.value)
    sharding.initialize(config.distributed)
    if _CHECK_PLAN.value and (jax.default_backend() != "cpu" or _DEVICE_MEMORY.value):
        check_plan(config)
    result = training.train(config, _WORKDIR.value)
    if sharding.is_primary():
        print(training.report.summary_markdown(result.summary))


if __name__ == "__main__":
    launch.run(main)
