"""GRPO: advantages, the loss and its mask, log-probabilities, steps and bad settings."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentic_esopt import models, training
from agentic_esopt.agents import rollout, sources
from agentic_esopt.models import tiny
from agentic_esopt.training import grpo, rules

import digits_env

TEMPERATURE = 0.7
HYPER = grpo.Hyper(temperature=TEMPERATURE, clip_epsilon=0.2, kl_beta=1e-3, remat=False)
GRPO_VALUES = dict(name="grpo", group_size=4, learning_rate=1e-3, minibatch_size=4)


@pytest.fixture(scope="module")
def model():
    config, params, tokenizer = tiny.tiny_model_parts(seed=1)
    return models.Model(config, params, tokenizer)


def sampled_turns(model, prompts, max_new_tokens=6):
    """Turns sampled by ``models.generate`` at TEMPERATURE, with their recorded log-probs."""
    ids = model.tokenizer(prompts, add_special_tokens=False)["input_ids"]
    out = models.generate(model, ids, max_new_tokens=max_new_tokens, temperature=TEMPERATURE,
                          key=jax.random.key(5))
    return [rollout.TurnTokens(p, r, lp) for p, r, lp in zip(ids, out.token_ids, out.logprobs)]


def batch_of(model, advantages=(1.0, -0.5, 0.0), rows=4):
    turns = sampled_turns(model, ["hello there", "a", "the third prompt is longer"])
    return grpo.make_batch(list(zip(turns, advantages)), rows, 0)


def loss(model, params, batch, reference_params=None):
    reference = grpo.reference_logprobs(model.config, TEMPERATURE,
                                        reference_params or model.params, batch)
    return grpo.grpo_loss(params, model.config, HYPER, batch, reference)


def test_group_advantages_standardise_within_each_task():
    rewards = np.array([[1.0, 0.0, 0.0, 1.0], [0.5, 0.5, 0.5, 0.5], [3.0, 1.0, 2.0, 2.0]])
    advantages = grpo.group_advantages(rewards)
    np.testing.assert_allclose(advantages[0], [0.866, -0.866, -0.866, 0.866], atol=1e-3)
    np.testing.assert_array_equal(advantages[1], 0.0)  # All equal: no signal.
    np.testing.assert_allclose(advantages[2], (rewards[2] - 2) / (np.std(rewards[2], ddof=1)
                                                                 + 1e-6))
    with pytest.raises(ValueError, match="G >= 2"):
        grpo.group_advantages(np.ones((3, 1)))


def test_trajectory_advantages_group_samples_of_the_same_task():
    # Sample-major: samples 0 and 1 of tasks a and b. Task a: rewards 1, 0; task b: 2, 2.
    trajectories = [rollout.Trajectory(m, t, 0, [], [], [], r, 1, False, {})
                    for m, t, r in [(0, "a", 1.0), (0, "b", 2.0), (1, "a", 0.0), (1, "b", 2.0)]]
    advantages = grpo.trajectory_advantages(trajectories, 2)
    assert advantages[1] == advantages[3] == 0
    assert advantages[0] > 0 > advantages[2]


def test_make_batch_masks_only_generated_tokens():
    turn = rollout.TurnTokens([5, 6, 7], [8, 9], [-0.5, -1.5])
    batch = grpo.make_batch([(turn, 2.0)], 2, pad_id=0)
    window = batch.loss_mask.shape[1]
    assert batch.tokens[0, -5:].tolist() == [5, 6, 7, 8, 9]
    assert window < batch.tokens.shape[1]
    assert batch.loss_mask[0].tolist() == [0] * (window - 2) + [1, 1]
    assert batch.old_logprobs[0].tolist() == [0] * (window - 2) + [-0.5, -1.5]
    assert batch.attention_mask[0].sum() == 5 and batch.loss_mask[1].sum() == 0
    assert batch.advantages.tolist() == [2.0, 0.0]
    with pytest.raises(ValueError, match="do not fit"):
        grpo.make_batch([(turn, 1.0)] * 3, 2, 0)


def test_rollout_log_probs_equal_a_fresh_forward_pass(model):
    batch = batch_of(model)
    fresh = grpo.token_logprobs(model.config, model.params, batch.tokens,
                                batch.attention_mask, TEMPERATURE, batch.loss_mask.shape[1])
    mask = batch.loss_mask > 0
    np.testing.assert_allclose(np.asarray(fresh)[mask], batch.old_logprobs[mask], atol=2e-5)
    _, parts = loss(model, model.params, batch)
    np.testing.assert_allclose(parts["ratio_mean"], 1.0, atol=1e-4)
    np.testing.assert_allclose(parts["kl"], 0.0, atol=1e-6)


def test_loss_matches_the_per_token_formula(model):
    batch = batch_of(model)
    params = jax.tree.map(lambda x: x * 1.05, model.params)  # ρ ≠ 1 and KL ≠ 0.
    window = batch.loss_mask.shape[1]
    new, ref = (np.asarray(grpo.token_logprobs(model.config, p, batch.tokens,
                                               batch.attention_mask, TEMPERATURE, window),
                           np.float64) for p in (params, model.params))
    expected = []
    for row in range(3):
        at = batch.loss_mask[row] > 0
        ratio = np.exp(new[row, at] - batch.old_logprobs[row, at])
        a = batch.advantages[row]
        policy = np.maximum(-a * ratio, -a * np.clip(ratio, 0.8, 1.2))
        kl = np.exp(ref[row, at] - new[row, at]) - (ref[row, at] - new[row, at]) - 1
        expected.append(np.mean(policy + 1e-3 * kl))
    value, _ = loss(model, params, batch)
    np.testing.assert_allclose(float(value), np.mean(expected), rtol=1e-4)


def test_tokens_outside_the_loss_mask_cannot_change_the_loss(model):
    batch = batch_of(model)
    base, _ = loss(model, model.params, batch)
    changed_old = batch._replace(old_logprobs=np.where(batch.loss_mask == 0, -7.0,
                                                       batch.old_logprobs))
    padded = batch.attention_mask == 0
    changed_pads = batch._replace(tokens=np.where(padded, 42, batch.tokens))
    for changed in (changed_old, changed_pads):
        np.testing.assert_array_equal(float(loss(model, model.params, changed)[0]), float(base))
    # A filler row (empty loss mask) with any content and advantage changes nothing either.
    filler = batch._replace(advantages=batch.advantages.copy())
    filler.advantages[3] = 100.0
    np.testing.assert_array_equal(float(loss(model, model.params, filler)[0]), float(base))


def test_loss_gradient_matches_finite_differences(model):
    batch = batch_of(model)
    params = jax.tree.map(lambda x: x * 1.02, model.params)
    reference = grpo.reference_logprobs(model.config, TEMPERATURE, model.params, batch)

    def value(p):
        return grpo.grpo_loss(p, model.config, HYPER, batch, reference)[0]

    grads = jax.grad(value)(params)
    leaves, treedef = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(0), len(leaves))
    direction = treedef.unflatten([jax.random.normal(k, x.shape) for k, x in zip(keys, leaves)])
    analytic = sum(float(jnp.vdot(g, d)) for g, d in zip(jax.tree.leaves(grads),
                                                         jax.tree.leaves(direction)))
    h = 1e-3
    shifted = [jax.tree.map(lambda p, d, s=s: p + s * h * d, params, direction) for s in (1, -1)]
    numeric = (float(value(shifted[0])) - float(value(shifted[1]))) / (2 * h)
    assert abs(analytic) > 1e-3
    np.testing.assert_allclose(numeric, analytic, rtol=2e-2)


def test_remat_gives_the_same_gradient(model):
    batch = batch_of(model)
    reference = grpo.reference_logprobs(model.config, TEMPERATURE, model.params, batch)
    grads = [jax.grad(lambda p, h=h: grpo.grpo_loss(p, model.config, h, batch, reference)[0])(
        model.params) for h in (HYPER, HYPER._replace(remat=True))]
    for a, b in zip(*map(jax.tree.leaves, grads)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-7)


def rule(values=None):
    config = digits_env.TINY.replace(rule={**GRPO_VALUES, **(values or {})})
    return rules.make(config), config


def learn_from(model, rule_, advantages, hyper=HYPER):
    state = rule_.init(model.params)
    examples = list(zip(sampled_turns(model, ["p one", "p two"]), advantages))
    return grpo.learn(model.config, hyper, rule_.optimizer, state.params, state.opt_state,
                      state.reference, examples, 4, 1, 0, jax.random.key(0))


def test_flops_count_the_forward_pass_that_remat_recomputes(model):
    examples = list(zip(sampled_turns(model, ["p one", "p two"]), [1.0, -1.0]))
    turn_tokens = sum(len(t.prompt_ids) + len(t.reply_ids) for t, _ in examples)
    per_token = rules.base.forward_flops(model.params, 1)
    plain, recomputed = (rule({"remat": remat, "epochs": 2})[0].flops(model.params, 10, examples)
                         for remat in (False, True))
    assert plain == pytest.approx(per_token * (10 + 4 * 2 * turn_tokens))
    assert recomputed - plain == pytest.approx(per_token * 2 * turn_tokens)


def test_zero_advantages_move_params_only_through_weight_decay(model):
    no_kl = HYPER._replace(kl_beta=0.0)
    params, _, metrics = learn_from(model, rule()[0], [0.0, 0.0], no_kl)
    assert metrics["grad_norm"] == 0.0
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(model.params)):
        np.testing.assert_array_equal(a, b)
    # The KL's gradient at the start point is zero up to the rounding between the
    # reference's program and the loss's (7e-10 on an AVX-512 Xeon; 0 on others), which
    # AdamW would scale up towards a whole step: the exact checks leave it out.
    _, _, metrics = learn_from(model, rule()[0], [0.0, 0.0])
    assert metrics["grad_norm"] < 1e-8
    decayed, _, _ = learn_from(model, rule(dict(weight_decay=0.1))[0], [0.0, 0.0], no_kl)
    for a, b in zip(jax.tree.leaves(decayed), jax.tree.leaves(model.params)):
        np.testing.assert_allclose(a, b * (1 - 1e-3 * 0.1), rtol=1e-6)
    moved, _, _ = learn_from(model, rule()[0], [1.0, -1.0])
    assert any(not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(moved),
                                                        jax.tree.leaves(model.params)))


def test_bfloat16_params_train_with_a_float32_first_moment(model):
    params = jax.tree.map(lambda x: x.astype(jnp.bfloat16), model.params)
    bf16 = dataclasses.replace(model, params=params)
    rule_ = rule()[0]
    state = rule_.init(params)
    examples = list(zip(sampled_turns(model, ["p one", "p two"]), [1.0, -1.0]))
    moved, opt_state, metrics = grpo.learn(
        model.config, HYPER, rule_.optimizer, state.params, state.opt_state, state.reference,
        examples, 4, 1, 0, jax.random.key(0))
    assert np.isfinite(metrics["loss"]) and metrics["grad_norm"] > 0
    assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(moved))
    assert any(not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(moved),
                                                        jax.tree.leaves(bf16.params)))
    first_moments = [x for x in jax.tree.leaves(opt_state) if x.ndim == 2]
    assert first_moments and any(x.dtype == jnp.float32 for x in first_moments)


def test_samples_are_independent_and_keep_their_tokens(model):
    config = digits_env.TINY.replace(rule=GRPO_VALUES)
    source = sources.EpisodeRewards(digits_env.make_source(config.env, config.splits),
                                    config.rollout, 1.0, models.generate)
    trajectories, fed = source.samples(model, 3, 0, jax.random.key(1))
    assert [t.member for t in trajectories] == [0, 0, 1, 1, 2, 2]
    batched = dataclasses.replace(source, options=dataclasses.replace(config.rollout,
                                                                      batch_size=1))
    assert batched.samples(model, 3, 0, jax.random.key(1)) == (trajectories, fed)
    assert fed == sum(len(t.turns[0].prompt_ids) + len(t.turns[0].reply_ids)
                      for t in trajectories)  # one turn each, nothing cached before it
    assert len({t.actions[0] for t in trajectories[::2]}) > 1  # Samples of a task differ.
    for t in trajectories:
        (turn,) = t.turns
        assert len(turn.reply_ids) == len(turn.logprobs) and turn.prompt_ids
        assert t.actions[0] == model.tokenizer.decode(turn.reply_ids, skip_special_tokens=True)


def test_trajectory_files_leave_turn_tokens_out(tmp_path):
    turn = rollout.TurnTokens([1], [2], [-0.1])
    trajectory = rollout.Trajectory(0, "t", 0, [], ["a"], [1.0], 1.0, 1, True, {}, [turn])
    rollout.write_trajectories(tmp_path / "t.jsonl", [trajectory])
    assert rollout.read_trajectories(tmp_path / "t.jsonl") == [
        dataclasses.replace(trajectory, turns=None)]


def test_a_grpo_run_learns_on_the_tiny_model(tmp_path, model):
    rule_, config = rule()
    result = training.train(config, str(tmp_path), model=model)
    assert int(result.state.generation) == config.run.generations
    assert any(not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(result.state.params),
                                                        jax.tree.leaves(model.params)))
    for a, b in zip(jax.tree.leaves(result.state.reference), jax.tree.leaves(model.params)):
        np.testing.assert_array_equal(a, b)
    assert isinstance(rule_, rules.grpo.GRPORule)


@pytest.mark.parametrize("changes, message", [
    (dict(rule=dict(name="grpo", clip_epsilon=0.0)), "clip_epsilon must be > 0"),
    (dict(rule=dict(name="grpo", group_size=1)), "group_size must be >= 2"),
    (dict(rule=dict(name="grpo", learning_rate=0.0)), "learning_rate must be > 0"),
    (dict(rule=dict(name="grpo", minibatch_size=0)), "minibatch_size must be >= 1"),
    (dict(rule=dict(name="grpo"), rollout=dict(temperature=0.0)),
     "rollout.temperature must be > 0"),
])
def test_bad_grpo_settings_fail_before_compute(changes, message):
    with pytest.raises(ValueError, match=message):
        digits_env.TINY.replace(**changes)


def test_grpo_refuses_a_heuristic_search_before_loading(tmp_path, monkeypatch):
    config = training.TrainConfig.from_dict(
        {"env": {"name": "ahd"}, "model": {"name": "tiny"}, "rule": {"name": "grpo"},
         "rollout": {"temperature": 1.0}})
    monkeypatch.setattr(models, "load", lambda *a, **k: pytest.fail("loaded the model"))
    with pytest.raises(ValueError, match="heuristic search"):
        training.train(config, str(tmp_path))
