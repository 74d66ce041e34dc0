"""ES algorithms as hooks: a third algorithm in this file, the registry, one keyword set."""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from agentic_esopt import es


def baseline_subtracted_ranks(rewards):
    """Centered ranks minus their mean (the baseline)."""
    ranks = es.fitness.centered_rank(rewards)
    return ranks - ranks.mean()


def openai_es(population_size, sigma, learning_rate, antithetic=True, optimizer="adam",
              **keywords):
    """OpenAI-ES (Salimans et al. 2017): ĝ = 1/(Gσ) Σ_i w_i ε_i, w baseline-subtracted
    centered ranks, Adam; the whole algorithm is this function."""
    settings = es.options.Settings.of(population_size, sigma, learning_rate,
                                      antithetic=antithetic, optimizer=optimizer, **keywords)
    return es.strategy.make(settings, es.strategy.Algorithm(
        "openai_es", shape=baseline_subtracted_ranks,
        scale=lambda population: 1.0 / (population.size * population.sigma)))


es.strategies.register("openai_es", openai_es)

TARGET = {"dense": {"kernel": jnp.linspace(-1.0, 1.0, 48).reshape(8, 6),
                    "bias": jnp.linspace(0.5, -0.5, 6)},
          "stacked": jnp.linspace(-0.5, 0.5, 24).reshape(2, 4, 3)}
ZEROS = jax.tree.map(jnp.zeros_like, TARGET)


def objective(params):
    return -sum(jnp.sum((p - t) ** 2) for p, t in zip(jax.tree.leaves(params),
                                                       jax.tree.leaves(TARGET)))


@jax.jit
def rewards_of(params, population):
    members = jnp.arange(population.size)
    return jax.vmap(lambda i: objective(es.noise.perturb(params, population, i)))(members)


def run(strategy, generations, seed=0):
    state = strategy.init(seed, jax.tree.map(jnp.copy, ZEROS))  # tell consumes it.
    for _ in range(generations):
        population = strategy.ask(state)
        state, metrics = strategy.tell(state, population,
                                       np.asarray(rewards_of(state.params, population)))
    return state, metrics


