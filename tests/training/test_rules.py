"""The update-rule registry: the built-in rules and a rule registered from outside."""

import dataclasses
import types

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentic_esopt import models, options, training
from agentic_esopt.training import rules

import digits_env


@dataclasses.dataclass(frozen=True)
class ShrinkOptions:
    decay: float = options.field(0.5, "Share of every parameter removed per generation.")

    def problems(self):
        return [] if 0 < self.decay < 1 else [f"decay must be in (0, 1), got {self.decay}"]


@flax.struct.dataclass
class ShrinkState:
    params: object
    generation: jax.Array


@dataclasses.dataclass(frozen=True)
class ShrinkRule(rules.Rule):
    """Scales θ by (1 − decay) each generation, after the unperturbed policy answers."""

    decay: float

    def init(self, params):
        return ShrinkState(params, jnp.zeros((), jnp.int32))

    def step(self, state, source, model, key, trajectory_path):
        answers = source.rewards(dataclasses.replace(model, params=state.params), None,
                                 int(state.generation), key, trajectory_path)
        params = jax.tree.map(lambda p: p * (1 - self.decay), state.params)
        return (ShrinkState(params, state.generation + 1),
                rules.StepResult(None, answers, rules.reward_statistics(answers.rewards)))


rules.register("shrink", types.SimpleNamespace(
    Options=ShrinkOptions, make=lambda config: ShrinkRule(config.rule.decay)))


def test_the_registry_names_the_built_in_rules_and_refuses_a_second_es():
    assert {"es", "grpo", "none", "shrink"} <= set(rules.names())
    with pytest.raises(ValueError, match="already registered"):
        rules.register("es", types.SimpleNamespace())


def test_a_rule_from_outside_trains_checkpoints_and_resumes(tmp_path):
    config = digits_env.TINY.replace(rule={"name": "shrink", "decay": 0.5},
                                     run={"generations": 2})
    result = training.train(config, str(tmp_path))
    initial = models.load("tiny").params
    for final, start in zip(jax.tree.leaves(result.state.params), jax.tree.leaves(initial)):
        np.testing.assert_allclose(final, start * 0.25, rtol=1e-6)
    assert not (tmp_path / "history.jsonl").exists()  # the rule keeps no history
    again = training.train(config, str(tmp_path))
    assert int(again.state.generation) == 2
    with pytest.raises(ValueError, match="rule.decay must be in"):
        config.replace(rule={"decay": 2.0})
