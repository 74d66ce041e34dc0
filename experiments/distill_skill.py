r"""Distils a skill file from a training run's failed trajectories.

  python -m experiments.distill_skill --workdir=RUN --out=skill.md
  python -m experiments.distill_skill --workdir=RUN --out=skill.md --model=smollm2-135m
  python -m experiments.distill_skill --workdir=RUN --out=skill.md \
      --llm_url=http://127.0.0.1:8000/v1 --llm_model=Qwen/Qwen3-8B

Reads RUN/trajectories/*.jsonl (training episodes; held-out ``eval_*`` files only with
``--include_eval``), keeps failed ones (at most one per task), asks the LLM for at most 3
lessons per failure, merges them in batches into one document of at most ``--max_lines``
lines and writes it with the provenance of each lesson (``agents.skills``). The LLM is the
run's model with its latest checkpointed parameters by default (``--params=base`` for the
model before training; ``--model`` for another model, with its own parameters), or an
OpenAI-compatible endpoint (``--llm_url`` and ``--llm_model``). Then train or evaluate
with ``--config.rollout.skill=skill.md``.
"""

import json
import os
import sys
from collections.abc import Sequence

from absl import app, flags

from agentic_esopt.agents import skills

_WORKDIR = flags.DEFINE_string("workdir", None, "Training workdir (its trajectories/ and "
                               "config.json are read).", required=True)
_OUT = flags.DEFINE_string("out", None, "Skill file to write.", required=True)
_MODEL = flags.DEFINE_string("model", None, "Model for models.load (default: the run's "
                             "model, from its config.json).")
_PARAMS = flags.DEFINE_enum("params", "run", ["run", "base"], "With the run's own model: "
                            "its latest checkpointed parameters (falling back to the base "
                            "ones when there is no checkpoint), or the base ones.")
_DTYPE = flags.DEFINE_string("dtype", None, "Parameter dtype (default: the run's, else "
                             "float32).")
_LLM_URL = flags.DEFINE_string("llm_url", None, "OpenAI-compatible endpoint (base URL such "
                               "as http://host:8000/v1, or its /chat/completions URL).")
_LLM_MODEL = flags.DEFINE_string("llm_model", None, "The endpoint's model name.")
_LLM_API_KEY_ENV = flags.DEFINE_string("llm_api_key_env", None, "Environment variable "
                                       "holding the endpoint's API key (none sent if unset).")
_MAX_LINES = flags.DEFINE_integer("max_lines", 80, "Line budget of the skill document.")
_BATCH_SIZE = flags.DEFINE_integer("batch_size", 8, "Prompts per LLM call and lessons per "
                                   "merge step.")
_MAX_FAILURES = flags.DEFINE_integer("max_failures", 64, "Analyse at most this many failed "
                                     "trajectories (the latest).")
_MAX_NEW_TOKENS = flags.DEFINE_integer("max_new_tokens", 256, "Reply length of a local "
                                       "model (max_tokens of an endpoint: twice this).")
_INCLUDE_EVAL = flags.DEFINE_bool("include_eval", False, "Also learn from held-out "
                                  "evaluation episodes (leaks them into the skill).")
_PROVENANCE = flags.DEFINE_enum("provenance", "inline", ["inline", "sidecar"], "Write the "
                                "lessons' provenance inside the skill file (an HTML comment "
                                "at its end) or in OUT.provenance.txt next to it.")


def run_config(workdir: str) -> dict:
    """The workdir's config.json as a dict ({} when it has none)."""
    path = os.path.join(workdir, "config.json")
    if not os.path.isfile(path):
        return {}
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _run_params(workdir: str, model):
    """The run's latest checkpointed parameters, or None (with the reason on stderr)."""
    # Imported here: the endpoint path needs neither the model stack nor training.
    from agentic_esopt import training  # pylint: disable=import-outside-toplevel
    try:
        files = training.RunFiles(workdir)
        config = training.checkpoint.load_config(files)
        state = training.checkpoint.restore_workdir_state(files, config, model.params)
    except (ValueError, OSError) as error:
        print(f"distill_skill: using the base parameters ({error})", file=sys.stderr)
        return None
    if state is None:
        print("distill_skill: no checkpoint; using the base parameters", file=sys.stderr)
        return None
    return state.params


def make_llm(workdir: str) -> tuple[skills.LLM, str]:
    """The LLM the flags ask for, and a description of it."""
    if _LLM_URL.value or _LLM_MODEL.value:
        if not (_LLM_URL.value and _LLM_MODEL.value):
            raise app.UsageError("--llm_url and --llm_model go together")
        api_key = os.environ.get(_LLM_API_KEY_ENV.value) if _LLM_API_KEY_ENV.value else None
        llm = skills.endpoint_llm(_LLM_URL.value, _LLM_MODEL.value, api_key=api_key,
                                  max_tokens=2 * _MAX_NEW_TOKENS.value)
        return llm, f"{_LLM_MODEL.value} at {_LLM_URL.value}"
    from agentic_esopt import models  # pylint: disable=import-outside-toplevel
    model_config = run_config(workdir).get("model", {})
    name = _MODEL.value or model_config.get("name")
    if not name:
        raise app.UsageError(f"{workdir} has no config.json naming a model; pass --model")
    dtype = _DTYPE.value or model_config.get("dtype") or "float32"
    model = models.load(name, dtype=dtype)
    own_model = _MODEL.value is None or _MODEL.value == model_config.get("name")
    params = _run_params(workdir, model) if own_model and _PARAMS.value == "run" else None
    description = f"{name} ({'run' if params is not None else 'base'} parameters)"
    return skills.model_llm(model, params, max_new_tokens=_MAX_NEW_TOKENS.value,
                            batch_size=_BATCH_SIZE.value), description


def main(argv: Sequence[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    if _MAX_LINES.value < 1 or _BATCH_SIZE.value < 1:
        raise app.UsageError("--max_lines and --batch_size must be >= 1")
    workdir = _WORKDIR.value
    paths = skills.trajectory_files(os.path.join(workdir, "trajectories"),
                                    include_eval=_INCLUDE_EVAL.value)
    if not paths:
        raise app.UsageError(f"no trajectory files in {os.path.join(workdir, 'trajectories')}")
    trajectories = skills.load_trajectories(paths)
    llm, description = make_llm(workdir)
    skill = skills.distill(trajectories, llm, max_lines=_MAX_LINES.value,
                           batch_size=_BATCH_SIZE.value, max_failures=_MAX_FAILURES.value)
    inline = _PROVENANCE.value == "inline"
    out_dir = os.path.dirname(os.path.abspath(_OUT.value))
    os.makedirs(out_dir, exist_ok=True)
    with open(_OUT.value, "w", encoding="utf-8") as f:
        f.write(skills.render(skill, provenance=inline))
    if not inline:
        with open(_OUT.value + ".provenance.txt", "w", encoding="utf-8") as f:
            f.write(skills.render_provenance(skill))
    print(json.dumps({"out": _OUT.value, "llm": description,
                      "trajectories": len(trajectories),
                      "failures": len(skills.select_failures(trajectories,
                                                             _MAX_FAILURES.value)),
                      "lessons": len(skill.lessons), "lines": len(skill.lines)}))


if __name__ == "__main__":
    app.run(main)