def assert_trees_equal(x, y):
    for a, b in zip(jax.tree.leaves(x), jax.tree.leaves(y), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_the_test_strategy_is_registered_beside_the_shipped_ones():
    assert {"agentic_esopt", "openai_es", "random_search"} <= set(es.strategies.names())
    assert es.strategies.get("agentic_esopt") is es.agentic_esopt
    with pytest.raises(ValueError, match="already registered"):
        es.strategies.register("openai_es", es.agentic_esopt)
    with pytest.raises(ValueError, match="unknown ES strategy 'cma'"):
        es.strategies.get("cma")


LEARNING_RATES = {"random_search": 1.0}  # Its α: the fraction of the way to the best.


@pytest.mark.parametrize("name", es.strategies.names())
def test_every_strategy_improves_an_analytic_objective_and_replays_from_its_spec(name):
    strategy = es.strategies.get(name)(16, 0.05, LEARNING_RATES.get(name, 0.1),
                                       noise="lowrank", rank=2, antithetic=True)
    state, metrics = run(strategy, 20)
    initial = float(objective(ZEROS))
    assert float(objective(state.params)) > 0.5 * initial, name
    assert int(state.generation) == 20 and float(metrics["update_norm"]) > 0
    spec = json.loads(json.dumps(strategy.spec))
    assert spec["strategy"] == name and spec["population_size"] == 16
    assert_trees_equal(state, run(es.from_spec(spec), 20)[0])


def test_one_keyword_set_builds_a_strategy_from_options_a_spec_and_the_factory():
    options = es.options.Options(strategy="random_search", population_size=6,
                                 sigma_schedule="constant", sigma_end=1e-3, antithetic=True)
    keywords = es.options.keywords(options, generations=10)
    built = [es.from_options(options, 10), es.random_search(**keywords)]
    built.append(es.from_spec(built[0].spec))
    assert [strategy.spec for strategy in built] == [built[0].spec] * 3
    assert set(keywords) == {field.name for field in dataclasses.fields(es.options.Settings)}


def test_random_search_owns_its_ask_and_moves_onto_the_best_member():
    strategy = es.random_search(6, 0.05, 1.0, optimizer=optax.sgd(1.0))
    state = strategy.init(3, jax.tree.map(jnp.copy, ZEROS))  # tell consumes it.
    population = strategy.ask(state)
    np.testing.assert_array_equal(population.signs, [0, 1, 1, 1, 1, 1])  # θ is member 0.
    rewards = np.asarray(rewards_of(ZEROS, population))
    best = int(np.argmax(rewards))
    assert best != 0
    member = es.noise.perturb(ZEROS, population, best)
    state, metrics = strategy.tell(state, population, rewards)
    np.testing.assert_array_equal(metrics["weights"], np.eye(6)[best])
    for moved, expected in zip(jax.tree.leaves(state.params), jax.tree.leaves(member)):
        np.testing.assert_allclose(moved, expected, rtol=1e-6, atol=1e-7)
    kept = jax.tree.map(jnp.copy, state.params)
    state, metrics = strategy.tell(state, strategy.ask(state), [1.0, 0, 0, 0, 0, 1.0])
    assert float(metrics["update_norm"]) == 0  # The incumbent wins ties: θ stays.
    assert_trees_equal(state.params, kept)


def test_openai_es_applies_its_own_weights_and_scale():
    """One step with SGD(1) moves θ by ĝ = 1/(Gσ) Σ_i w_i sign_i ε_i."""
    size, sigma = 8, 0.05
    strategy = openai_es(size, sigma, 1.0, noise="lowrank", rank=2,
                         optimizer=optax.sgd(1.0))
    state = strategy.init(3, jax.tree.map(jnp.copy, TARGET))  # tell consumes it.
    population = strategy.ask(state)
    rewards = np.asarray(rewards_of(TARGET, population))
    new_state, metrics = strategy.tell(state, population, rewards)
    weights = np.asarray(baseline_subtracted_ranks(rewards))
    np.testing.assert_allclose(metrics["weights"], weights, atol=1e-6)
    assert abs(weights.sum()) < 1e-5 and len(set(weights)) < size  # Tied members share.
    expected = jax.tree.map(jnp.zeros_like, TARGET)
    for i in range(size):
        coeff = weights[i] * float(population.signs[i]) / (size * sigma)
        expected = jax.tree.map(lambda e, n, c=coeff: e + c * n, expected,
                                es.noise.member_noise(TARGET, population, i))
    for moved, before, reference in zip(jax.tree.leaves(new_state.params),
                                        jax.tree.leaves(TARGET), jax.tree.leaves(expected)):
        np.testing.assert_allclose(moved - before, reference, rtol=1e-5, atol=1e-6)


def test_openai_es_differs_from_agentic_esopt_only_in_its_hooks():
    # Agentic ESOpt with OpenAI-ES's shaping, σ-scaling and optimizer: the same run.
    like_openai = es.agentic_esopt(8, 0.05, 0.1, antithetic=True, fitness="centered_rank",
                                   scale_by_sigma=True, optimizer="adam")
    paper = es.agentic_esopt(8, 0.05, 0.1, antithetic=True)
    moved = {name: run(strategy, 2)[0].params["dense"]["kernel"] for name, strategy in
             [("openai_es", openai_es(8, 0.05, 0.1)), ("like_openai", like_openai),
              ("paper", paper)]}
    np.testing.assert_allclose(moved["openai_es"], moved["like_openai"], rtol=1e-5,
                               atol=1e-7)
    assert not np.allclose(moved["openai_es"], moved["paper"], atol=1e-3)


@pytest.mark.parametrize("noise", ["full", "lowrank"])
def test_openai_es_tell_memory_is_one_leaf_whatever_the_population(noise):
    """Compiled temp memory of the update for G=8 and G=256 on an ~8M-parameter tree."""
    params = {"layers": {"kernel": jax.ShapeDtypeStruct((4, 1024, 1024), jnp.float32)},
              "embed": {"embedding": jax.ShapeDtypeStruct((4096, 1024), jnp.float32)},
              "norm": {"scale": jax.ShapeDtypeStruct((1024,), jnp.float32)}}
    param_bytes = 4 * sum(np.prod(x.shape) for x in jax.tree.leaves(params))
    leaf_bytes = 4 * 4096 * 1024
    temps = {}
    for size in (8, 256):
        strategy = openai_es(size, 1e-3, 1e-3, noise=noise)
        state = jax.eval_shape(lambda p: strategy.init(0, p), params)
        population = jax.eval_shape(strategy.ask, state)
        rewards = jax.ShapeDtypeStruct((size,), jnp.float32)
        compiled = strategy.update.lower(state, population, rewards).compile()
        temps[size] = compiled.memory_analysis().temp_size_in_bytes
    assert temps[256] <= temps[8] + leaf_bytes, temps
    # Adam's moments are 2× params; materialising the population would be 256× params.
    assert temps[256] < 5 * param_bytes, temps


BAD_SETTINGS = [  # (settings, how many problems they have)
    (dict(population_size=1), 1), (dict(population_size=5, antithetic=True), 1),
    (dict(noise="sparse"), 1), (dict(rank=4), 1), (dict(fitness="softmax"), 1),
    (dict(scope="(unclosed"), 1), (dict(learning_rate=0.0), 1), (dict(optimizer="lion"), 1),
    (dict(weight_decay=0.1), 1), (dict(sigma_start=0.0), 1),
    (dict(population_size=1, fitness="softmax", rank=0, noise="lowrank"), 3)]


@pytest.mark.parametrize("settings, count", BAD_SETTINGS, ids=str)
def test_the_config_and_the_factory_report_the_same_problems(settings, count):
    options = es.options.Options(**settings)
    problems = options.problems()
    assert len(problems) == count, problems
    with pytest.raises(ValueError) as error:
        es.from_options(options, generations=10)
    assert str(error.value).splitlines()[1:] == [f"  {p}" for p in problems]


def test_population_size_two_is_the_smallest():
    assert es.options.Options(population_size=2).problems() == []
    with pytest.raises(ValueError, match="population_size must be >= 2"):
        es.agentic_esopt(1, 0.1, 0.1)
    with pytest.raises(ValueError, match="learning_rate is required"):
        es.agentic_esopt(4, 0.1, None)
    es.agentic_esopt(4, 0.1, None, optimizer=optax.sgd(0.1))  # Reported α: 0.
