"""experiments.evaluate and training.evaluate_workdir on finished tiny runs."""

import dataclasses
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


def one_generation_workdir(config):
    """A workdir as training leaves it after one generation (rewards made up, no rollouts)."""
    strategy = training.make_strategy(config)
    state = strategy.init(training.config.run_key(config), models.load("tiny").params)
    state, _ = strategy.tell(state, strategy.ask(state), np.arange(config.population_size))
    training.checkpoint.save_or_check_config(training.RunFiles(config.workdir), config)
    checkpointer = training.checkpoint.Checkpointer(training.RunFiles(config.workdir)
                                                    .checkpoints)
    checkpointer.save(state)
    checkpointer.close()


def test_command_line_evaluates_the_latest_checkpoint(tmp_path):
    config = training.TrainConfig(model="tiny", board_size=4, mask_count=1, population_size=2,
                                  max_new_tokens=2, max_turns=1, workdir=str(tmp_path / "run"))
    one_generation_workdir(config)
    before = snapshot(config.workdir)
    completed = subprocess.run(
        [sys.executable, "-m", "experiments.evaluate", f"--workdir={config.workdir}",
         "--eval_split=test", "--eval_size=2"],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
    assert completed.returncode == 0, completed.stderr[-3000:]
    result = json.loads(completed.stdout)
    assert (result["params"], result["generation"], result["eval_split"]) == (
        "latest", 1, "test")
    assert result["num_episodes"] == 2 and result["model"] == "tiny"
    assert {"mean_reward", "mean_reward_se", "success_rate", "success_rate_se"} <= set(result)
    assert snapshot(config.workdir) == before


def test_evaluation_reproduces_the_final_eval_of_the_run(tmp_path):
    config = dataclasses.replace(digits_env.TINY, generations=2,
                                 workdir=str(tmp_path / "run"))
    training.train(config, digits_env.ENVS)
    final_eval = [r for r in metrics.read_metrics(os.path.join(config.workdir,
                                                               "metrics.jsonl"))
                  if r["kind"] == "eval"][-1]
    result = training.evaluate_workdir(config.workdir, envs=digits_env.ENVS)
    assert result["generation"] == 2
    for key in ("mean_reward", "mean_reward_se", "success_rate", "num_episodes"):
        assert result[key] == final_eval[key]
    base = training.evaluate_workdir(config.workdir, base=True, envs=digits_env.ENVS)
    first_eval = metrics.read_metrics(os.path.join(config.workdir, "metrics.jsonl"))[0]
    assert (base["params"], base["generation"]) == ("base", 0)
    assert base["mean_reward"] == first_eval["mean_reward"]


def test_evaluation_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a training workdir"):
        training.evaluate_workdir(str(tmp_path))
    config = dataclasses.replace(digits_env.TINY, workdir=str(tmp_path))
    training.checkpoint.save_or_check_config(training.RunFiles(str(tmp_path)), config)
    with pytest.raises(ValueError, match=r"cannot override \['seed'\]"):
        training.evaluate_workdir(str(tmp_path), overrides={"seed": 1}, envs=digits_env.ENVS)
    with pytest.raises(FileNotFoundError, match="no usable checkpoint"):
        training.evaluate_workdir(str(tmp_path), envs=digits_env.ENVS)
