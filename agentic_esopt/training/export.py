"""A run's parameters as a Hugging Face checkpoint folder (``models.save_pretrained``).

The parameters of any generation: the newest usable checkpoint by default; for an
earlier generation the checkpoint of that step, or else a bitwise replay of the es
history from the initial parameters. The folder also gets the run's sampling settings as
``generation_config.json`` and a README naming the base model, the environment, the
generations, the held-out result and the command that made it.

A run that trained LoRA adapters (``es.scope=lora``) is written as a PEFT adapter folder
(``models.save_adapter``: adapter files and the README), or, with ``merged``, as a plain
checkpoint of the weights with the adapters folded in (W + scale · A B).
"""

from __future__ import annotations

import json
import os
from typing import Any

from agentic_esopt import models
from agentic_esopt.models import lora
from agentic_esopt.training import rules
from agentic_esopt.training.checkpoint import Checkpointer, load_config
from agentic_esopt.training.config import TrainConfig
from agentic_esopt.training.files import RunFiles


def run_params(files: RunFiles, config: TrainConfig, initial_params: Any,
               generation: int | None = None) -> tuple[Any, int]:
    """(parameters, generation) of a run after ``generation`` generations (default: the
    newest checkpoint's).

    Raises:
      FileNotFoundError: the run holds that generation in no checkpoint and no history.
    """
    rule = rules.make(config)
    template = rule.init(initial_params)
    checkpointer = Checkpointer(files.checkpoints)
    try:
        steps = checkpointer.steps()
        if generation is None:
            restored = checkpointer.restore_latest(template)
        elif generation in steps:
            restored = checkpointer.restore(generation, template)
        else:
            restored = None
    finally:
        checkpointer.close()
    if restored is not None:
        return restored[0].params, int(restored[0].generation)
    if generation == 0:
        return template.params, 0
    history = rule.history(files.history)
    header, records, _ = history.read() if history else (None, [], None)
    wanted = len(records) if generation is None else generation
    if not 1 <= wanted <= len(records):
        raise FileNotFoundError(
            f"{files.workdir}: no parameters for generation "
            f"{'(newest)' if generation is None else generation}: checkpoints hold "
            f"{steps or 'none'}, the history holds {len(records)} generations")
    return history.replay(template, header, records[:wanted]).params, wanted


LOAD_CHECKPOINT = ("Serve it with `vllm serve <this folder>`, or load it with "
                   "`transformers.AutoModelForCausalLM.from_pretrained(<this folder>)`.")
LOAD_ADAPTER = ("Apply it to the base model with `peft.PeftModel.from_pretrained(<the base "
                "model in transformers>, <this folder>)`; `python -m experiments.export "
                "--workdir=<run> --out=<dir> --step=0 --merged` writes the base model as a "
                "checkpoint folder, and `--merged` alone the adapted weights.")


def readme(config: TrainConfig, files: RunFiles, generation: int, command: str,
           how_to_load: str = LOAD_CHECKPOINT) -> str:
    """The exported folder's README.md."""
    lines = [f"# Fine-tuned with agentic_esopt ({config.rule_name})", "",
             f"- Base model: `{config.model.name}`",
             f"- Environment: `{config.env_name}` {json.dumps(config.to_dict()['env'])}",
             f"- Generations: {generation} of {config.run.generations}"]
    if os.path.isfile(files.summary_markdown):
        with open(files.summary_markdown, encoding="utf-8") as f:
            lines += ["", "## Held-out result of the run", "", f.read().strip()]
    lines += ["", "## Made by", "", f"```\n{command}\n```", "", how_to_load]
    return "\n".join(lines) + "\n"


def export_run(workdir: str, out_dir: str, *, generation: int | None = None,
               dtype: str | None = None, merged: bool = False, command: str = "") -> str:
    """Writes a run's parameters as a HF checkpoint or PEFT adapter folder (see the
    module docstring).

    Args:
      workdir: a folder made by ``training.train``.
      out_dir: the folder to create (must not exist, or be empty).
      generation: export the parameters after this many generations (default: newest).
      dtype: "float32", "bfloat16" or "float16" (default: the run's).
      merged: a LoRA run's adapters folded into the weights (a checkpoint folder) instead
        of an adapter folder.
      command: the command line recorded in the README.

    Returns:
      ``out_dir``.

    Raises:
      ValueError: ``merged`` for a run without LoRA adapters.
    """
    files = RunFiles(workdir)
    config = load_config(files)
    model = models.load(config.model.name, dtype=config.model.dtype)
    params, generation = run_params(files, config, model.params, generation)
    adapted = bool(lora.adapted(params))
    if merged and not adapted:
        raise ValueError(f"merged applies to runs that trained LoRA adapters "
                         f"(es.scope=lora), not to {workdir}")
    if adapted and not merged:
        models.save_adapter(model.config, params, out_dir,
                            base_model_name_or_path=config.model.name, dtype=dtype,
                            readme=readme(config, files, generation, command, LOAD_ADAPTER))
        return out_dir
    if merged:
        params = lora.merge(params)
    sampling = dict(temperature=config.eval.temperature, top_p=config.rollout.top_p,
                    max_new_tokens=config.rollout.max_new_tokens)
    if config.rollout.top_k:
        sampling["top_k"] = config.rollout.top_k
    models.save_pretrained(model, out_dir, params=params, dtype=dtype,
                           generation_config=sampling,
                           readme=readme(config, files, generation, command))
    return out_dir
