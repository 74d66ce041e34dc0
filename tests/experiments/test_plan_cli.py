"""experiments.plan and the launcher's plan check, as users run them (subprocesses)."""

import json
import os
import subprocess
import sys

import pytest

from agentic_esopt import targets

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = ("--config=experiments/configs/cpu_default.py", "--config.model.name=tiny",
        "--prompt_tokens=16", "--config.rollout.tasks_per_generation=2",
        "--config.eval.size=2")


def run(module, *args):
    return subprocess.run([sys.executable, "-m", module, *args], cwd=REPO,
                          capture_output=True, text=True, timeout=300, check=False)


def test_cpu8_contract():
    done = run("experiments.plan", *TINY, "--target=cpu:8",
               "--config.mesh.shape=data:4,model:2", "--json")
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    assert result["fits"] is True and result["device_memory_bytes"] > 0
    names = [p["name"] for p in result["programs"]]
    assert {"es/prefill", "es/decode", "es/tell", "eval/decode"} <= set(names)
    assert all(p["per_device_bytes"] > 0 and p["flops"] >= 0 for p in result["programs"])
    assert result["process_mesh"] == {"data": 4, "model": 2}


@pytest.mark.parametrize("args, message", [
    (("--target=tpu9:x",), "unknown target 'tpu9:x': choose cpu:N, host, or tpu:"),
    (("--target=cpu:8", "--config.mesh.shape=data:3,model:2"),
     "mesh data:3,model:2 has 6 devices; target cpu:8 has 8"),
    (("--target=cpu:2", "--model=qwen9"), "unknown model 'qwen9': not one of ("),
])
def test_bad_input_is_one_line(args, message):
    done = run("experiments.plan", *TINY, *args)
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("FATAL") and message in last, done.stderr[-2000:]


@pytest.mark.skipif(not targets.has_libtpu(), reason="libtpu is not installed")
def test_tpu_topology_plans_are_quiet_and_run_side_by_side():
    command = [sys.executable, "-m", "experiments.plan", *TINY, "--target=tpu:v5e:2x2",
               "--config.mesh.shape=data:2,model:2", "--config.model.dtype=bfloat16", "--json"]
    planners = [subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True) for _ in range(2)]
    for planner in planners:
        stdout, stderr = planner.communicate(timeout=300)
        assert planner.returncode == 0, stderr[-2000:]
        result = json.loads(stdout)
        assert result["device_kind"] == "TPU v5 lite" and result["fits"]
        assert result["device_memory_bytes"] == 16 * 2**30
        assert result["seconds_per_generation"] > 0
        assert "TPU_WORKER_HOSTNAMES" not in stderr and "InitGoogle" not in stderr


def test_launcher_refuses_a_run_that_does_not_fit(tmp_path):
    done = run("experiments.train", *TINY[:2], "--config.run.generations=1",
               "--config.es.population_size=2", "--config.eval.size=2",
               "--device_memory_bytes=100000", f"--workdir={tmp_path}")
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert "does not fit its devices" in last and "GiB per device" in last
    assert not (tmp_path / "history.jsonl").exists()


def test_results_page_table_is_rebuilt_from_the_committed_rows():
    from experiments import plan_table  # pylint: disable=import-outside-toplevel
    with open(os.path.join(REPO, "docs", "results", "plan.md"), encoding="utf-8") as page:
        assert plan_table.table(os.path.join(REPO, plan_table.FOLDER)) in page.read()
