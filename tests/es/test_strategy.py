"""The strategy end to end: optimisation, gradient estimate, determinism, memory."""

import itertools
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from agentic_esopt import es

HERE = os.path.dirname(os.path.abspath(__file__))

TARGET = {
    "block": {"kernel": jnp.linspace(-1.0, 1.0, 48).reshape(8, 6),
              "bias": jnp.linspace(0.5, -0.5, 6)},
    "stacked": jnp.linspace(-0.5, 0.5, 24).reshape(2, 4, 3),
}


def objective(params):
    return -sum(jnp.sum((p - t) ** 2) for p, t in zip(jax.tree.leaves(params),
                                                       jax.tree.leaves(TARGET)))


@jax.jit
def population_rewards(params, population):
    members = jnp.arange(population.size)
    return jax.vmap(lambda i: objective(es.noise.perturb(params, population, i)))(members)


def rewards_of(strategy, state, population):
    del strategy  # Members are evaluated in one vmapped call of es.noise.perturb.
    return np.asarray(population_rewards(state.params, population))


def run(strategy, generations, seed=0):
    state = strategy.init(seed, jax.tree.map(jnp.zeros_like, TARGET))
    for _ in range(generations):
        population = strategy.ask(state)
        state, metrics = strategy.tell(state, population, rewards_of(strategy, state,
                                                                     population))
    return state, metrics


@pytest.mark.parametrize("noise,antithetic,fitness", list(itertools.product(
    ["full", "lowrank"], [False, True], ["zscore", "centered_rank"])))
def test_es_maximises_an_analytic_objective(noise, antithetic, fitness):
    strategy = es.agentic_esopt(32, es.schedules.cosine(0.05, 0.01, 60), 0.05,
                                noise=noise, rank=2 if noise == "lowrank" else 1,
                                antithetic=antithetic,
                                fitness=fitness, optimizer="adam")
    initial = float(objective(jax.tree.map(jnp.zeros_like, TARGET)))
    state, _ = run(strategy, 60)
    final = float(objective(state.params))
    assert final > 0.1 * initial, (initial, final)  # Lost > 90% of the squared error.


def test_paper_sgd_update_improves_objective():
    strategy = es.agentic_esopt(16, 0.05, 0.2)
    initial = float(objective(jax.tree.map(jnp.zeros_like, TARGET)))
    state, metrics = run(strategy, 30)
    assert float(objective(state.params)) > 0.2 * initial
    assert int(state.generation) == 30 and float(metrics["update_norm"]) > 0


def test_scale_by_sigma_divides_the_estimate_by_sigma():
    plain = es.agentic_esopt(16, 0.05, 0.2)
    scaled = es.agentic_esopt(16, 0.05, 0.01, scale_by_sigma=True)  # 0.01 / 0.05 = 0.2
    one_step = [run(strategy, 1)[0].params for strategy in (plain, scaled)]
    for x, y in zip(jax.tree.leaves(one_step[0]), jax.tree.leaves(one_step[1])):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-7)
        assert np.any(np.asarray(x) != 0)


def test_linear_objective_estimate_converges_to_the_gradient():
    """Antithetic, identity shaping, 1/σ scaling: ĝ = mean_k (c·ε_k) ε_k, E[ĝ] = c.

    Per component Var[(c·ε) ε_j] = |c|² + c_j², so with K pairs the standard error is
    sqrt((|c|² + c_j²) / K). Every component must lie within 5 standard errors (the chance
    that one of 12 Gaussian components exceeds 5 s.e. is below 1e-5).
    """
    dim, pairs, sigma = 12, 2048, 1e-2
    c = jnp.linspace(-1.0, 2.0, dim)
    strategy = es.agentic_esopt(2 * pairs, sigma, 1.0, antithetic=True, fitness="identity",
                                scale_by_sigma=True)
    theta = {"w": jnp.full((dim,), 0.3)}
    state = strategy.init(7, jax.tree.map(jnp.copy, theta))  # tell consumes it.
    population = strategy.ask(state)
    noise = jax.vmap(lambda i: es.noise.member_noise(theta, population, i)["w"])(
        jnp.arange(2 * pairs))
    perturbed = theta["w"] + sigma * population.signs[:, None] * noise
    rewards = perturbed @ c
    new_state, _ = strategy.tell(state, population, rewards)
    estimate = np.asarray(new_state.params["w"] - theta["w"], np.float64)
    stderr = np.sqrt((float(c @ c) + np.asarray(c) ** 2) / pairs)
    assert np.all(np.abs(estimate - np.asarray(c)) < 5 * stderr), (estimate, c)
    # And it is a real estimate: far from zero relative to its noise.
    assert np.abs(estimate).max() > 10 * stderr.max()


