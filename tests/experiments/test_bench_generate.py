"""bench_generate's contract: per batch size, decode's time against its FLOP and memory
roofline measured in the same run; the roofline's byte count follows the cache's growth."""

import json
import os
import subprocess
import sys

import pytest

from agentic_esopt.models import tiny
from experiments import bench_generate

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_decode_bytes_count_weights_once_per_step_and_every_real_cached_key():
    config = tiny.tiny_model_parts(seed=0)[0]
    per_key = 2 * config.num_layers * config.num_kv_heads * config.head_dim * 4
    weights = bench_generate.matmul_params(config) * 4
    # 2 steps after a 3-token prompt: keys 4 then 5, for each of 2 rows.
    assert bench_generate.decode_bytes(config, 2, 3, 2, 4) == 2 * weights + 2 * per_key * 9


def test_bench_generate_reports_decode_against_its_roofline():
    done = subprocess.run([sys.executable, "-m", "experiments.bench_generate", "--model=tiny",
                           "--batch_sizes=1,4", "--torch=false", "--qwen3_5=false",
                           "--population_size=2", "--rows_per_member=2",
                           "--sequential_members=2", "--prompt_len=16", "--new_tokens=8",
                           "--repeats=1", "--json"],
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
    bytes_read = {b: e["decode_bytes_read"] for b, e in report["batches"].items()}
    assert bytes_read["4"] > bytes_read["1"]
