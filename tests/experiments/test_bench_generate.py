"""bench_generate's contract: per batch size, decode's time against its FLOP and memory
roofline measured in the same run, the bytes counting every weight once per step and every
real cached key and value."""

import json
import os
import subprocess
import sys

import pytest

from agentic_esopt.models import tiny

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROMPT, NEW = 16, 8


def test_bench_generate_reports_decode_against_its_roofline():
    # A subprocess: the benchmark's absl flags would clash with other benchmarks' here.
    done = subprocess.run([sys.executable, "-m", "experiments.bench_generate", "--model=tiny",
                           "--batch_sizes=1,4", "--torch=false", "--qwen3_5=false",
                           "--population_size=2", "--rows_per_member=2",
                           "--sequential_members=2", f"--prompt_len={PROMPT}",
                           f"--new_tokens={NEW}", "--repeats=1", "--json"],
                          cwd=REPO, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["memory_read_gbps"] > 0 and report["matmul_gflops"] > 0
    for batch, entry in report["batches"].items():
        roofline = max(entry["decode_gflops"] * entry["decode_s"] / report["matmul_gflops"],
                       entry["decode_bytes_read"] / 1e9 / report["memory_read_gbps"])
        assert entry["decode_roofline_s"] == pytest.approx(roofline, rel=1e-9), batch
        assert entry["decode_fraction_of_roofline"] == pytest.approx(roofline / entry["decode_s"],
                                                                   rel=1e-9)
    # Three more rows read three more rows of cache: keys PROMPT+1 .. PROMPT+NEW each step.
    config = tiny.tiny_model_parts()[0]
    per_key = 2 * config.num_layers * config.num_kv_heads * config.head_dim * 4
    keys = sum(range(PROMPT + 1, PROMPT + NEW + 1))
    bytes_read = {b: e["decode_bytes_read"] for b, e in report["batches"].items()}
    assert bytes_read["4"] - bytes_read["1"] == 3 * per_key * keys
    weights = bytes_read["1"] - per_key * keys
    assert weights == NEW * 4 * report["matmul_params"]
