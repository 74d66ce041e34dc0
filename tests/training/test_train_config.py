"""TrainConfig: sections checked by their owners, every problem at once, round trips."""

import json

import pytest

from agentic_esopt import training
from agentic_esopt.training import config as config_lib
from agentic_esopt.training import rules

VALID = training.TrainConfig.from_dict({})

BAD = [
    (dict(env=dict(name="chess")), "env.name: unknown environment 'chess'"),
    (dict(env=dict(board_size=5)), "env.board_size must be one of [4, 6, 9]"),
    (dict(env=dict(mask_count=13)), "env.mask_count must be in [1, 12] on a 4×4 board"),
    (dict(env=dict(board_size=9, mask_count=0)), "mask_count must be in [1, 64]"),
    (dict(env=dict(anchor_path="/no/such/anchors")), "has no train.jsonl"),
    (dict(model=dict(name="no/such/model")), "model.name: 'no/such/model' is not 'tiny'"),
    (dict(model=dict(dtype="float8")), "model.dtype: unknown 'float8'"),
    (dict(model=dict(cache_layout="flat")), "model.cache_layout: unknown 'flat'"),
    (dict(eval=dict(batch_size=-1)), "eval.batch_size must be >= 0"),
    (dict(es=dict(population_size=1)), "es.population_size must be >= 2"),
    (dict(es=dict(population_size=5, antithetic=True)), "antithetic sampling needs an even"),
    (dict(es=dict(noise="sparse")), "es.noise: unknown 'sparse'"),
    (dict(es=dict(rank=0, noise="lowrank")), "es.rank must be >= 1"),
    (dict(es=dict(rank=4, noise="full")), "rank=4 only applies to noise='lowrank'"),
    (dict(es=dict(sigma_schedule="exp")), "es.sigma_schedule: unknown 'exp'"),
    (dict(es=dict(sigma_start=0.0)), "es.sigma_start must be > 0"),
    (dict(es=dict(sigma_end=-1.0)), "es.sigma_end must be >= 0"),
    (dict(es=dict(sigma_schedule="constant", sigma_start=1e-3, sigma_end=5e-4)),
     "a constant σ schedule has no end value"),
    (dict(es=dict(sigma_warmup=100), run=dict(generations=100)),
     "es.sigma_warmup (100) must be < run.generations (100)"),
    (dict(es=dict(learning_rate=0.0)), "es.learning_rate must be > 0"),
    (dict(es=dict(optimizer="lion")), "es.optimizer: unknown 'lion'"),
    (dict(es=dict(weight_decay=0.1, optimizer="sgd")),
     "weight_decay only applies to optimizer='adamw'"),
    (dict(es=dict(fitness="softmax")), "es.fitness: unknown 'softmax'"),
    (dict(es=dict(scope="(unclosed")),
     "is not one of ('full', 'all_linear', 'lora') or a valid regex"),
    (dict(es=dict(lora_rank=16)), "es.lora_rank: LoRA options need scope='lora'"),
    (dict(es=dict(scope="all_linear", lora_alpha=16.0, lora_targets="o_proj")),
     "es.lora_alpha, lora_targets: LoRA options need scope='lora', got scope='all_linear'"),
    (dict(es=dict(scope="lora", lora_rank=0)), "es.lora_rank must be >= 1"),
    (dict(es=dict(scope="lora", lora_alpha=0.0)), "es.lora_alpha must be > 0"),
    (dict(es=dict(scope="lora", lora_targets="q_proj,,v_proj")),
     "es.lora_targets must be distinct comma-separated projection names"),
    (dict(es=dict(scope="lora", lora_targets="q_proj,q_proj")),
     "es.lora_targets must be distinct comma-separated projection names"),
    (dict(run=dict(generations=0)), "run.generations must be >= 1"),
    (dict(run=dict(eval_every=0)), "run.eval_every must be >= 1"),
    (dict(run=dict(checkpoint_every=0)), "run.checkpoint_every must be >= 1"),
    (dict(run=dict(seed=-1)), "run.seed must be >= 0"),
    (dict(rollout=dict(tasks_per_generation=0)), "rollout.tasks_per_generation must be >= 1"),
    (dict(rollout=dict(max_turns=0)), "rollout.max_turns must be >= 1"),
    (dict(rollout=dict(max_new_tokens=0)), "rollout.max_new_tokens must be >= 1"),
    (dict(rollout=dict(temperature=-0.5)), "rollout.temperature must be >= 0"),
    (dict(rollout=dict(top_p=0.0)), "rollout.top_p must be in (0, 1]"),
    (dict(rollout=dict(history_turns=-1)), "rollout.history_turns must be >= 0"),
    (dict(rollout=dict(skill="/no/skill.md")), "rollout.skill: no file '/no/skill.md'"),
    (dict(eval=dict(split="train")), "eval.split must be one of ('eval', 'test')"),
    (dict(eval=dict(size=0)), "eval.size must be >= 1"),
    (dict(eval=dict(temperature=-1.0)), "eval.temperature must be >= 0"),
    (dict(rule=dict(name="ppo")), "rule.name: unknown update rule 'ppo'"),
    (dict(es=dict(population_size="8")), "es.population_size must be int, got '8'"),
    (dict(run=dict(generations=2.5)), "run.generations must be int, got 2.5"),
    (dict(es=dict(antithetic=1)), "es.antithetic must be bool, got 1"),
    (dict(es=dict(learning_rate=True)), "es.learning_rate must be float, got True"),
    (dict(rollout=dict(max_turns="3")), "rollout.max_turns must be int or None, got '3'"),
    (dict(mesh=dict(shape="data:4,pipe:2")), "mesh.shape: mesh axis 'pipe' is unknown"),
    (dict(mesh=dict(shape="data:0")), "mesh.shape: mesh axis 'data' needs a positive size"),
    (dict(mesh=dict(rules="zero3")), "mesh.rules: rule 'zero3' is not REGEX=SPEC"),
    (dict(mesh=dict(rules=".*=data")), "parameters split over 'model' only"),
    (dict(mesh=dict(rules="(unclosed=model")), "bad regex"),
    (dict(distributed=dict(num_processes=2, process_id=2)),
     "distributed.process_id must be in [0, num_processes=2), got 2"),
    (dict(distributed=dict(coordinator="localhost")),
     "distributed.coordinator must be host:port"),
    (dict(distributed=dict(num_processes=2, process_id=0), rule=dict(name="grpo"),
          rollout=dict(temperature=1.0)), "rule.name=grpo runs on one process"),
    (dict(distributed=dict(num_processes=8, process_id=0), es=dict(population_size=4)),
     "es.population_size (4) must be >= distributed.num_processes (8)"),
    (dict(colour=dict()), "unknown config section 'colour'"),
    (dict(es=dict(colour="red")), "es: unknown option 'colour'"),
]


