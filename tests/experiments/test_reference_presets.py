"""The reference's presets, field by field, against its published run settings
(``shared/data/anchors/reference_runs.json``; ``$AGENTIC_ESOPT_ANCHORS`` to move it)."""

import json
import os

import pytest

from agentic_esopt import training
from experiments.configs import math_react, sudoku_grpo, sudoku_paper, webarena_lite

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ANCHORS = os.environ.get("AGENTIC_ESOPT_ANCHORS",
                         os.path.join(REPO, "..", "shared", "data", "anchors"))
REFERENCE_FILE = os.path.join(ANCHORS, "reference_runs.json")
pytestmark = pytest.mark.skipif(not os.path.isfile(REFERENCE_FILE),
                                reason=f"no reference settings at {REFERENCE_FILE}")


@pytest.fixture(scope="module")
def reference():
    with open(REFERENCE_FILE, encoding="utf-8") as f:
        return json.load(f)


def sigma_of(text: str) -> tuple[str, float, float]:
    """("cosine", start, end) from "cosine 1e-3 -> 2.5e-4"; ("constant", σ, σ) likewise."""
    kind, *values = text.replace("->", " ").split()
    values = [float(v) for v in values]
    return kind, values[0], values[-1]


def built(config_dict) -> training.TrainConfig:
    """The checked config (presets for local checkpoints name a placeholder folder)."""
    values = config_dict.to_dict()
    values["model"]["name"] = "tiny"
    return training.TrainConfig.from_dict(values)


def assert_es_run(config, es):
    """Generations, G, tasks per generation, α and the σ schedule of an ES preset."""
    assert (config.run.generations, config.es.population_size,
            config.rollout.tasks_per_generation, config.es.learning_rate) == (
        es["generations"], es["population"], es["tasks_per_generation"], es["alpha"])
    assert (config.es.sigma_schedule, config.es.sigma_start, config.es.sigma_end) == (
        sigma_of(es["sigma"]))


def assert_sampling(rollout, sampling):
    assert (rollout.temperature, rollout.top_p) == (sampling["temperature"], sampling["top_p"])
    assert rollout.top_k == max(sampling["top_k"], 0)  # -1 and 0 both mean no top-k
    assert rollout.presence_penalty == sampling.get("presence_penalty", 0.0)


@pytest.mark.parametrize("mask", [5, 10, 15])
@pytest.mark.parametrize("profile, name", [("agentic", "agentic-esopt-es32"),
                                           ("vanilla", "vanilla-es32")])
def test_sudoku_es_presets(reference, mask, profile, name):
    sudoku = reference["sudoku"]
    shared = sudoku["es_shared"]
    config = built(sudoku_paper.paper_sudoku(mask, profile))
    kind, start, end = sigma_of(sudoku["es_profiles"][name][f"mask_{mask}"]["sigma"])
    assert (config.es.sigma_schedule, config.es.sigma_start, config.es.sigma_end) == (
        kind, start, end)
    assert (config.run.generations, config.es.population_size,
            config.rollout.tasks_per_generation, config.es.learning_rate) == (
        shared["generations"], shared["population"], shared["tasks_per_generation"],
        shared["alpha"])
    assert (config.es.scope, config.es.fitness, config.es.optimizer) == (
        shared["scope"], shared["fitness"], "sgd")
    assert config.rollout.max_turns == 3 * mask  # "3 x mask"
    assert config.rollout.max_new_tokens == shared["tokens_per_turn"]
    assert (config.run.eval_every, config.eval.repeats) == (shared["eval_every"],
                                                            shared["eval_repeats"])
    assert_sampling(config.rollout, sudoku["sampling"])
    assert config.eval.temperature == sudoku["sampling"]["temperature"]


@pytest.mark.parametrize("profile, name", [("t0.7", "run_grpo"), ("t1", "run_grpo_t1")])
def test_sudoku_grpo_presets(reference, profile, name):
    sudoku = reference["sudoku"]
    shared = sudoku["grpo_shared"]
    config = built(sudoku_grpo.get_config(profile))
    assert config.rule_name == "grpo"
    assert (config.run.generations, config.rollout.tasks_per_generation,
            config.rule.group_size, config.rule.learning_rate, config.rule.kl_beta,
            config.rule.clip_epsilon, config.rule.minibatch_size) == (
        shared["steps"], shared["tasks_per_step"], shared["samples_per_task"], shared["lr"],
        shared["kl_beta"], shared["clip_eps"], shared["policy_batch_turns"])
    assert config.rollout.max_turns == 3 * config.env.mask_count
    train = sudoku["grpo_profiles"][name]["train_sampling"]
    assert (config.rollout.temperature, config.rollout.top_p) == (train["temperature"],
                                                                  train["top_p"])
    assert config.rollout.top_k == max(train["top_k"], 0)
    evaluation = shared["eval_sampling"]
    assert (config.eval.temperature, config.eval.repeats, config.run.eval_every) == (
        evaluation["temperature"], shared["eval_repeats"], shared["eval_every_steps"])


def test_math_preset(reference):
    es = reference["math"]["es"]
    config = built(math_react.get_config())
    assert_es_run(config, es)
    assert (config.es.scope, config.es.fitness, config.es.noise) == (es["scope"], "zscore",
                                                                     "full")
    assert (config.rollout.max_turns, config.env.max_turns) == (es["max_turns"],
                                                                es["max_turns"])
    assert config.rollout.max_new_tokens == es["tokens_per_turn"]
    assert config.run.eval_every == es["eval_every"]
    assert_sampling(config.rollout, es["sampling"])


def test_webarena_preset(reference):
    web = reference["webarena"]
    es = web["es"]
    config = built(webarena_lite.get_config())
    assert_es_run(config, es)
    assert (config.es.scope, config.es.fitness, config.run.eval_every) == (
        es["scope"], es["fitness"], es["eval_every"])
    assert (config.rollout.max_turns, config.env.max_turns) == (
        web["episodes"]["max_turns"], web["episodes"]["max_turns"])
    assert config.rollout.max_new_tokens == web["episodes"]["tokens_per_turn"]
    assert_sampling(config.rollout, web["sampling"])
    assert config.env.validation_tasks == web["splits"]["skill_validation"]
    assert web["splits"]["train"].startswith("582 ")
    assert (config.eval.size, config.eval.repeats) == (165, 3)
