"""experiments.evaluate and training.evaluate_workdir on finished tiny runs."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from agentic_esopt import models, training
from agentic_esopt.training import metrics

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(HERE, "..", "training"))
import digits_env  # pylint: disable=wrong-import-position


def snapshot(folder):
    return {os.path.join(root, name): os.path.getmtime(os.path.join(root, name))
            for root, _, names in os.walk(folder) for name in names}


def one_generation_workdir(config, workdir):
    """A workdir as training leaves it after one generation (rewards made up, no rollouts)."""
    strategy = training.make_strategy(config)
    state = strategy.init(training.config.run_key(config), models.load("tiny").params)
    state, _ = strategy.tell(state, strategy.ask(state),
                             np.arange(config.es.population_size))
    training.checkpoint.save_or_check_config(training.RunFiles(workdir), config)
    checkpointer = training.checkpoint.Checkpointer(training.RunFiles(workdir).checkpoints)
    checkpointer.save(state)
    checkpointer.close()


def test_command_line_evaluates_the_latest_checkpoint(tmp_path):
    config = training.TrainConfig.from_dict(dict(
        model=dict(name="tiny"), env=dict(mask_count=1), es=dict(population_size=2),
        rollout=dict(max_new_tokens=2, max_turns=1)))
    workdir = str(tmp_path / "run")
    one_generation_workdir(config, workdir)
    before = snapshot(workdir)
    skill = tmp_path / "skill.md"
    skill.write_text("Always answer with a legal move.")
    completed = subprocess.run(
        [sys.executable, "-m", "experiments.evaluate", f"--workdir={workdir}",
         "--eval_split=test", "--eval_size=2", f"--skill={skill}"],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
    assert completed.returncode == 0, completed.stderr[-3000:]
    result = json.loads(completed.stdout)
    without, with_skill = result["without_skill"], result["with_skill"]
    assert (with_skill["params"], with_skill["generation"], with_skill["eval_split"]) == (
        "latest", 1, "test")
    assert with_skill["num_episodes"] == 2 and with_skill["model"] == "tiny"
    assert (without["skill"], with_skill["skill"]) == (None, str(skill))
    assert without["episode_task_ids"] == with_skill["episode_task_ids"]
    effect = result["skill_effect"]["mean_reward"]
    assert effect["difference"] == pytest.approx(with_skill["mean_reward"]
                                                 - without["mean_reward"])
    assert {"difference_in_se", "difference_in_paired_se"} <= set(effect)
    assert snapshot(workdir) == before


def test_evaluation_reproduces_the_final_eval_of_the_run(tmp_path):
    config = digits_env.TINY.replace(run=dict(generations=2))
    workdir = str(tmp_path / "run")
    training.train(config, workdir)
    final_eval = [r for r in metrics.read_metrics(os.path.join(workdir, "metrics.jsonl"))
                  if r["kind"] == "eval"][-1]
    result = training.evaluate_workdir(workdir)
    assert result["generation"] == 2
    for key in ("mean_reward", "mean_reward_se", "success_rate", "num_episodes"):
        assert result[key] == final_eval[key]
    base = training.evaluate_workdir(workdir, base=True)
    first_eval = metrics.read_metrics(os.path.join(workdir, "metrics.jsonl"))[0]
    assert (base["params"], base["generation"]) == ("base", 0)
    assert base["mean_reward"] == first_eval["mean_reward"]


def test_evaluation_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a training workdir"):
        training.evaluate_workdir(str(tmp_path))
    training.checkpoint.save_or_check_config(training.RunFiles(str(tmp_path)), digits_env.TINY)
    with pytest.raises(ValueError, match=r"cannot override eval \['seed'\]"):
        training.evaluate_workdir(str(tmp_path), eval_overrides={"seed": 1})
    with pytest.raises(FileNotFoundError, match="no usable checkpoint"):
        training.evaluate_workdir(str(tmp_path))
    with pytest.raises(ValueError, match="skill: no file"):
        training.evaluate_skill_effect(str(tmp_path), str(tmp_path / "missing.md"), base=True)