@pytest.mark.parametrize("values, message", BAD, ids=[m for _, m in BAD])
def test_bad_values_and_combinations_name_the_problem(values, message):
    with pytest.raises(ValueError, match="invalid configuration") as error:
        training.TrainConfig.from_dict(values)
    assert message in str(error.value)


def test_every_problem_of_every_section_is_reported_at_once():
    with pytest.raises(ValueError) as error:
        training.TrainConfig.from_dict(dict(
            es=dict(population_size=3, antithetic=True, noise="full", rank=2),
            run=dict(eval_every=0), env=dict(board_size=5), model=dict(dtype="int4")))
    text = str(error.value)
    for fragment in ("even population_size", "run.eval_every", "rank=2", "env.board_size",
                     "model.dtype"):
        assert fragment in text


def test_dict_round_trip_and_replace():
    config = VALID.replace(rollout=dict(max_turns=3), env=dict(mask_count=3))
    assert training.TrainConfig.from_dict(config.to_dict()) == config
    assert config.rollout.max_turns == 3 and config.env.mask_count == 3
    assert config.splits == (0, 4, 32, "eval")
    with pytest.raises(ValueError, match="es.population_size must be >= 2"):
        config.replace(es=dict(population_size=0))


def test_every_option_field_has_help():
    import dataclasses
    for section in config_lib.SECTIONS.values():
        assert all(f.metadata["help"] for f in dataclasses.fields(section))