def test_same_key_gives_bitwise_identical_update():
    strategy = es.agentic_esopt(8, 0.1, 0.1, noise="lowrank", rank=2)
    results = [run(strategy, 3, seed=3)[0].params for _ in range(2)]
    for x, y in zip(jax.tree.leaves(results[0]), jax.tree.leaves(results[1])):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    other = run(strategy, 3, seed=4)[0].params
    assert not np.array_equal(np.asarray(other["stacked"]), np.asarray(results[0]["stacked"]))


def test_zero_variance_rewards_give_zero_update():
    strategy = es.agentic_esopt(8, 0.1, 0.1)
    state = strategy.init(0, jax.tree.map(jnp.copy, TARGET))
    new_state, metrics = strategy.tell(state, strategy.ask(state), np.ones(8))
    assert float(metrics["update_norm"]) == 0.0
    for x, y in zip(jax.tree.leaves(new_state.params), jax.tree.leaves(TARGET)):
        np.testing.assert_array_equal(x, y)


def test_non_finite_rewards_raise_before_updating():
    strategy = es.agentic_esopt(4, 0.1, 0.1)
    state = strategy.init(0, TARGET)
    with pytest.raises(ValueError, match="member 1"):
        strategy.tell(state, strategy.ask(state), [0.0, np.nan, 1.0, 2.0])


@pytest.mark.parametrize("optimizer", ["adamw", optax.chain(optax.clip_by_global_norm(1.0),
                                                            optax.sgd(0.1, momentum=0.9))])
def test_other_optax_optimizers(optimizer):
    adamw = optimizer == "adamw"
    strategy = es.agentic_esopt(16, 0.05, 0.05 if adamw else None, optimizer=optimizer,
                                weight_decay=1e-3 if adamw else 0.0)
    initial = float(objective(jax.tree.map(jnp.zeros_like, TARGET)))
    state, _ = run(strategy, 30)
    assert float(objective(state.params)) > 0.6 * initial


def test_bf16_params_accumulate_in_float32_and_keep_dtype():
    params = {"w": jnp.zeros((64, 64), jnp.bfloat16)}
    strategy = es.agentic_esopt(8, 1e-2, 1e-3)
    state = strategy.init(0, jax.tree.map(jnp.copy, params))
    population = strategy.ask(state)
    new_state, _ = strategy.tell(state, population, np.arange(8.0))
    assert new_state.params["w"].dtype == jnp.bfloat16
    expected = np.zeros((64, 64), np.float32)
    weights = np.asarray(es.fitness.zscore(np.arange(8.0)))
    for i in range(8):
        expected += weights[i] * np.asarray(es.noise.member_noise(params, population, i)["w"])
    expected = 1e-3 / 8 * expected
    actual = np.asarray(new_state.params["w"], np.float32)
    # The float32 sum rounded once; the summation order can move an entry that lies on a
    # rounding boundary by one bfloat16 step (accumulating in bfloat16 moves most).
    np.testing.assert_allclose(actual, expected, rtol=2 ** -8, atol=0)
    assert np.mean(actual == expected.astype(jnp.bfloat16).astype(np.float32)) > 0.999


