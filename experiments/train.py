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

from collections.abc import Sequence

from absl import app, flags

from agentic_esopt import sharding, training
from experiments import launch

_CONFIG = launch.define_config("experiments/configs/cpu_default.py")
_WORKDIR = flags.DEFINE_string("workdir", "workdirs/cpu_default",
                               "Folder for checkpoints, history, metrics and reports; "
                               "rerunning resumes there.")


def main(argv: Sequence[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    config = launch.train_config(_CONFIG.value)
    sharding.initialize(config.distributed)
    result = training.train(config, _WORKDIR.value)
    if sharding.is_primary():
        print(training.report.summary_markdown(result.summary))


if __name__ == "__main__":
    launch.run(main)
