"""The training launcher: presets, flag overrides, errors before compute, an end-to-end run."""

import dataclasses
import json
import os
import subprocess
import sys

import pytest
from absl import app, flags

from agentic_esopt import agents, es, models, training
from experiments import configs
from experiments import train as launcher

FLAGS = flags.FLAGS
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def parse():
    def parse_args(*args):
        FLAGS.unparse_flags()
        FLAGS(["train", *args])

    yield parse_args
    FLAGS.unparse_flags()


@pytest.fixture
def model_loads(monkeypatch):
    calls = []
    real_load = models.load

    def recording_load(*args, **kwargs):
        calls.append(args)
        return real_load(*args, **kwargs)

    monkeypatch.setattr(models, "load", recording_load)
    return calls


def test_no_flags_is_the_cpu_default_preset(parse):
    parse()
    assert launcher.build_config() == configs.get_config("cpu_default")
    assert launcher.build_config().model == "smollm2-135m"


def test_explicit_flags_override_the_preset(parse):
    parse("--preset=sudoku_mask15", "--population_size=16", "--history_turns=none",
          "--noantithetic", "--temperature=0.5")
    config = launcher.build_config()
    paper = configs.get_config("sudoku_mask15")
    assert config == dataclasses.replace(paper, population_size=16, history_turns=None,
                                         temperature=0.5)
    assert (config.sigma_start, config.sigma_end) == (7e-4, 5e-4)


@pytest.mark.parametrize("mask_count, sigma", [(5, (1e-3, 2.5e-4)), (10, (1e-3, 2.5e-4)),
                                               (15, (7e-4, 5e-4))])
def test_paper_presets(mask_count, sigma):
    config = configs.get_config(f"sudoku_mask{mask_count}").validate()
    assert (config.board_size, config.mask_count, config.population_size) == (9, mask_count, 32)
    assert (config.learning_rate, config.generations, config.sigma_schedule) == (
        5e-4, 100, "cosine")
    assert (config.sigma_start, config.sigma_end) == sigma


BAD_FLAGS = [
    (["--population_size=3", "--antithetic"], "antithetic sampling needs an even"),
    (["--noise=full", "--rank=2"], "rank=2 only applies to noise='lowrank'"),
    (["--sigma_warmup=30", "--generations=30"], "sigma_warmup (30) must be < generations"),
    (["--eval_every=0"], "eval_every must be >= 1"),
    (["--board_size=4", "--mask_count=13"], "mask_count must be in [1, 12]"),
    (["--anchor_path=/no/such/folder"], "has no train.jsonl"),
    (["--sigma_schedule=constant"], "a constant σ schedule has no end value"),
    (["--weight_decay=0.1"], "weight_decay only applies to optimizer='adamw'"),
    (["--model=/no/such/model.gguf"], "is not 'tiny'"),
    (["--preset=sudoku_mask99"], "unknown preset 'sudoku_mask99'"),
]


@pytest.mark.parametrize("args, message", BAD_FLAGS, ids=[m for _, m in BAD_FLAGS])
def test_bad_flags_fail_before_the_model_loads(parse, model_loads, tmp_path, args, message):
    workdir = tmp_path / "run"
    parse(*args, f"--workdir={workdir}")
    with pytest.raises(app.UsageError) as error:
        launcher.main(["train"])
    assert message in str(error.value)
    assert model_loads == [] and not workdir.exists()


@pytest.mark.parametrize("arg", ["--population_size=abc", "--max_turns=two",
                                 "--sigma_start=fast"])
def test_unparsable_flags_fail_at_parse_time(parse, arg):
    with pytest.raises(flags.IllegalFlagValueError):
        parse(arg)


def test_stray_arguments_are_rejected(parse, model_loads):
    parse()
    with pytest.raises(app.UsageError, match="unexpected arguments: extra"):
        launcher.main(["train", "extra"])
    assert model_loads == []


def test_command_line_error_exits_before_any_work(tmp_path):
    workdir = tmp_path / "run"
    completed = subprocess.run(
        [sys.executable, "-m", "experiments.train", "--model=tiny", "--population_size=3",
         "--antithetic", f"--workdir={workdir}"],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
    assert completed.returncode != 0
    assert "antithetic sampling needs an even population_size, got 3" in completed.stderr
    assert not workdir.exists()


def test_two_generation_tiny_run_writes_everything(parse, tmp_path, capsys):
    workdir = tmp_path / "run"
    parse("--model=tiny", "--board_size=4", "--mask_count=1", "--population_size=4",
          "--generations=2", "--tasks_per_generation=1", "--max_new_tokens=4",
          "--max_turns=1", "--eval_size=2", "--eval_every=1", "--checkpoint_every=1",
          f"--workdir={workdir}")
    launcher.main(["train"])
    assert "| mean reward |" in capsys.readouterr().out
    config = training.TrainConfig.from_dict(json.loads((workdir / "config.json").read_text()))
    assert (config.model, config.noise, config.antithetic) == ("tiny", "lowrank", True)
    header, records = es.history.read(workdir / "history.jsonl")
    assert len(records) == 2 and header["strategy"]["noise"] == "lowrank"
    kinds = [(r["kind"], r["generation"]) for r in
             training.metrics.read_metrics(workdir / "metrics.jsonl")]
    assert kinds == [("eval", 0), ("train", 0), ("eval", 1), ("train", 1), ("eval", 2)]
    assert any(name.startswith("events.out.tfevents")
               for name in os.listdir(workdir / "tensorboard"))
    assert {"1", "2"} <= set(os.listdir(workdir / "checkpoints"))
    assert (workdir / "reward_curve.png").read_bytes()[:4] == b"\x89PNG"
    summary = json.loads((workdir / "summary.json").read_text())
    assert summary["generations"] == 2 and summary["eval_episodes"] == 2
    assert "difference / s.e." in (workdir / "summary.md").read_text()
    episodes = agents.read_trajectories(workdir / "trajectories" / "gen_00001.jsonl")
    assert len(episodes) == 4 and {e.member for e in episodes} == set(range(4))
    assert all(a.startswith("set ") and "\n" not in a for e in episodes for a in e.actions)
