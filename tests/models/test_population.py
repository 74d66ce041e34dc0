"""Population inference: batched low-rank members and sequential full-rank members.

Shapes are shared across tests (4 rows, two models) to keep compilations few; the tiny
model's populations (3 members, rank 2 when low-rank) are those of the other tiny-model
files, so the persistent compilation cache shares their programs.
"""

import dataclasses

import jax
import numpy as np
import pytest

from agentic_esopt import es, models
from agentic_esopt.models import decoder, sampling

from parity import assert_population_rows_equal_member_forwards

FULL_FEATURED = models.ModelConfig(
    model_type="qwen3", vocab_size=48, hidden_size=32, intermediate_size=48, num_layers=2,
    num_heads=4, num_kv_heads=2, head_dim=12, qkv_bias=True, qk_norm=True,
    tie_word_embeddings=False)
MEMBERS = np.array([2, 0, 2, 1])
PROMPTS = ["abc", "hello", "abc", "xyz"]


def noisy_params(config, seed=0):
    """Random params with non-trivial norms and biases (init_params gives ones and zeros)."""
    rng = np.random.RandomState(seed)
    params = models.init_params(config, jax.random.key(seed))
    return jax.tree.map(lambda p: p * 3 + 0.1 * rng.randn(*p.shape).astype(np.float32), params)


def population_of(params, noise, sigma=0.05, size=3):
    strategy = es.agentic_esopt(population_size=size, sigma=sigma, learning_rate=1e-3,
                                noise=noise, rank=2 if noise == "lowrank" else 1)
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


def test_deltas_hold_member_level_factors_and_each_rows_member(tiny):
    population = population_of(tiny.params, "lowrank")
    factors, members = sampling._population_deltas(tiny.params, population, MEMBERS)
    np.testing.assert_array_equal(members, MEMBERS)
    member = MEMBERS[2]
    shift = jax.tree.map(lambda p, q: np.asarray(p - q),
                         es.noise.perturb(tiny.params, population, member), tiny.params)
    q = factors["layers"]["attn"]["q_proj"]["kernel"]
    assert q.a.shape == (2, 3, 64, 2) and q.b.shape == (2, 3, 64, 2)  # (L, G, in|out, r)
    np.testing.assert_allclose(np.einsum("lir,lor->lio", q.a[:, member], q.b[:, member]),
                               shift["layers"]["attn"]["q_proj"]["kernel"], atol=1e-6)
    norm = factors["layers"]["input_norm"]["scale"]
    assert norm.shape == (2, 3, 64)
    np.testing.assert_allclose(norm[:, member], shift["layers"]["input_norm"]["scale"],
                               atol=1e-6)
    embedding = factors["embed"]["embedding"]
    np.testing.assert_allclose(embedding.a[member] @ embedding.b[member].T,
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
    for member in (2, 0, 1):
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
        expected = models.logits(config, perturbed, ids, mask)[row]
        np.testing.assert_allclose(batched[row], expected, atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="needs members"):
        models.logits(config, params, ids, mask, population)
    with pytest.raises(ValueError, match=r"in \[0, 3\)"):
        models.logits(config, params, ids, mask, population, [0, 1, 3, 0])
    with pytest.raises(ValueError, match="ints"):
        models.logits(config, params, ids, mask, population, [0, 1])


def test_decode_gathers_row_deltas_one_layer_at_a_time():
    """32 rows of 2 members: the compiled decode loop's memory over plain decoding stays far
    below the per-row factors of every layer (what gathering them before the layer scan, or
    gathering the vocabulary-wide factors per row, would hold)."""
    config = models.ModelConfig(model_type="llama", vocab_size=4096, hidden_size=64,
                                intermediate_size=128, num_layers=8, num_heads=4,
                                num_kv_heads=2, head_dim=16)
    params = models.init_params(config, jax.random.key(0))
    rows, new_tokens = 32, 16
    members = np.arange(rows, dtype=np.int32) % 2
    population = population_of(params, "lowrank", size=2)
    tokens = np.zeros((rows, 16), np.int32)
    loop = (jax.random.split(jax.random.key(0), rows), np.int32([0]), np.float32(1),
            np.float32(1), np.zeros(2, np.float32), np.int32(new_tokens))
    mode = sampling.SamplingMode(greedy=True, top_k=None, top_p=False)

    def peak_bytes(deltas):
        state = jax.eval_shape(lambda: sampling._prefill(config, params, deltas, tokens,
                                                         np.ones_like(tokens), new_tokens))
        m = sampling._decode.lower(config, mode, params, deltas, state,
                                   *loop).compile().memory_analysis()
        return (m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes
                - m.alias_size_in_bytes)

    deltas = jax.eval_shape(lambda: sampling._population_deltas(params, population, members))
    row_factor_bytes = rows // 2 * sum(x.size * x.dtype.itemsize
                                       for x in jax.tree.leaves(deltas.factors))
    extra = peak_bytes(deltas) - peak_bytes(decoder.no_deltas(params))
    assert extra < row_factor_bytes / 4
