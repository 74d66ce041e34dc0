r"""Plans a run before booking hardware: its programs compiled for a target, not run.

  python -m experiments.plan --config=experiments/configs/sudoku_qwen3_5_4b.py \
      --model=qwen3.5-4b --target=tpu:v5e:2x4 --config.mesh.shape=data:2,model:4
  python -m experiments.plan --config=experiments/configs/cpu_default.py --target=cpu:8 \
      --config.mesh.shape=data:4,model:2 --json

Takes ``experiments.train``'s config file and dotted overrides, plus ``--target``
(``cpu:N``, ``host``, ``tpu:GENERATION:TOPOLOGY``; TPU targets need ``pip install -e
".[tpu]"``) and ``--model`` (a name of ``models.published``, a folder with a
``config.json``, or the config's own ``model.name``). Prints a table per program (memory
per device against the chip's, FLOPs, bytes, seconds at the chip's peaks, distance from
the ideal) and the verdict, or one JSON object with ``--json``. Nothing is allocated and no
weights are read (``training.plan``).

``--execute`` also runs one ES generation of the model with random weights on this host's
devices (the target must be ``cpu:N`` or ``host``), through the trainer's own code path,
and reports its wall time and its measured memory peak beside the plan's (``comparison``:
a device's ``peak_bytes_in_use`` on GPU and TPU, the process's peak RSS on CPU).
"""

import os
import sys


def _prepare_devices(argv: list[str]) -> None:
    """Before JAX starts: ``cpu:N`` gets N host devices; other non-host targets keep JAX
    on the CPU; libtpu stays quiet on machines without TPUs."""
    target = next((a.split("=", 1)[1] for a in argv if a.startswith("--target=")), "host")
    if target.startswith("cpu:") and target[4:].isdigit():
        flag = f"--xla_force_host_platform_device_count={target[4:]}"
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {flag}".strip()
    if target != "host":
        os.environ.setdefault("JAX_PLATFORMS", "cpu")


_prepare_devices(sys.argv)

# pylint: disable=wrong-import-position  # XLA_FLAGS must be set before JAX starts.
import dataclasses  # noqa: E402
import json  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Sequence  # noqa: E402

import jax  # noqa: E402
from absl import app, flags  # noqa: E402

from agentic_esopt import targets  # noqa: E402
from agentic_esopt.models import published  # noqa: E402
from agentic_esopt.training import plan as plan_lib  # noqa: E402
from experiments import launch  # noqa: E402

targets.libtpu_off_tpu()
_CONFIG = launch.define_config("experiments/configs/cpu_default.py")
_TARGET = flags.DEFINE_string("target", "host", "cpu:N, host, or tpu:GENERATION:TOPOLOGY "
                                                "(e.g. tpu:v5e:2x4, tpu:v5p:4x4x4).")
_MODEL = flags.DEFINE_string("model", None, f"Model shapes: one of {published.names()}, a "
                                            "folder with a config.json, a GGUF or tiny "
                                            "(default: the config's model.name).")
_PROMPT_TOKENS = flags.DEFINE_integer("prompt_tokens", None, "Tokens of a turn's longest "
                                                             "prompt (default: "
                                                             "rollout.max_context less the "
                                                             "reply, else 1024).")
_JSON = flags.DEFINE_bool("json", False, "Print one JSON object.")
_EXECUTE = flags.DEFINE_bool("execute", False, "Also run one ES generation with random "
                                               "weights on this host and measure it.")


def make_plan(config, model: str | None, target_name: str, prompt_tokens: int | None) -> dict:
    """The plan of a checked config; ValueError (one line) for bad input."""
    model_config, source = published.model_config(model or config.model.name)
    target = targets.target(target_name)
    result = plan_lib.plan(config, model_config, target,
                           plan_lib.Shapes.of(config, prompt_tokens))
    return dict(model=model or config.model.name, model_source=source, **result)


def _gib(n: float | None) -> str:
    return "-" if n is None else f"{n / 2**30:.2f}"


