"""bench_memory's contract: one JSON object per model with both peaks, their ratio and the
population inference's peak."""

import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_bench_memory_prints_both_peaks_and_their_ratio():
    done = subprocess.run([sys.executable, "-m", "experiments.bench_memory", "--models=tiny",
                           "--rows=2", "--prompt_len=16", "--new_tokens=4", "--json"],
                          cwd=REPO, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    (line,) = done.stdout.strip().splitlines()
    report = json.loads(line)
    assert report["model"] == "tiny" and report["rows"] == 2
    assert report["es_peak_bytes"] == max(report["es_programs"].values())
    assert report["grpo_peak_bytes"] == max(report["grpo_programs"].values())
    assert report["ratio"] == report["grpo_peak_bytes"] / report["es_peak_bytes"] > 1
    # tell donates the state and updates leaf by leaf: ES runs at inference-level memory.
    assert report["inference_peak_bytes"] == max(
        report["es_programs"][name] for name in ("deltas", "prefill", "decode"))
    assert report["es_peak_bytes"] <= 1.1 * report["inference_peak_bytes"], report
    # GRPO's rollout has the reference and AdamW's two moments beside it (ES: the members'
    # low-rank factors, far smaller).
    assert report["grpo_programs"]["decode"] - report["es_programs"]["decode"] > (
        2.5 * report["param_bytes"])
    for method in ("es_run", "grpo_run"):
        run = report[method]
        assert run["peak_rss_bytes"] >= run["rss_before_bytes"] > 0
