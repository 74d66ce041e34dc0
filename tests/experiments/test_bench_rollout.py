"""bench_rollout's contract: kept caches and re-prefilling give the same replies; the JSON
has every turn's time and the interpolated re-prefill total."""

import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_bench_rollout_reports_both_paths_on_the_same_replies():
    done = subprocess.run([sys.executable, "-m", "experiments.bench_rollout", "--model=tiny",
                           "--rows=3", "--turns=4", "--obs_tokens=6", "--reply_tokens=3",
                           "--reprefill_turns=1,4", "--json"],
                          cwd=REPO, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["replies_match"] is True
    assert len(report["kept_turn_seconds_all"]) == 4
    assert set(report["reprefill_turn_seconds"]) == {"1", "4"}
    assert report["prompt_tokens_row0"]["4"] > report["prompt_tokens_row0"]["1"]
    assert report["total_speedup"] == (report["reprefill_total_seconds_interpolated"]
                                       / report["kept_total_seconds"])