def table(result: dict) -> str:
    """The plan as a text table and a verdict."""
    lines = [f"{result['model']} ({result['num_params'] / 1e9:.2f}B, {result['dtype']}) "
             f"rule={result['rule']} on {result['target']} ({result['device_kind']}, "
             f"{result['devices']} devices, {result['processes']} processes), mesh "
             f"{result['mesh']} (one process: {result['process_mesh']}), rules "
             f"{result['rules']}",
             f"{'program':<16}{'args GiB':>9}{'out':>7}{'temp':>7}{'resid':>7}{'total':>7}"
             f"{'GFLOP':>10}{'calls':>8}{'s/gen':>9}{'M/ideal':>8}{'XLA/2N':>8}"]
    for p in result["programs"]:
        ratio = [f"{r:.2f}" if r else "-" for r in (p["held_over_ideal"],
                                                    p["xla_flops_over_model"])]
        seconds = "-" if p["seconds"] is None else f"{p['seconds']:.3g}"
        lines.append(f"{p['name']:<16}{_gib(p['argument_bytes']):>9}{_gib(p['output_bytes']):>7}"
                     f"{_gib(p['temp_bytes']):>7}{_gib(p['resident_bytes']):>7}"
                     f"{_gib(p['per_device_bytes']):>7}{p['flops'] / 1e9:>10.1f}"
                     f"{p['calls']:>8.0f}{seconds:>9}{ratio[0]:>8}{ratio[1]:>8}")
    seconds = result["seconds_per_generation"]
    lines.append(f"per device: {_gib(result['per_device_bytes'])} GiB of "
                 f"{_gib(result['device_memory_bytes'])} GiB; "
                 f"{result['flops_per_generation'] / 1e12:.3g} TFLOP and "
                 f"{result['bytes_per_generation'] / 1e9:.3g} GB per device per generation"
                 + ("" if seconds is None else f", ~{seconds:.3g} s at the chip's peaks"))
    if result["fits"]:
        lines.append("verdict: fits")
    else:
        lines.append(f"verdict: does not fit by {_gib(result['excess_bytes'])} GiB per "
                     "device; would fit with: " + "; ".join(result["suggestions"]))
        if result["compile_error"]:
            lines.append(f"the compiler refused a program: {result['compile_error']}")
    return "\n".join(lines)


def execute(config, result: dict) -> dict:
    """One ES generation with random weights on this host, through the trainer's code path
    (the rule's init and step on the env's reward source), measured."""
    # pylint: disable=import-outside-toplevel  # Only --execute needs these.
    from agentic_esopt import models, sharding
    from agentic_esopt.models import tiny
    from agentic_esopt.training import config as config_lib, files, rules, trainer

    rss_before = targets.peak_rss_bytes()
    layout = sharding.layout(config.mesh)
    model_config = plan_lib.resolve_layout(
        published.model_config(result["model"])[0], targets.target(result["target"]))
    began = time.perf_counter()
    model = models.Model(model_config,  # no other reference, so the trainer can drop them
                         plan_lib.random_params(model_config, config.model.dtype, layout),
                         tiny.tiny_tokenizer())
    weights_s = time.perf_counter() - began
    rule = rules.make(config)
    with tempfile.TemporaryDirectory() as workdir:
        source = trainer.make_reward_source(config, files.RunFiles(workdir), models.generate,
                                            rule.search_members)
        began = time.perf_counter()
        state = rule.init(model.params)
        model = dataclasses.replace(model, params=None)  # as the trainer drops them
        key = config_lib.sampling_key(config, config_lib.TRAIN_SAMPLING_STREAM, 0)
        _, step = rule.step(state, source, model, key, None)
        jax.block_until_ready(step.metrics)
        generation_s = time.perf_counter() - began
        source.close()
    measured = dict(weights_s=weights_s, generation_s=generation_s,
                    rss_before_bytes=rss_before, peak_rss_bytes=targets.peak_rss_bytes(),
                    device_peak_bytes=_device_peak_bytes(),
                    forward_tokens=step.rewards.metrics.get("forward_tokens"),
                    rewards=[float(r) for r in step.rewards.rewards])
    return dict(measured, comparison=plan_lib.compare_peak(result, measured))


def _device_peak_bytes() -> int | None:
    """The largest ``peak_bytes_in_use`` of this process's devices, where the backend keeps
    it (GPU, TPU); None on CPU, whose devices report no memory statistics."""
    peaks = [(d.memory_stats() or {}).get("peak_bytes_in_use") for d in jax.local_devices()]
    peaks = [peak for peak in peaks if peak is not None]
    return max(peaks) if peaks else None


def main(argv: Sequence[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    config_dict = _CONFIG.value
    if _MODEL.value:  # The shapes come from --model: no weights need to exist.
        config_dict.model.name = "tiny"
    config = launch.train_config(config_dict)
    try:
        result = make_plan(config, _MODEL.value, _TARGET.value, _PROMPT_TOKENS.value)
    except ValueError as error:
        raise app.UsageError(str(error).replace("\n", " ")) from None
    if _EXECUTE.value:
        if not (_TARGET.value == "host" or _TARGET.value.startswith("cpu:")):
            raise app.UsageError("--execute runs on this host: --target=cpu:N or host")
        result["execute"] = execute(config, result)
    print(json.dumps(result) if _JSON.value else table(result))


if __name__ == "__main__":
    launch.run(main)