def test_strategy_follows_the_config():
    config = VALID.replace(
        es=dict(population_size=6, antithetic=True, noise="lowrank", rank=2,
                sigma_start=2e-3, sigma_end=1e-3, sigma_warmup=1, optimizer="adamw",
                weight_decay=0.01), run=dict(generations=7))
    spec = training.make_strategy(config).spec
    assert spec["population_size"] == 6 and spec["antithetic"] and spec["rank"] == 2
    assert spec["sigma"] == dict(kind="cosine", start=2e-3, end=1e-3, steps=7, warmup=1)
    assert spec["optimizer"] == "adamw" and spec["weight_decay"] == 0.01


def test_rule_options_have_help_and_the_registry_names_every_rule():
    import dataclasses
    assert {"es", "grpo", "none"} <= set(rules.names())
    for name in rules.names():
        assert all(f.metadata["help"] for f in dataclasses.fields(rules.module(name).Options))


def test_a_mistyped_key_is_one_line_naming_the_closest():
    with pytest.raises(ValueError) as error:
        VALID.replace(es=dict(populaton_size=4))
    assert str(error.value) == ("invalid configuration: es: unknown option 'populaton_size'; "
                                "did you mean 'population_size'?")


def test_the_old_update_section_names_the_rule_section():
    values = VALID.to_dict()
    values["update"] = {"name": "grpo"}
    with pytest.raises(ValueError, match=r"--config.rule.name=es\|grpo\|none"):
        training.TrainConfig.from_dict(values)


def test_naming_another_rule_starts_from_its_defaults():
    grpo = VALID.replace(rule=dict(name="grpo", group_size=4), rollout=dict(temperature=1.0))
    assert (grpo.rule_name, grpo.rule.group_size, grpo.rule.kl_beta) == ("grpo", 4, 1e-3)
    assert grpo.replace(rule=dict(name="es")).rule_name == "es"
    with pytest.raises(ValueError, match="rule: unknown option 'group_size'"):
        VALID.replace(rule=dict(group_size=4))


def test_a_workdir_resumes_under_another_layout_but_not_another_model(tmp_path):
    """``model.cache_layout`` and ``eval.batch_size`` are layout settings: a workdir
    recorded with others, or before they existed, resumes; another dtype is refused."""
    files = training.RunFiles(str(tmp_path))
    training.checkpoint.save_or_check_config(files, VALID)
    with open(files.config, encoding="utf-8") as f:
        recorded = json.load(f)
    del recorded["model"]["cache_layout"], recorded["eval"]["batch_size"]
    with open(files.config, "w", encoding="utf-8") as f:
        json.dump(recorded, f)
    training.checkpoint.save_or_check_config(files, VALID.replace(
        model=dict(cache_layout="stacked"), eval=dict(batch_size=4)))
    with pytest.raises(ValueError, match="model.dtype: 'float32' in the workdir"):
        training.checkpoint.save_or_check_config(files, VALID.replace(model=dict(
            dtype="bfloat16")))


def test_a_workdir_recorded_before_an_option_existed_resumes_at_its_default(tmp_path):
    files = training.RunFiles(str(tmp_path))
    training.checkpoint.save_or_check_config(files, VALID)
    with open(files.config, encoding="utf-8") as f:
        recorded = json.load(f)
    for name in ("lora_rank", "lora_alpha", "lora_targets", "rounding"):
        del recorded["es"][name]
    with open(files.config, "w", encoding="utf-8") as f:
        json.dump(recorded, f)
    training.checkpoint.save_or_check_config(files, VALID)
    with pytest.raises(ValueError, match="es.rounding: 'nearest' in the workdir, "
                                         "'stochastic' now"):
        training.checkpoint.save_or_check_config(files, VALID.replace(es=dict(
            rounding="stochastic")))
