"""The base-success probe (``experiments.base_success``): one line per point, resumable."""

import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def probe(results, grid_text):
    return subprocess.run(
        [sys.executable, "-m", "experiments.base_success", "--config.model.name=tiny",
         "--config.eval.size=4", f"--grid={grid_text}", f"--results={results}"],
        cwd=REPO, capture_output=True, text=True, timeout=600, check=False)


def test_each_point_is_measured_once_and_a_rerun_resumes(tmp_path):
    results = tmp_path / "base.jsonl"
    first = probe(results, "env.mask_count=1,2")
    assert first.returncode == 0, first.stderr[-3000:]
    lines = [json.loads(line) for line in results.read_text().splitlines()]
    assert [line["point"] for line in lines] == [{"env.mask_count": 1}, {"env.mask_count": 2}]
    assert all(0 <= line["success_rate"] <= 1 and line["num_episodes"] == 4 for line in lines)
    second = probe(results, "env.mask_count=1,2,3")
    assert second.returncode == 0, second.stderr[-3000:]
    points = [json.loads(line)["point"] for line in results.read_text().splitlines()]
    assert points == [{"env.mask_count": m} for m in (1, 2, 3)]


def test_a_malformed_grid_is_one_line_before_any_compute(tmp_path):
    result = probe(tmp_path / "base.jsonl", "env.mask_count")
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert "section.option=v1,v2" in result.stderr
    assert not (tmp_path / "base.jsonl").exists()
