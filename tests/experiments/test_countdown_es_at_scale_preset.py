"""configs/countdown_es_at_scale.py, field by field, against ES at Scale's Countdown
settings as their code has them (github.com/VsonicV/es-fine-tuning-paper; the file each
value comes from is named beside it). No model loads: the test names the tiny model."""

import json

import pytest

from agentic_esopt import training
from agentic_esopt.envs import es_at_scale
from experiments.configs import countdown_es_at_scale

pytest.importorskip("reasoning_gym")

THEIRS = {
    # es_fine-tuning_countdown.py / es_fine-tuning_countdown_accl.py / es_at_scale/train.py
    "population_size": 30,           # POPULATION_SIZE = 30; --population-size 30
    "sigma": 1e-3,                   # SIGMA = 0.001; --sigma 0.001, never changed
    "alpha": 5e-4,                   # ALPHA = 0.0005; alpha = sigma / 2
    "iterations": 300,               # es_at_scale/train.py --n-iterations 300
    "prompts_per_iteration": 200,    # dataset[:200]; --batch-size 200
    "max_new_tokens": 1024,          # max_new_tokens = 1024; SamplingParams(max_tokens=1024)
    "temperature": 0.0,              # do_sample = False; temperature=0.0
    "eval_size": 2000,               # eval scripts: --eval_samples 2000 --eval_offset -2000
    "dtype": "bfloat16",             # --precision bf16
    # countdown/data/countdown.json: 3 or 4 numbers in 1-99, targets (96%) 1-100
    "numbers": (3, 4), "values": (1, 99), "targets": (1, 100),
}


@pytest.fixture(scope="module")
def config():
    values = countdown_es_at_scale.get_config().to_dict()
    values["model"]["name"] = "tiny"  # the preset names a placeholder folder
    return training.TrainConfig.from_dict(values)


def test_es_settings(config):
    es = config.es
    assert es.population_size == THEIRS["population_size"]
    assert (es.sigma_schedule, es.sigma_start, es.sigma_end) == (
        "constant", THEIRS["sigma"], THEIRS["sigma"])
    assert es.learning_rate == THEIRS["alpha"] == THEIRS["sigma"] / 2
    # θ += α/N Σ z_i ε_i: SGD, no 1/σ, z-scores, full-rank noise on every parameter, no
    # antithetic pairs (the update loops over named_parameters; reward_shaping.z_score).
    assert (es.optimizer, es.scale_by_sigma, es.fitness) == ("sgd", False, "zscore")
    assert (es.noise, es.antithetic, es.scope) == ("full", False, "full")
    assert config.run.generations == THEIRS["iterations"]


def test_tasks_and_decoding(config):
    assert config.rollout.tasks_per_generation == THEIRS["prompts_per_iteration"]
    assert config.env.train_pool == THEIRS["prompts_per_iteration"]  # the same 200 each time
    assert config.rollout.max_new_tokens == THEIRS["max_new_tokens"]
    assert config.rollout.temperature == config.eval.temperature == THEIRS["temperature"]
    assert (config.eval.size, config.eval.split) == (THEIRS["eval_size"], "eval")
    assert config.model.dtype == THEIRS["dtype"] and config.es.rounding == "nearest"
    generator = json.loads(config.env.dataset_options)
    assert (generator["min_numbers"], generator["max_numbers"]) == THEIRS["numbers"]
    assert (generator["min_value"], generator["max_value"]) == THEIRS["values"]
    assert (generator["min_target"], generator["max_target"]) == THEIRS["targets"]


def test_prompt_and_reward(config):
    assert (config.env_name, config.env.dataset) == ("reasoning_gym", "countdown")
    assert (config.env.prompt_style, config.env.max_turns) == ("es_at_scale", 1)
    # Their context field is plain text ending in "Let me solve this step by step.\n<think>".
    assert config.rollout.chat_template is False
    assert config.rollout.reply_prefix == "Let me solve this step by step.\n<think>"
    assert config.rollout.reply_prefix == es_at_scale.REPLY_PREFIX


def test_the_placeholder_model_fails_until_a_folder_is_named():
    with pytest.raises(ValueError, match="model.name: '/path/to/Qwen2.5-3B-Instruct' is not"):
        training.TrainConfig.from_dict(countdown_es_at_scale.get_config().to_dict())
