"""Population inference: batched low-rank members and sequential full-rank members.

Shapes are shared across tests (4 rows, two models) to keep compilations few.
"""

import dataclasses

import jax
import numpy as np
import pytest

from agentic_esopt import es, models
from agentic_esopt.models import sampling

from parity import assert_population_rows_equal_member_forwards

FULL_FEATURED = models.ModelConfig(
    model_type="qwen3", vocab_size=48, hidden_size=32, intermediate_size=48, num_layers=2,
    num_heads=4, num_kv_heads=2, head_dim=12, qkv_bias=True, qk_norm=True,
    tie_word_embeddings=False)
MEMBERS = np.array([3, 0, 3, 1])
PROMPTS = ["abc", "hello", "abc", "xyz"]


def noisy_params(config, seed=0):
    """Random params with non-trivial norms and biases (init_params gives ones and zeros)."""
    rng = np.random.RandomState(seed)
    params = models.init_params(config, jax.random.key(seed))
    return jax.tree.map(lambda p: p * 3 + 0.1 * rng.randn(*p.shape).astype(np.float32), params)


def population_of(params, noise, sigma=0.05):
    strategy = es.agentic_esopt(population_size=4, sigma=sigma, learning_rate=1e-3,
                                noise=noise, rank=2)
    return strategy.ask(strategy.init(jax.random.key(7), params))


def with_params(model, params):
    return dataclasses.replace(model, params=params)


@pytest.fixture(scope="module")
def tiny():
    model = models.load("tiny")
    return with_params(model, noisy_params(model.config))


def left_padded_batch(config, length=10):
    ids = np.random.RandomState(0).randint(0, config.vocab_size, (len(MEMBERS), length))
    mask = np.ones_like(ids)
    mask[1, :4] = 0
    mask[3, :8] = 0
    return ids, mask


@pytest.mark.parametrize("model_name", ["full_featured", "tiny_tied"])
def test_lowrank_rows_equal_forward_on_perturbed_params(model_name, tiny):
    if model_name == "full_featured":
        config, params = FULL_FEATURED, noisy_params(FULL_FEATURED)
    else:
        config, params = tiny.config, tiny.params
    population = population_of(params, "lowrank")
    ids, mask = left_padded_batch(config)
    assert_population_rows_equal_member_forwards(config, params, population, MEMBERS, ids,
                                                 mask)


def test_row_deltas_hold_each_rows_member_delta(tiny):
    population = population_of(tiny.params, "lowrank")
    deltas = sampling._population_deltas(tiny.params, population, MEMBERS)
    member = MEMBERS[2]
    shift = jax.tree.map(lambda p, q: np.asarray(p - q),
                         es.noise.perturb(tiny.params, population, member), tiny.params)
    q = deltas["layers"]["attn"]["q_proj"]["kernel"]
    assert q.a.shape == (2, 4, 64, 2) and q.b.shape == (2, 4, 64, 2)  # (L, B, in|out, r)
    np.testing.assert_allclose(np.einsum("lir,lor->lio", q.a[:, 2], q.b[:, 2]),
                               shift["layers"]["attn"]["q_proj"]["kernel"], atol=1e-6)
    norm = deltas["layers"]["input_norm"]["scale"]
    assert norm.shape == (2, 4, 64)
    np.testing.assert_allclose(norm[:, 2], shift["layers"]["input_norm"]["scale"], atol=1e-6)
    embedding = deltas["embed"]["embedding"]
    np.testing.assert_allclose(embedding.a[2] @ embedding.b[2].T,
                               shift["embed"]["embedding"], atol=1e-6)


def test_lowrank_generation_matches_perturbed_params(tiny):
    population = population_of(tiny.params, "lowrank", sigma=0.2)
    out = models.generate(tiny, PROMPTS, max_new_tokens=8, population=population,
                          members=MEMBERS)
    for row, member in enumerate(MEMBERS):
        perturbed = with_params(tiny, es.noise.perturb(tiny.params, population, member))
        alone = models.generate(perturbed, [PROMPTS[row]], max_new_tokens=8)
        assert out.token_ids[row] == alone.token_ids[0]
    assert out.token_ids[0] != models.generate(tiny, PROMPTS[:1], max_new_tokens=8).token_ids[0]


def test_fullrank_generation_runs_members_sequentially(tiny):
    population = population_of(tiny.params, "full", sigma=0.2)
    out = models.generate(tiny, PROMPTS, max_new_tokens=8, population=population,
                          members=MEMBERS)
    for member in (3, 0, 1):
        rows = [r for r, m in enumerate(MEMBERS) if m == member]
        perturbed = with_params(tiny, es.noise.perturb(tiny.params, population, member))
        expected = models.generate(perturbed, [PROMPTS[r] for r in rows], max_new_tokens=8)
        assert [out.token_ids[r] for r in rows] == expected.token_ids
    assert out.token_ids != models.generate(tiny, PROMPTS, max_new_tokens=8).token_ids


def test_fullrank_logits_and_member_validation(tiny):
    config, params = tiny.config, tiny.params
    population = population_of(params, "full")
    ids, mask = left_padded_batch(config)
    batched = np.asarray(models.logits(config, params, ids, mask, population, MEMBERS))
    for row, member in enumerate(MEMBERS):
        perturbed = es.noise.perturb(params, population, member)
        expected = models.logits(config, perturbed, ids[row:row + 1], mask[row:row + 1])
        np.testing.assert_allclose(batched[row], expected[0], atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="needs members"):
        models.logits(config, params, ids, mask, population)
    with pytest.raises(ValueError, match=r"in \[0, 4\)"):
        models.logits(config, params, ids, mask, population, [0, 1, 4, 0])
    with pytest.raises(ValueError, match="ints"):
        models.logits(config, params, ids, mask, population, [0, 1])