def test_tell_memory_does_not_grow_with_population_size():
    """Compiled temp memory of the update for G=8 and G=256 on a ~50M-parameter tree."""
    params = {"layers": {"kernel": jax.ShapeDtypeStruct((6, 2048, 2048), jnp.float32)},
              "embed": {"embedding": jax.ShapeDtypeStruct((12288, 2048), jnp.float32)},
              "norm": {"scale": jax.ShapeDtypeStruct((2048,), jnp.float32)}}
    n_params = sum(np.prod(x.shape) for x in jax.tree.leaves(params))
    assert 45e6 < n_params < 55e6
    param_bytes = 4 * n_params
    temps = {}
    for size in (8, 256):
        strategy = es.agentic_esopt(size, 1e-3, 1e-3, noise="full")
        state = jax.eval_shape(lambda p: strategy.init(jax.random.key(0), p), params)
        population = jax.eval_shape(strategy.ask, state)
        rewards = jax.ShapeDtypeStruct((size,), jnp.float32)
        compiled = strategy.update.lower(state, population, rewards).compile()
        temps[size] = compiled.memory_analysis().temp_size_in_bytes
    assert temps[256] <= 1.05 * temps[8] + 1e6, temps
    # The update itself is O(params); materialising the population would be 256×params.
    assert temps[256] < 5 * param_bytes, temps


def test_lowrank_sgd_update_donates_and_holds_one_leaf_at_a_time():
    """θ is updated in place and the temporaries are a few of the largest leaf, not θ."""
    params = {f"layer{i}": {"kernel": jax.ShapeDtypeStruct((4, 512, 512), jnp.float32),
                            "bias": jax.ShapeDtypeStruct((4, 512), jnp.float32)}
              for i in range(6)}
    param_bytes = sum(4 * np.prod(x.shape) for x in jax.tree.leaves(params))
    largest = max(4 * np.prod(x.shape) for x in jax.tree.leaves(params))
    strategy = es.agentic_esopt(16, 1e-3, 1e-3, noise="lowrank", antithetic=True)
    state = jax.eval_shape(lambda p: strategy.init(0, p), params)
    population = jax.eval_shape(strategy.ask, state)
    compiled = strategy.update.lower(state, population,
                                     jax.ShapeDtypeStruct((16,), jnp.float32)).compile()
    memory = compiled.memory_analysis()
    assert memory.alias_size_in_bytes >= param_bytes
    assert memory.temp_size_in_bytes < 4 * largest < param_bytes, memory.temp_size_in_bytes


def test_tell_consumes_its_state():
    strategy = es.agentic_esopt(4, 0.1, 0.1)
    state = strategy.init(0, jax.tree.map(jnp.copy, TARGET))
    strategy.tell(state, strategy.ask(state), np.arange(4.0))
    assert all(leaf.is_deleted() for leaf in jax.tree.leaves(state.params))


def test_stochastic_rounding_is_unbiased_and_keyed():
    x = jnp.asarray(np.random.default_rng(0).uniform(0.9, 1.1, 64), jnp.float32)
    draws = jax.vmap(lambda k: es.update.stochastic_round(x, jnp.bfloat16, k))(
        jax.random.split(jax.random.key(0), 4096)).astype(jnp.float32)
    spacing = 2.0 ** -7  # bfloat16's spacing in [1, 2); the s.e. of a mean is < it/128.
    assert float(jnp.max(jnp.abs(draws.mean(0) - x))) < 5 * spacing / 128
    nearest = x.astype(jnp.bfloat16).astype(jnp.float32)
    assert float(jnp.max(jnp.abs(draws.mean(0) - x))) < float(jnp.max(jnp.abs(nearest - x)))
    assert set(np.unique(np.abs(np.asarray(draws - x)) <= spacing)) == {True}
    np.testing.assert_array_equal(
        es.update.stochastic_round(x, jnp.bfloat16, jax.random.key(1)),
        es.update.stochastic_round(x, jnp.bfloat16, jax.random.key(1)))


