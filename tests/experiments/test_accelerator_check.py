"""The accelerator check composes the three benchmarks into one JSON object."""

import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_check_prints_one_object_with_every_benchmark():
    done = subprocess.run([sys.executable, "-m", "experiments.accelerator_check",
                           "--sizes=smoke"], cwd=REPO, capture_output=True, text=True,
                          timeout=900, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    (line,) = done.stdout.strip().splitlines()
    report = json.loads(line)
    assert report["backend"] == "cpu" and report["devices"]
    for name in ("bench_generate", "bench_memory", "bench_rollout"):
        assert "error" not in report[name], report[name]
        assert report[name]["seconds"] > 0
    assert report["bench_memory"]["result"]["model"] == "tiny"
    assert report["bench_rollout"]["result"]["replies_match"] is True
    assert report["bench_generate"]["result"]["batches"]
