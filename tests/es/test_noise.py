"""Noise derivation, low-rank structure, antithetic pairs and scopes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentic_esopt import es


def make_params():
    return {
        "embed": {"embedding": jnp.zeros((11, 6))},
        "layers": {"q_proj": {"kernel": jnp.zeros((3, 6, 5)), "bias": jnp.zeros((3, 5))},
                   "input_norm": {"scale": jnp.ones((3, 6))}},
        "final_norm": {"scale": jnp.ones(6)},
        "head": {"kernel": jnp.zeros((6, 4), jnp.bfloat16)},
    }


def population(noise="full", rank=1, antithetic=False, generation=0, size=4, scope="full",
               seed=0):
    strategy = es.agentic_esopt(size, 0.1, 1e-2, noise=noise, rank=rank,
                                antithetic=antithetic, scope=scope)
    state = strategy.init(seed, make_params())
    state = state.replace(generation=jnp.asarray(generation, jnp.int32))
    return state, strategy.ask(state)


def leaves(tree):
    return jax.tree.leaves(tree)


def test_path_id_is_stable_crc32():
    # A fixed value: it must not depend on the process (Python's hash() is salted).
    assert es.noise.path_id("['layers']['q_proj']['kernel']") == 2449494936


@pytest.mark.parametrize("noise", ["full", "lowrank"])
def test_same_key_gives_bitwise_identical_noise(noise):
    state, pop = population(noise)
    _, pop_again = population(noise)
    a = es.noise.member_noise(state.params, pop, 2)
    b = es.noise.member_noise(state.params, pop_again, 2)
    for x, y in zip(leaves(a), leaves(b)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.parametrize("noise", ["full", "lowrank"])
def test_generation_member_and_leaf_change_the_noise(noise):
    state, pop = population(noise)
    _, later = population(noise, generation=1)
    base = es.noise.member_noise(state.params, pop, 0)
    other_member = es.noise.member_noise(state.params, pop, 1)
    other_generation = es.noise.member_noise(state.params, later, 0)
    for other in (other_member, other_generation):
        for x, y in zip(leaves(base), leaves(other)):
            assert not np.allclose(np.asarray(x), np.asarray(y))
    # Two leaves of the same shape get different noise.
    twin = {"a": jnp.zeros((6, 6)), "b": jnp.zeros((6, 6))}
    twin_noise = es.noise.member_noise(twin, pop, 0)
    assert not np.allclose(twin_noise["a"], twin_noise["b"])


def test_noise_is_float32_and_perturb_keeps_dtypes():
    state, pop = population("full")
    noise = es.noise.member_noise(state.params, pop, 0)
    assert all(x.dtype == jnp.float32 for x in leaves(noise))
    perturbed = es.noise.perturb(state.params, pop, 0)
    for p, q in zip(leaves(state.params), leaves(perturbed)):
        assert p.dtype == q.dtype and p.shape == q.shape


def test_perturb_is_sigma_times_sign_times_noise():
    state, pop = population("full", antithetic=True)
    params = jax.tree.map(lambda p: p.astype(jnp.float32), state.params)
    for member in (0, 1):
        perturbed = es.noise.perturb(params, pop, member)
        noise = es.noise.member_noise(params, pop, member)
        sign = float(pop.signs[member])
        for p, q, e in zip(leaves(params), leaves(perturbed), leaves(noise)):
            np.testing.assert_allclose(q - p, 0.1 * sign * e, rtol=1e-5, atol=1e-7)


def test_lowrank_noise_equals_materialised_factors():
    state, pop = population("lowrank", rank=3)
    noise = es.noise.member_noise(state.params, pop, 1)
    factors = es.noise.population_factors(pop, state.params)
    kernel = factors["layers"]["q_proj"]["kernel"]
    assert kernel.a.shape == (4, 3, 6, 3) and kernel.b.shape == (4, 3, 5, 3)
    delta = jnp.einsum("lir,lor->lio", kernel.a[1], kernel.b[1])
    np.testing.assert_allclose(delta, 0.1 * noise["layers"]["q_proj"]["kernel"],
                               rtol=1e-5, atol=1e-7)
    # E = A Bᵀ/√r has rank r per matrix.
    assert np.linalg.matrix_rank(np.asarray(noise["embed"]["embedding"])) == 3
    # Vectors get full-rank noise in low-rank mode.
    bias = factors["layers"]["q_proj"]["bias"]
    np.testing.assert_allclose(bias[1], 0.1 * noise["layers"]["q_proj"]["bias"], rtol=1e-6)


def test_population_factors_match_perturb_for_every_member():
    state, pop = population("lowrank", rank=2, antithetic=True)
    params = jax.tree.map(lambda p: p.astype(jnp.float32), state.params)
    factors = es.noise.population_factors(pop, params)
    for member in range(pop.size):
        perturbed = es.noise.perturb(params, pop, member)

        def delta(_, f):
            if isinstance(f, es.LowRank):
                return jnp.einsum("...ir,...or->...io", f.a[member], f.b[member])
            return f[member]

        deltas = jax.tree.map(delta, params, factors)
        for p, q, d in zip(leaves(params), leaves(perturbed), leaves(deltas)):
            np.testing.assert_allclose(q - p, d, rtol=1e-4, atol=1e-7)


def test_population_factors_needs_lowrank():
    state, pop = population("full")
    with pytest.raises(ValueError, match="lowrank"):
        es.noise.population_factors(pop, state.params)


@pytest.mark.parametrize("noise", ["full", "lowrank"])
def test_antithetic_pairs_cancel(noise):
    state, pop = population(noise, antithetic=True, size=6)
    np.testing.assert_array_equal(pop.keys[0::2], pop.keys[1::2])
    np.testing.assert_array_equal(pop.signs, [1, -1, 1, -1, 1, -1])
    params = jax.tree.map(lambda p: p.astype(jnp.float32) + 1.0, state.params)
    plus = es.noise.perturb(params, pop, 2)
    minus = es.noise.perturb(params, pop, 3)
    for p, a, b in zip(leaves(params), leaves(plus), leaves(minus)):
        np.testing.assert_allclose((a + b) / 2, p, rtol=0, atol=1e-6)
        assert not np.allclose(a, p)


def test_scopes_select_leaves():
    params = make_params()
    def selected(scope):
        paths = es.noise.leaf_paths(params)
        return sorted(p for p, leaf in zip(leaves(paths), leaves(params))
                      if es.noise.in_scope(scope, p, leaf))
    assert len(selected("full")) == len(leaves(params))
    assert selected("all_linear") == ["['head']['kernel']", "['layers']['q_proj']['kernel']"]
    assert selected(r"q_proj") == ["['layers']['q_proj']['bias']",
                                   "['layers']['q_proj']['kernel']"]
    state, pop = population("full", scope="all_linear")
    noise = es.noise.member_noise(state.params, pop, 0)
    assert not np.any(noise["embed"]["embedding"])
    assert not np.any(noise["final_norm"]["scale"])
    assert np.all(noise["layers"]["q_proj"]["kernel"] != 0)


def test_bad_scope_and_noise_are_rejected():
    with pytest.raises(ValueError, match="regex"):
        es.agentic_esopt(4, 0.1, 0.1, scope="(")
    with pytest.raises(ValueError, match="noise"):
        es.agentic_esopt(4, 0.1, 0.1, noise="dense")
    with pytest.raises(ValueError, match="even"):
        es.agentic_esopt(5, 0.1, 0.1, antithetic=True)
