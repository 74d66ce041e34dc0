"""The contract smoke command (DESIGN.md) as a real run of the training launcher: a tiny ES
run writes everything, the same command again resumes without redoing a generation (GRPO
too), and ``experiments.export`` of the run loads in transformers with its final logits
(ES over LoRA adapters: the adapter folder in peft).

Each variant's command runs in one workdir (a module fixture; ES's and GRPO's twice) that
the tests then read.
"""

import json
import os
import pathlib
import subprocess
import sys
from typing import NamedTuple

import numpy as np
import peft
import pytest
import torch
import transformers

from agentic_esopt import agents, es, models, training

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def launch(module, *args):
    completed = subprocess.run([sys.executable, "-m", module, *args], cwd=REPO,
                               capture_output=True, text=True, timeout=300, check=False)
    assert completed.returncode == 0, completed.stderr[-3000:]
    return completed


class SmokeRun(NamedTuple):
    workdir: pathlib.Path
    first: subprocess.CompletedProcess
    again: subprocess.CompletedProcess | None  # The same command again (RESUMED variants).
    records: list[dict]  # metrics.jsonl after the first run


# Each smoke run's flags beyond the contract command's.
VARIANTS = {"es": ["--config.rule.name=es"], "grpo": ["--config.rule.name=grpo"],
            "lora": ["--config.es.scope=lora"]}
# Variants whose command runs again. A LoRA run resumes bitwise in
# tests/training/test_trainer.py; its launch here is for the adapter export.
RESUMED = ("es", "grpo")


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def smoke(request, tmp_path_factory):
    workdir = tmp_path_factory.mktemp(f"smoke_{request.param}")
    command = ["--config=experiments/configs/cpu_default.py", "--config.model.name=tiny",
               "--config.run.generations=2", "--config.es.population_size=4",
               "--config.eval.size=8", *VARIANTS[request.param], f"--workdir={workdir}"]
    first = launch("experiments.train", *command)
    records = training.metrics.read_metrics(workdir / "metrics.jsonl")
    again = launch("experiments.train", *command) if request.param in RESUMED else None
    return SmokeRun(workdir, first, again, records)


@pytest.mark.parametrize("smoke", RESUMED, indirect=True)
def test_the_same_command_resumes_without_redoing_a_generation(smoke):
    assert "resuming" in smoke.again.stderr
    train = lambda records: [r for r in records if r["kind"] == "train"]
    assert len(train(smoke.records)) == 2
    assert train(training.metrics.read_metrics(smoke.workdir / "metrics.jsonl")) == train(
        smoke.records)


@pytest.mark.parametrize("smoke", ["es"], indirect=True)
def test_a_tiny_es_run_writes_everything(smoke):
    workdir = smoke.workdir
    assert "| mean reward |" in smoke.first.stdout
    config = training.TrainConfig.from_dict(json.loads((workdir / "config.json").read_text()))
    assert (config.model.name, config.es.noise, config.es.antithetic) == ("tiny", "lowrank",
                                                                        True)
    header, records = es.history.read(workdir / "history.jsonl")
    assert len(records) == 2 and header["strategy"]["noise"] == "lowrank"
    kinds = [(r["kind"], r["generation"]) for r in smoke.records]
    assert kinds == [("eval", 0), ("train", 0), ("train", 1), ("eval", 2)]  # eval_every=14
    assert any(name.startswith("events.out.tfevents")
               for name in os.listdir(workdir / "tensorboard"))
    assert {"1", "2"} <= set(os.listdir(workdir / "checkpoints"))
    assert (workdir / "reward_curve.png").read_bytes()[:4] == b"\x89PNG"
    summary = json.loads((workdir / "summary.json").read_text())
    assert summary["generations"] == 2 and summary["eval_episodes"] == 8
    assert "difference / s.e." in (workdir / "summary.md").read_text()
    episodes = agents.read_trajectories(workdir / "trajectories" / "gen_00001.jsonl")
    assert len(episodes) == 4 * 4 and {e.member for e in episodes} == set(range(4))
    assert all(a.startswith("set ") and "\n" not in a for e in episodes for a in e.actions)


@pytest.mark.parametrize("smoke", ["es"], indirect=True)
def test_export_of_the_smoke_run_has_its_final_logits(smoke, tmp_path):
    out = str(tmp_path / "exported")
    launch("experiments.export", f"--workdir={smoke.workdir}", f"--out={out}")
    files = training.RunFiles(smoke.workdir)
    tiny = models.load("tiny")
    final = training.checkpoint.restore_workdir_state(
        files, training.checkpoint.load_config(files), tiny.params)
    ids = np.array([[1, 5, 9, 2, 7, 3]])
    ours = np.asarray(models.logits(tiny.config, final.params, ids))
    exported = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    with torch.no_grad():
        theirs = exported(torch.tensor(ids)).logits.numpy()
    np.testing.assert_allclose(theirs, ours, atol=1e-4, rtol=0)


@pytest.mark.parametrize("smoke", ["lora"], indirect=True)
def test_the_adapter_export_of_a_lora_smoke_run_applies_in_peft(smoke, tmp_path):
    adapter, base = str(tmp_path / "adapter"), str(tmp_path / "base")
    launch("experiments.export", f"--workdir={smoke.workdir}", f"--out={adapter}")
    launch("experiments.export", f"--workdir={smoke.workdir}", f"--out={base}", "--step=0",
           "--merged")
    assert json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())["r"] == 8
    files = training.RunFiles(smoke.workdir)
    tiny = models.load("tiny")
    final = training.checkpoint.restore_workdir_state(
        files, training.checkpoint.load_config(files), tiny.params)
    adapters = models.lora.adapted(final.params)
    assert sorted(name for _, _, name in adapters) == ["q_proj", "v_proj"]
    ids = np.array([[1, 5, 9, 2, 7, 3]])
    ours = np.asarray(models.logits(tiny.config, final.params, ids))
    exported = peft.PeftModel.from_pretrained(
        transformers.AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32), adapter)
    with torch.no_grad():
        theirs = exported(torch.tensor(ids)).logits.numpy()
    np.testing.assert_allclose(theirs, ours, atol=1e-4, rtol=0)
    loaded = exported.base_model.model.model.layers[1].self_attn.q_proj.lora_A["default"]
    np.testing.assert_array_equal(  # The run's A (random, unlike B on a reward-less run).
        loaded.weight.detach().numpy(),
        np.asarray(adapters[("layers", "attn", "q_proj")]["lora_a"][1]).T)
