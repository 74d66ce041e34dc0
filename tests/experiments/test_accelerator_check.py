"""The accelerator check composes the three benchmarks into one JSON object; each
benchmark's contract is checked on its part of one ``--sizes=smoke`` run (every benchmark
a real ``--json`` run in its own process, on the tiny model)."""

import json
import os
import subprocess
import sys

import pytest

from agentic_esopt.models import tiny

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def report(fast_compile_env):
    done = subprocess.run([sys.executable, "-m", "experiments.accelerator_check",
                           "--sizes=smoke"], cwd=REPO, env=fast_compile_env,
                          capture_output=True, text=True, timeout=900, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    (line,) = done.stdout.strip().splitlines()
    return json.loads(line)


def test_the_check_prints_one_object_with_every_benchmark(report):
    assert report["backend"] == "cpu" and report["devices"]
    for name in ("bench_generate", "bench_generate_per_layer", "bench_memory",
                 "bench_rollout", "plan"):
        assert "error" not in report[name], report[name]
        assert report[name]["seconds"] > 0


def test_bench_generate_runs_in_both_cache_layouts(report):
    """The same batches and population timed in the stacked and the per-layer KV cache
    layouts, each run saying which it used."""
    stacked, per_layer = (report[name]["result"] for name in ("bench_generate",
                                                              "bench_generate_per_layer"))
    assert (stacked["cache_layout"], per_layer["cache_layout"]) == ("stacked", "per_layer")
    assert set(stacked["batches"]) == set(per_layer["batches"]) == {"1", "4"}
    for result in (stacked, per_layer):
        assert all(entry["decode_tokens_per_s"] > 0 for entry in result["batches"].values())
        assert result["population"]["lowrank_decode_tokens_per_s"] > 0


def test_bench_generate_reports_decode_against_its_roofline(report):
    """Per batch size, decode's time against its FLOP and memory roofline measured in the
    same run, the bytes counting every weight once per step and every real cached key and
    value."""
    result = report["bench_generate"]["result"]
    assert result["memory_read_gbps"] > 0 and result["matmul_gflops"] > 0
    for batch, entry in result["batches"].items():
        roofline = max(entry["decode_gflops"] * entry["decode_s"] / result["matmul_gflops"],
                       entry["decode_bytes_read"] / 1e9 / result["memory_read_gbps"])
        assert entry["decode_roofline_s"] == pytest.approx(roofline, rel=1e-9), batch
        assert entry["decode_fraction_of_roofline"] == pytest.approx(roofline / entry["decode_s"],
                                                                   rel=1e-9)
    # Three more rows read three more rows of cache: keys PROMPT+1 .. PROMPT+NEW each step.
    prompt, new = result["prompt_len"], result["new_tokens"]
    config = tiny.tiny_model_parts()[0]
    per_key = 2 * config.num_layers * config.num_kv_heads * config.head_dim * 4
    keys = sum(range(prompt + 1, prompt + new + 1))
    bytes_read = {b: e["decode_bytes_read"] for b, e in result["batches"].items()}
    assert set(bytes_read) == {"1", "4"}
    assert bytes_read["4"] - bytes_read["1"] == 3 * per_key * keys
    weights = bytes_read["1"] - per_key * keys
    assert weights == new * 4 * result["matmul_params"]


def test_bench_memory_prints_both_peaks_and_their_ratio(report):
    """One JSON object per model with both peaks, their ratio and the population
    inference's peak."""
    result = report["bench_memory"]["result"]
    assert isinstance(result, dict)  # One JSON line for the one model.
    assert result["model"] == "tiny" and result["rows"] == 2
    assert result["es_peak_bytes"] == max(result["es_programs"].values())
    assert result["grpo_peak_bytes"] == max(result["grpo_programs"].values())
    assert result["ratio"] == result["grpo_peak_bytes"] / result["es_peak_bytes"] > 1
    # tell donates the state and updates leaf by leaf: ES runs at inference-level memory.
    assert result["inference_peak_bytes"] == max(
        result["es_programs"][name] for name in ("deltas", "prefill", "decode"))
    assert result["es_peak_bytes"] <= 1.1 * result["inference_peak_bytes"], result
    # GRPO's rollout has the reference and AdamW's two moments beside it (ES: the members'
    # low-rank factors, far smaller).
    assert result["grpo_programs"]["decode"] - result["es_programs"]["decode"] > (
        2.5 * result["param_bytes"])
    for method in ("es_run", "grpo_run"):
        run = result[method]
        assert run["peak_rss_bytes"] >= run["rss_before_bytes"] > 0


def test_bench_rollout_reports_both_paths_on_the_same_replies(report):
    """Kept caches and re-prefilling give the same replies; the JSON has every turn's time
    and the interpolated re-prefill total."""
    result = report["bench_rollout"]["result"]
    assert result["replies_match"] is True
    assert len(result["kept_turn_seconds_all"]) == result["turns"] == 2
    assert set(result["reprefill_turn_seconds"]) == {"1", "2"}
    assert result["prompt_tokens_row0"]["2"] > result["prompt_tokens_row0"]["1"]
    assert result["total_speedup"] == (result["reprefill_total_seconds_interpolated"]
                                       / result["kept_total_seconds"])


def test_plan_execute_puts_the_measured_peak_beside_the_plan(report):
    """On CPU devices (no memory statistics) the process's peak RSS stands against the
    plan's per-device total on every device plus the RSS before the weights."""
    result = report["plan"]["result"]
    measured = result["execute"]
    assert measured["device_peak_bytes"] is None and measured["generation_s"] > 0
    comparison = measured["comparison"]
    assert comparison["predicted_peak_bytes"] == (
        result["per_device_bytes"] * result["devices"] + measured["rss_before_bytes"])
    assert comparison["measured_peak_bytes"] == measured["peak_rss_bytes"]
    assert comparison["measured_over_predicted"] == pytest.approx(
        measured["peak_rss_bytes"] / comparison["predicted_peak_bytes"])
