"""experiments.distill_skill: a skill file from a workdir's trajectories, end to end."""

import json
import os
import subprocess
import sys

import pytest

from agentic_esopt.agents import rollout, skills

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(HERE, "..", "agents"))
# pylint: disable=wrong-import-position,unused-import
from test_skills import fixture_server, trajectory  # noqa: E402,F401


def make_workdir(path, model_name="tiny"):
    """A workdir as a run leaves it: config.json naming the model, trajectories/."""
    os.makedirs(path / "trajectories")
    (path / "config.json").write_text(json.dumps({"model": {"name": model_name}}))
    rollout.write_trajectories(path / "trajectories" / "gen_00000.jsonl",
                               [trajectory("a"), trajectory("b", solved=True)])
    rollout.write_trajectories(path / "trajectories" / "gen_00001.jsonl",
                               [trajectory("c", generation=1, member=3)])
    rollout.write_trajectories(path / "trajectories" / "eval_00001.jsonl",
                               [trajectory("held-out", generation=1)])


def distill(*flags):
    env = {**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "JAX_PLATFORMS": "cpu"}
    return subprocess.run([sys.executable, "-m", "experiments.distill_skill", *flags],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
                          check=False)


def test_run_model_by_default_writes_a_skill_with_provenance(tmp_path):
    make_workdir(tmp_path / "run")
    out = tmp_path / "skills" / "skill.md"
    done = distill(f"--workdir={tmp_path / 'run'}", f"--out={out}", "--max_lines=5",
                   "--max_new_tokens=8")
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["llm"] == "tiny (base parameters)"  # no checkpoint in this workdir
    assert (summary["trajectories"], summary["failures"]) == (3, 2)
    document = out.read_text()
    assert document.startswith("# Skill") and skills.PROVENANCE_START in document
    assert "held-out" not in document  # eval episodes are not learnt from
    body = skills.skill_text(document).splitlines()
    assert len([line for line in body if line.startswith("- ")]) <= 5
    for line in document.splitlines():
        if line.startswith("L") and ": task " in line:
            assert line.split(": task ")[1].split(",")[0] in {"a", "c"}


def test_endpoint_llm_and_sidecar_provenance(tmp_path, server):
    make_workdir(tmp_path / "run", model_name="no-such-model")  # never loaded
    out = tmp_path / "skill.md"
    done = distill(f"--workdir={tmp_path / 'run'}", f"--out={out}", f"--llm_url={server}",
                   "--llm_model=test-model", "--provenance=sidecar", "--include_eval")
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1])["failures"] == 3
    assert out.read_text() == ("# Skill: lessons from failed episodes\n\n"
                               "- Check the tool output before answering.\n")
    provenance = (tmp_path / "skill.md.provenance.txt").read_text()
    assert "line 1: from L1" in provenance and "task held-out, generation 1" in provenance


@pytest.mark.parametrize("flags, message", [
    (["--llm_url=http://127.0.0.1:9/v1"], "--llm_url and --llm_model go together"),
    (["--model=tiny", "--max_lines=0"], "--max_lines and --batch_size must be >= 1"),
])
def test_usage_errors(tmp_path, flags, message):
    make_workdir(tmp_path / "run")
    done = distill(f"--workdir={tmp_path / 'run'}", f"--out={tmp_path / 'x.md'}", *flags)
    assert done.returncode != 0 and message in done.stderr


def test_workdir_without_trajectories_or_model(tmp_path):
    (tmp_path / "empty").mkdir()
    done = distill(f"--workdir={tmp_path / 'empty'}", f"--out={tmp_path / 'x.md'}")
    assert done.returncode != 0 and "no trajectory files" in done.stderr
    make_workdir(tmp_path / "run")
    os.remove(tmp_path / "run" / "config.json")
    done = distill(f"--workdir={tmp_path / 'run'}", f"--out={tmp_path / 'x.md'}")
    assert done.returncode != 0 and "pass --model" in done.stderr


def test_run_parameters_come_from_the_latest_checkpoint(tmp_path):
    import numpy as np  # pylint: disable=import-outside-toplevel

    from agentic_esopt import models, training  # pylint: disable=import-outside-toplevel
    workdir = tmp_path / "run"
    make_workdir(workdir)
    config = training.TrainConfig.from_dict({"model": {"name": "tiny"},
                                             "es": {"population_size": 2}})
    files = training.RunFiles(str(workdir))
    os.remove(files.config)
    training.checkpoint.save_or_check_config(files, config)
    strategy = training.make_strategy(config)
    state = strategy.init(training.config.run_key(config), models.load("tiny").params)
    state, _ = strategy.tell(state, strategy.ask(state), np.arange(2.0))
    checkpointer = training.checkpoint.Checkpointer(files.checkpoints)
    checkpointer.save(state)
    checkpointer.close()
    out = tmp_path / "skill.md"
    done = distill(f"--workdir={workdir}", f"--out={out}", "--max_new_tokens=4")
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1])["llm"] == "tiny (run parameters)"
    done = distill(f"--workdir={workdir}", f"--out={out}", "--max_new_tokens=4",
                   "--params=base")
    assert json.loads(done.stdout.strip().splitlines()[-1])["llm"] == "tiny (base parameters)"