def bfloat16_steps(rounding="nearest", master_weights=False, generations=3, seed=0):
    """A norm-scale-like bfloat16 leaf (θ = 1) under the published σ/α, G=32."""
    strategy = es.agentic_esopt(32, es.schedules.cosine(1e-3, 2.5e-4, 100), 5e-4,
                                rounding=rounding, master_weights=master_weights)
    state = strategy.init(seed, {"scale": jnp.ones((8192,), jnp.bfloat16)})
    changed = []
    for generation in range(generations):
        population = strategy.ask(state)
        before = np.asarray(state.params["scale"], np.float32)
        rewards = np.random.default_rng(generation).normal(size=32)
        state, _ = strategy.tell(state, population, rewards)
        changed.append(np.mean(np.asarray(state.params["scale"], np.float32) != before))
    return state, changed


def test_stochastic_rounding_lets_bfloat16_learn_and_replays_bitwise():
    _, nearest = bfloat16_steps("nearest")
    state, stochastic = bfloat16_steps("stochastic")
    assert max(nearest) == 0.0 and min(stochastic) > 0.002, (nearest, stochastic)
    again, _ = bfloat16_steps("stochastic")
    np.testing.assert_array_equal(np.asarray(state.params["scale"]),
                                  np.asarray(again.params["scale"]))
    other, _ = bfloat16_steps("stochastic", seed=1)
    assert not np.array_equal(np.asarray(other.params["scale"]),
                              np.asarray(state.params["scale"]))


def test_master_weights_are_the_float32_run():
    state, changed = bfloat16_steps(master_weights=True)
    _, master = state.opt_state
    strategy = es.agentic_esopt(32, es.schedules.cosine(1e-3, 2.5e-4, 100), 5e-4)
    exact = strategy.init(0, {"scale": jnp.ones((8192,), jnp.float32)})
    for generation in range(3):
        exact, _ = strategy.tell(exact, strategy.ask(exact),
                                 np.random.default_rng(generation).normal(size=32))
    np.testing.assert_array_equal(np.asarray(master["scale"]),
                                  np.asarray(exact.params["scale"]))
    np.testing.assert_array_equal(np.asarray(state.params["scale"]),
                                  np.asarray(master["scale"].astype(jnp.bfloat16)))


def test_rounding_settings_are_validated_together():
    with pytest.raises(ValueError, match="rounding: unknown 'up'"):
        es.agentic_esopt(4, 0.1, 0.1, rounding="up")
    with pytest.raises(ValueError, match="alternatives"):
        es.agentic_esopt(4, 0.1, 0.1, rounding="stochastic", master_weights=True)
    assert "rounding: unknown 'up'" in " ".join(
        es.options.Options(rounding="up").problems())


@pytest.mark.parametrize("optimizer,noise", [("sgd", "lowrank"), ("sgd", "full"),
                                             ("adamw", "lowrank")])
def test_a_scope_moves_only_its_leaves(optimizer, noise):
    """Scope "lora" moves only the adapter factors; the base leaves (even under adamw's
    weight decay) and the constant scale stay bitwise as they were."""
    params = {"layers": {"q_proj": {"kernel": jnp.linspace(-1.0, 1.0, 48).reshape(2, 4, 6),
                                    "lora_a": jnp.linspace(-0.5, 0.5, 16).reshape(2, 4, 2),
                                    "lora_b": jnp.zeros((2, 2, 6)),
                                    "lora_scale": jnp.full((2,), 2.0)}},
              "embed": {"embedding": jnp.linspace(0.0, 1.0, 12).reshape(3, 4)}}
    strategy = es.agentic_esopt(8, 0.1, 0.05, noise=noise, rank=2 if noise == "lowrank" else 1,
                                scope="lora", optimizer=optimizer,
                                weight_decay=0.1 if optimizer == "adamw" else 0.0)
    state = strategy.init(0, jax.tree.map(jnp.copy, params))
    for generation in range(3):
        state, metrics = strategy.tell(state, strategy.ask(state),
                                       np.arange(8.0) * (generation + 1))
    assert float(metrics["update_norm"]) > 0
    for (path, before), after in zip(jax.tree_util.tree_flatten_with_path(params)[0],
                                     jax.tree.leaves(state.params), strict=True):
        moved = not np.array_equal(np.asarray(before), np.asarray(after))
        assert moved == (path[-1].key in ("lora_a", "lora_b")), path


