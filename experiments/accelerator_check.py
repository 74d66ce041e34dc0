r"""One prepared accelerator check: generation, memory and rollout benchmarks in one go.

  python -m experiments.accelerator_check > accelerator.json     # on a GPU / TPU machine
  python -m experiments.accelerator_check --sizes=plan > plan.json

Runs ``bench_generate`` in both KV cache layouts (``bench_generate``: stacked, the
accelerators' default, with the Qwen3.5 row; ``bench_generate_per_layer``: the CPU
default's per-layer buffers), ``bench_memory`` and ``bench_rollout`` (each in its own
process, with its own time limit) at sizes that took 7.2 minutes on one H200 (2026-12-04;
the limits add up to 9.5, inside one 10-minute device command), and prints ONE JSON
object: where it ran (JAX backend and devices), each benchmark's own JSON result, the
seconds each took, and the error of any that failed (the others still run).
``--sizes=plan`` (issue 50's GPU comparison, a second device command) runs
``experiments.plan --target=host --execute`` for SmolLM2-135M and Qwen3.5-4B: each plan's
per-device memory beside the device's measured peak (``execute.comparison``).
``--sizes=smoke`` runs all of them on the tiny random model in about two minutes (for CPU
tests of the script itself).
"""

import json
import subprocess
import sys
import time

from absl import app, flags
import jax

GENERATE = ["--batch_sizes=1,8,64", "--prompt_len=128", "--new_tokens=64",
            "--population_size=32", "--rows_per_member=2", "--repeats=2", "--torch=false"]
# The population's rows (4 members x 1 row) and the sequential member's row reuse the
# batches' compiled shapes.
GENERATE_SMOKE = ["--model=tiny", "--batch_sizes=1,4", "--prompt_len=16", "--new_tokens=8",
                  "--population_size=4", "--rows_per_member=1", "--sequential_members=1",
                  "--repeats=1", "--torch=false", "--qwen3_5=false"]
# One ES generation of a model with random weights on this machine's devices beside its plan
# (``experiments.plan --execute``): G = 2, one task, one turn of 4 tokens.
EXECUTE = ["--target=host", "--execute", "--config.es.population_size=2",
           "--config.rollout.tasks_per_generation=1", "--config.rollout.max_turns=1",
           "--config.rollout.max_new_tokens=4", "--config.eval.size=1"]
SUDOKU_4B = ["--config=experiments/configs/sudoku_qwen3_5_4b.py", "--prompt_tokens=256"]
SIZES = {
    # report name -> (benchmark, arguments, time limit in seconds); the limits add up to
    # 9.5 minutes. Seconds taken on one H200 (2026-12-04): 94, 82, 188, 67.
    "accelerator": {
        "bench_generate": ("bench_generate", [*GENERATE, "--cache_layout=stacked"], 130),
        "bench_generate_per_layer": ("bench_generate", [*GENERATE, "--cache_layout=per_layer",
                                                        "--qwen3_5=false"], 100),
        "bench_memory": ("bench_memory", ["--models=smollm2-135m", "--rows=8"], 240),
        "bench_rollout": ("bench_rollout", ["--rows=64", "--turns=10",
                                            "--reprefill_turns=1,10"], 100),
    },
    # The planner's memory prediction against the device's measured peak: the embedded
    # SmolLM2 and the paper's Sudoku model (Qwen3.5-4B, bfloat16).
    "plan": {
        "plan_smollm2": ("plan", ["--config=experiments/configs/cpu_default.py",
                                  *EXECUTE], 200),
        "plan_qwen3.5-4b": ("plan", [*SUDOKU_4B, "--model=qwen3.5-4b", *EXECUTE], 360),
    },
    "smoke": {
        "bench_generate": ("bench_generate", [*GENERATE_SMOKE, "--cache_layout=stacked"], 300),
        "bench_generate_per_layer": ("bench_generate",
                                     [*GENERATE_SMOKE, "--cache_layout=per_layer"], 300),
        "bench_memory": ("bench_memory", ["--models=tiny", "--rows=2", "--prompt_len=16",
                                          "--new_tokens=4"], 300),
        "bench_rollout": ("bench_rollout", ["--model=tiny", "--rows=3", "--turns=2",
                                            "--obs_tokens=6", "--reply_tokens=3",
                                            "--reprefill_turns=1,2"], 300),
        "plan": ("plan", ["--config=experiments/configs/cpu_default.py", "--model=tiny",
                          "--prompt_tokens=16", *EXECUTE], 300),
    },
}

_SIZES = flags.DEFINE_enum("sizes", "accelerator", list(SIZES),
                           "accelerator: the benchmarks; plan: the planner against measured "
                           "peaks; smoke: all of them on the tiny model.")


def run_benchmark(name: str, arguments: list[str], limit_s: int) -> dict:
    """A benchmark's JSON result(s) (its last line, or every line for one per model)."""
    began = time.monotonic()
    try:
        done = subprocess.run([sys.executable, "-m", f"experiments.{name}", "--json",
                               *arguments], capture_output=True, text=True, timeout=limit_s,
                              check=False)
    except subprocess.TimeoutExpired:
        return dict(seconds=time.monotonic() - began, error=f"timed out after {limit_s} s")
    seconds = time.monotonic() - began
    if done.returncode != 0:
        return dict(seconds=seconds, error=done.stderr.strip().splitlines()[-1:])
    results = [json.loads(line) for line in done.stdout.strip().splitlines()
               if line.startswith("{")]
    return dict(seconds=seconds, result=results if len(results) > 1 else results[0])


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    report = dict(backend=jax.default_backend(),
                  devices=[str(device) for device in jax.devices()], sizes=_SIZES.value)
    for name, (benchmark, arguments, limit_s) in SIZES[_SIZES.value].items():
        report[name] = run_benchmark(benchmark, arguments, limit_s)
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    app.run(main)
