"""TrainConfig validation, round trips, and the strategy it builds."""

import dataclasses

import pytest

from agentic_esopt import training
from agentic_esopt.training import config as config_lib

VALID = training.TrainConfig()

BAD = [
    (dict(env="chess"), "unknown env 'chess'"),
    (dict(board_size=5), "board_size must be one of [4, 6, 9]"),
    (dict(mask_count=13), "mask_count must be in [1, 12] on a 4×4 board"),
    (dict(board_size=9, mask_count=0), "mask_count must be in [1, 64]"),
    (dict(anchor_path="/no/such/anchors"), "has no train.jsonl"),
    (dict(model="no/such/model"), "model 'no/such/model' is not 'tiny'"),
    (dict(dtype="float8"), "unknown dtype 'float8'"),
    (dict(population_size=1), "population_size must be >= 2"),
    (dict(population_size=5, antithetic=True), "antithetic sampling needs an even"),
    (dict(noise="sparse"), "unknown noise 'sparse'"),
    (dict(rank=0, noise="lowrank"), "rank must be >= 1"),
    (dict(rank=4, noise="full"), "rank=4 only applies to noise='lowrank'"),
    (dict(sigma_schedule="exp"), "unknown sigma_schedule 'exp'"),
    (dict(sigma_start=0.0), "sigma_start must be > 0"),
    (dict(sigma_end=-1.0), "sigma_end must be >= 0"),
    (dict(sigma_schedule="constant", sigma_start=1e-3, sigma_end=5e-4),
     "a constant σ schedule has no end value"),
    (dict(sigma_warmup=100, generations=100), "sigma_warmup (100) must be < generations"),
    (dict(learning_rate=0.0), "learning_rate must be > 0"),
    (dict(optimizer="lion"), "unknown optimizer 'lion'"),
    (dict(weight_decay=0.1, optimizer="sgd"), "weight_decay only applies to optimizer='adamw'"),
    (dict(fitness="softmax"), "unknown fitness 'softmax'"),
    (dict(scope="(unclosed"), "is not 'full', 'all_linear' or a valid regex"),
    (dict(generations=0), "generations must be >= 1"),
    (dict(tasks_per_generation=0), "tasks_per_generation must be >= 1"),
    (dict(max_turns=0), "max_turns must be >= 1"),
    (dict(max_new_tokens=0), "max_new_tokens must be >= 1"),
    (dict(temperature=-0.5), "temperature must be >= 0"),
    (dict(history_turns=-1), "history_turns must be >= 0"),
    (dict(eval_split="train"), "eval_split must be one of ('eval', 'test')"),
    (dict(eval_size=0), "eval_size must be >= 1"),
    (dict(eval_every=0), "eval_every must be >= 1"),
    (dict(eval_temperature=-1.0), "eval_temperature must be >= 0"),
    (dict(checkpoint_every=0), "checkpoint_every must be >= 1"),
    (dict(workdir=""), "workdir must be a folder path"),
    (dict(seed=-1), "seed must be >= 0"),
    (dict(population_size="8"), "population_size must be int, got '8'"),
    (dict(generations=2.5), "generations must be int, got 2.5"),
    (dict(antithetic=1), "antithetic must be bool, got 1"),
    (dict(learning_rate=True), "learning_rate must be float, got True"),
    (dict(max_turns="3"), "max_turns must be int, got '3'"),
]


def test_defaults_are_valid():
    assert VALID.validate() is VALID


@pytest.mark.parametrize("overrides, message", BAD, ids=[m for _, m in BAD])
def test_bad_values_and_combinations_name_the_problem(overrides, message):
    with pytest.raises(ValueError, match="invalid training configuration") as error:
        dataclasses.replace(VALID, **overrides).validate()
    assert message in str(error.value)


def test_every_problem_is_reported_at_once():
    config = dataclasses.replace(VALID, population_size=3, antithetic=True, eval_every=0,
                                 noise="full", rank=2)
    with pytest.raises(ValueError) as error:
        config.validate()
    text = str(error.value)
    assert "even population_size" in text and "eval_every" in text and "rank=2" in text


def test_existing_anchor_folder_passes(tmp_path):
    for split in ("train", "eval"):
        (tmp_path / f"{split}.jsonl").write_text("")
    dataclasses.replace(VALID, anchor_path=str(tmp_path)).validate()
    with pytest.raises(ValueError, match="has no test.jsonl"):
        dataclasses.replace(VALID, anchor_path=str(tmp_path), eval_split="test").validate()


def test_custom_envs_are_validated_by_their_spec():
    spec = training.EnvSpec(problems=lambda c: ["custom problem"], make_source=None)
    with pytest.raises(ValueError, match="custom problem"):
        dataclasses.replace(VALID, env="custom").validate({"custom": spec})
    with pytest.raises(ValueError, match="unknown env 'custom'"):
        dataclasses.replace(VALID, env="custom").validate()


def test_dict_round_trip_and_unknown_fields():
    config = dataclasses.replace(VALID, max_turns=3, anchor_path="x")
    assert training.TrainConfig.from_dict(config.to_dict()) == config
    with pytest.raises(ValueError, match=r"unknown TrainConfig fields: \['colour'\]"):
        training.TrainConfig.from_dict({**config.to_dict(), "colour": "red"})


def test_field_types_unwrap_optionals_and_every_field_has_help():
    types = config_lib.field_types()
    assert types["max_turns"] is int and types["anchor_path"] is str
    assert types["antithetic"] is bool and types["sigma_start"] is float
    assert set(config_lib.optional_fields()) == {"anchor_path", "max_turns", "history_turns"}
    assert all(f.metadata["help"] for f in dataclasses.fields(training.TrainConfig))


def test_strategy_follows_the_config():
    config = dataclasses.replace(VALID, population_size=6, antithetic=True, noise="lowrank",
                                 rank=2, sigma_start=2e-3, sigma_end=1e-3, generations=7,
                                 sigma_warmup=1, optimizer="adamw", weight_decay=0.01)
    spec = training.make_strategy(config).spec
    assert spec["population_size"] == 6 and spec["antithetic"] and spec["rank"] == 2
    assert spec["sigma"] == dict(kind="cosine", start=2e-3, end=1e-3, steps=7, warmup=1)
    assert spec["optimizer"] == "adamw" and spec["weight_decay"] == 0.01


def test_policy_options():
    options = config_lib.policy_options(dataclasses.replace(
        VALID, max_new_tokens=7, history_turns=2, reply_prefix="set ", stop_at_newline=True))
    assert options == dict(max_new_tokens=7, history_turns=2, reply_prefix="set ",
                           stop=("\n",))
    assert config_lib.policy_options(VALID)["stop"] == ()
