"""Exporting a run: transformers loads the folder with the run's logits; every generation;
clear errors that leave nothing behind. (The export launcher on the contract smoke run:
tests/experiments/test_smoke_contract.py.)"""

import json
import os

import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from agentic_esopt import es, models, training
from agentic_esopt.training import export

import digits_env

CONFIG = digits_env.TINY.replace(run=dict(checkpoint_every=2))  # checkpoints 2 and 3


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    workdir = str(tmp_path_factory.mktemp("run"))
    return workdir, training.train(CONFIG, workdir)


def hf_logits(folder, ids):
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    with torch.no_grad():
        return model(torch.tensor(ids)).logits.numpy()


def our_logits(params, ids):
    config = models.load("tiny").config
    return np.asarray(models.logits(config, params, jnp.asarray(ids),
                                    jnp.ones_like(jnp.asarray(ids))))


def test_export_loads_in_transformers_with_the_run_logits(run, tmp_path):
    workdir, result = run
    out = tmp_path / "exported"
    export.export_run(workdir, str(out), command="python -m experiments.export ...")
    ids = [[1, 5, 9, 2, 7, 3]]
    np.testing.assert_allclose(hf_logits(str(out), ids), our_logits(result.state.params, ids),
                               atol=1e-4, rtol=0)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(out))
    assert tokenizer.chat_template
    generation = json.loads((out / "generation_config.json").read_text())
    assert generation["temperature"] == CONFIG.eval.temperature
    readme = (out / "README.md").read_text()
    assert "Generations: 3 of 3" in readme and "experiments.export" in readme
    assert "| mean reward |" in readme


def test_every_generation_comes_from_a_checkpoint_or_a_replay(run):
    workdir, result = run
    files = training.RunFiles(workdir)
    initial = models.load("tiny").params
    newest, generation = export.run_params(files, CONFIG, initial)
    assert generation == 3
    for a, b in zip(jax_leaves(newest), jax_leaves(result.state.params)):
        np.testing.assert_array_equal(a, b)
    replayed, generation = export.run_params(files, CONFIG, initial, generation=1)
    assert generation == 1 and sorted(os.listdir(files.checkpoints)) == ["2", "3"]
    expected = es.history.replay(initial, files.history, generations=1)
    for a, b in zip(jax_leaves(replayed), jax_leaves(expected)):
        np.testing.assert_array_equal(a, b)
    base, generation = export.run_params(files, CONFIG, initial, generation=0)
    assert generation == 0  # The rule's initial parameters (a LoRA run's have adapters).
    for a, b in zip(jax_leaves(base), jax_leaves(initial), strict=True):
        np.testing.assert_array_equal(a, b)


def jax_leaves(tree):
    import jax  # pylint: disable=import-outside-toplevel
    return [np.asarray(x) for x in jax.tree.leaves(tree)]


def test_bfloat16_export_loads(run, tmp_path):
    workdir, _ = run
    out = tmp_path / "bf16"
    export.export_run(workdir, str(out), dtype="bfloat16")
    model = transformers.AutoModelForCausalLM.from_pretrained(str(out))
    assert model.dtype == torch.bfloat16


def test_errors_are_clear_and_leave_nothing_behind(run, tmp_path):
    workdir, _ = run
    with pytest.raises(FileNotFoundError, match="no parameters for generation 7"):
        export.export_run(workdir, str(tmp_path / "a"), generation=7)
    with pytest.raises(ValueError, match="merged applies to runs that trained LoRA adapters"):
        export.export_run(workdir, str(tmp_path / "a"), merged=True)
    empty = tmp_path / "empty_run"
    training.checkpoint.save_or_check_config(training.RunFiles(str(empty)), CONFIG)
    with pytest.raises(FileNotFoundError, match="checkpoints hold none"):
        export.export_run(str(empty), str(tmp_path / "b"))
    with pytest.raises(FileNotFoundError, match="not a training workdir"):
        export.export_run(str(tmp_path), str(tmp_path / "c"))
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(OSError):
        export.export_run(workdir, str(blocker / "out"))
    assert sorted(os.listdir(tmp_path)) == ["empty_run", "file"]
    existing = tmp_path / "existing"
    existing.mkdir()
    (existing / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError):
        export.export_run(workdir, str(existing))
    assert os.listdir(existing) == ["keep.txt"]
