r"""Exports a training run's parameters as a Hugging Face checkpoint folder.

  python -m experiments.export --workdir=workdirs/cpu_default --out=exported/cpu_default
  python -m experiments.export --workdir=RUN --out=DIR --step=5 --dtype=bfloat16
  python -m experiments.export --workdir=LORA_RUN --out=DIR [--merged]

The folder loads with ``transformers.AutoModelForCausalLM.from_pretrained(DIR)`` and
``AutoTokenizer.from_pretrained(DIR)``, and serves with ``vllm serve DIR``. It is written
to a temporary folder and renamed at the end: a failed export leaves nothing behind. A
run of LoRA adapters (``--config.es.scope=lora``) is written as a PEFT adapter folder
(``peft.PeftModel.from_pretrained(base, DIR)``), or with ``--merged`` as a checkpoint of
the weights with the adapters folded in; ``--step=0 --merged`` writes the base model.
"""

import shlex
import sys

from absl import flags

from agentic_esopt import models
from agentic_esopt.training import export
from experiments import launch

_WORKDIR = launch.define_workdir("Training workdir.")
_OUT = flags.DEFINE_string("out", None, "Folder to write (must not exist).", required=True)
_STEP = flags.DEFINE_integer("step", None, "Export the parameters after this many "
                             "generations (default: the newest checkpoint).")
_DTYPE = flags.DEFINE_enum("dtype", None, list(models.loading.DTYPES), "Weight dtype "
                           "(default: the run's).")
_MERGED = flags.DEFINE_bool("merged", False, "LoRA runs (es.scope=lora): write the weights "
                            "with the adapters folded in, not a PEFT adapter folder.")


def export_run() -> str:
    """The exported folder (the command is recorded in it)."""
    command = "python -m experiments.export " + shlex.join(sys.argv[1:])
    return export.export_run(_WORKDIR.value, _OUT.value, generation=_STEP.value,
                             dtype=_DTYPE.value, merged=_MERGED.value, command=command)


if __name__ == "__main__":
    launch.run_tool(export_run)