def test_block_rows_fit_the_budget_and_the_last_block_takes_the_rest():
    assert es.update.block_rows((600, 6), 64, min_rows=256) == 256  # 256 + 344.
    assert es.update.block_rows((50,), 64) == 16  # 16 + 16 + 18.
    assert es.update.block_rows((5, 7, 3), 64) == 1  # A row is 84 bytes: one per block.
    assert es.update.block_rows((49152, 576), 16 * 2**20) == 7281
    assert es.update.block_rows((50,), 120) == 50  # 30 + 20 rows: fewer than two blocks.
    assert es.update.block_rows((50,), 0) == 50 and es.update.block_rows((), 64) == 1


BLOCKED_CASES = [  # noise, antithetic, precision, scope; stochastic rounding and full noise
    # update whole leaves.
    "lowrank,False,float32,full", "lowrank,True,float32,embed|stacked",
    "lowrank,False,float32,stacked", "lowrank,True,master,full",
    "lowrank,False,master,embed|stacked", "lowrank,True,stochastic,full",
    "full,True,float32,full"]


@pytest.fixture(scope="module")
def blocked_updates():
    """Each case's blocked vs whole-leaf comparison (``blocked_update_check.py``), run in
    one fresh process under XLA's default CPU code generation: bit-for-bit equality of two
    programs is a property of the code generated for them."""
    done = subprocess.run([sys.executable, os.path.join(HERE, "blocked_update_check.py"),
                           *BLOCKED_CASES, "momentum"], capture_output=True, text=True,
                          timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


@pytest.mark.parametrize("case", BLOCKED_CASES)
def test_blocked_update_is_the_whole_leaf_update_bit_for_bit(blocked_updates, case):
    result = blocked_updates[case]
    assert result["params"] and result["opt_state"]
    assert result["norms_close"]  # Summed by block.
    assert result["stacked_moved"]  # In every scope here.


def test_blocked_update_cuts_per_entry_optimizer_state_bit_for_bit(blocked_updates):
    """SGD with momentum keeps a trace per entry: each block steps its own rows."""
    result = blocked_updates["momentum"]
    assert result["params"] and result["opt_state"] and result["opt_state_moved"]


@pytest.mark.parametrize("noise", ["lowrank", "full"])
def test_blocked_update_holds_a_block_not_the_leaf(noise):
    """The temporaries of updating a 32 MB low-rank leaf in 1 MB blocks are a few blocks;
    full-rank leaves stay whole (a block of a threefry draw costs the whole draw)."""
    params = {"embed": jax.ShapeDtypeStruct((16384, 512), jnp.float32)}
    temps = {}
    for block_bytes in (2**20, 0):
        strategy = es.agentic_esopt(8, 1e-3, 1e-3, noise=noise, antithetic=True,
                                    update_block_bytes=block_bytes)
        state = jax.eval_shape(lambda p, s=strategy: s.init(0, p), params)
        population = jax.eval_shape(strategy.ask, state)
        compiled = strategy.update.lower(state, population,
                                         jax.ShapeDtypeStruct((8,), jnp.float32)).compile()
        temps[block_bytes] = compiled.memory_analysis().temp_size_in_bytes
    assert temps[0] >= 2**25  # At least the leaf's float32 estimate.
    if noise == "lowrank":
        assert temps[2**20] < 6 * 2**20, temps
    else:
        assert temps[2**20] == temps[0], temps


def test_update_block_bytes_is_validated():
    with pytest.raises(ValueError, match="update_block_bytes must be an int >= 0"):
        es.agentic_esopt(4, 0.1, 0.1, update_block_bytes=-1)
    assert any("update_block_bytes" in problem for problem in
               es.options.Options(update_block_bytes=1.5).problems())
