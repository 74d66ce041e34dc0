"""The AHD launchers: --score_program, flag checks before compute, a tiny end-to-end run."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from agentic_esopt.envs.ahd import tasks

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KP = tasks.TASKS["kp_constructive"]
SCORE_FLAGS = ["--task=kp_constructive", "--size=20", "--config.eval.size=3",
               "--config.env.timeout_s=3"]


@pytest.fixture(name="launch")
def fixture_launch(fast_compile_env):
    """Runs a launcher module (AHD's runs compile more than they run)."""
    def launch(module, *args, timeout=120):
        return subprocess.run([sys.executable, "-m", module, *args], cwd=REPO,
                              env=fast_compile_env, capture_output=True, text=True,
                              timeout=timeout, check=False)
    return launch


def score(launch, tmp_path, source):
    program = tmp_path / "program.py"
    program.write_text(source)
    result = launch("experiments.ahd", *SCORE_FLAGS, f"--score_program={program}")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 1, result.stdout
    scored = json.loads(lines[0])
    assert set(scored) == {"valid", "objective", "error"}
    return scored


def test_score_program_on_a_good_program(launch, tmp_path):
    scored = score(launch, tmp_path, 'print("noise on stdout")\n' + KP.seed_heuristic_source)
    expected = KP.baseline(KP.generate_instances(20, 3, seed=1))
    assert scored == {"valid": True, "objective": pytest.approx(expected), "error": None}


def test_score_program_on_a_hostile_program(launch, tmp_path):
    scored = score(launch, tmp_path, textwrap.dedent("""\
        print("noise on stdout")
        def select_next_item(remaining_capacity, weights, values):
            while True:
                pass
        """))
    assert scored["valid"] is False and scored["objective"] is None
    assert "timed out" in scored["error"] or "CPU" in scored["error"]


# Configuration problems are reported together (an unknown search hides the anchor check).
@pytest.mark.parametrize("module, args, messages", [
    ("experiments.ahd", ["--config.env.search=eoh_plus", "--config.rollout.top_p=2"],
     ["unknown 'eoh_plus'", "rollout.top_p must be in (0, 1]"]),
    ("experiments.ahd", ["--config.run.generations=0", "--config.env.anchor_data=/nowhere"],
     ["run.generations must be >= 1", "anchor_data has no"]),
    ("experiments.ahd", ["--score_program=/nowhere.py"], ["no file '/nowhere.py'"]),
    ("experiments.ahd", ["--config=experiments/configs/cpu_default.py"],
     ["runs the 'ahd' environment"]),
    ("experiments.ahd_grid", ["--tasks=tsp_constructive:big"], ["must be an integer"]),
    ("experiments.ahd_grid", ["--methods=sample,eoh_x"], ["unknown method 'eoh_x'"]),
])
def test_bad_flags_fail_before_any_compute(launch, tmp_path, module, args, messages):
    workdir = tmp_path / "run"
    result = launch(module, f"--workdir={workdir}", *args)
    assert result.returncode != 0
    for message in messages:
        assert message in result.stderr
    assert result.stdout == "" and not workdir.exists()


def test_tiny_model_run_end_to_end(launch, tmp_path):
    workdir = tmp_path / "run"
    result = launch("experiments.ahd", "--config.model.name=tiny", "--config.env.search=sample",
                    "--config.es.population_size=2", "--config.run.generations=1",
                    "--config.rollout.max_new_tokens=8", "--task=kp_constructive", "--size=20",
                    "--config.env.train_size=2", "--config.eval.size=2",
                    f"--workdir={workdir}", timeout=300)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 1
    final = json.loads(lines[0])
    assert final["calls"] == 2 and final["generation"] == 1
    assert final["baseline_eval_objective"] == pytest.approx(
        KP.baseline(KP.generate_instances(20, 2, seed=1)))
    for name in ("config.json", "programs.jsonl", "metrics.jsonl", "history.jsonl",
                 "checkpoints/1", "summary.json"):
        assert (workdir / name).exists(), name
    with open(workdir / "summary.json", encoding="utf-8") as file:
        assert json.load(file)["final_eval"] == final
