"""KV caches kept across turns: the same tokens as re-prefilling every turn, bounded memory."""

import jax
import numpy as np
import pytest

from agentic_esopt import es, models
from agentic_esopt.models import kv_cache, layers, sampling

TURNS = 4


@pytest.fixture(scope="module")
def model(hf_checkpoint):
    """One dense model with every feature the families differ in (q/k/v/o biases, q/k
    norms, an untied head): they change what is cached, never how the cache is kept."""
    model = models.load(hf_checkpoint("qwen3", seed=3, attention_bias=True)[1])
    config = model.config
    assert config.qkv_bias and config.o_bias and config.qk_norm
    assert not config.tie_word_embeddings
    return model


def observations(rows: int, turn: int) -> list[list[int]]:
    """Each row's new observation at a turn: lengths differ across rows and turns."""
    rng = np.random.RandomState(100 * turn + rows)
    return [rng.randint(3, 250, 2 + (5 * row + 3 * turn) % 9).tolist() for row in range(rows)]


def play(model, kept, rows=6, active=lambda turn: range(6), opening=(), **kwargs):
    """A multi-turn token conversation: each turn's prompt is the last prompt, the reply and
    a new observation; the first starts with the ``opening`` tokens (a system prompt).
    ``kept``: one ConversationCache for every turn, else fresh calls. Returns every turn's
    replies and log-probabilities."""
    cache = models.ConversationCache() if kept else None
    prompts = [list(opening) + obs for obs in observations(rows, 0)]
    outputs = []
    for turn in range(TURNS):
        called = list(active(turn))
        out = models.generate(model, [prompts[r] for r in called], max_new_tokens=5,
                              conversation=models.Conversation(cache, called) if kept else None,
                              streams=called, **kwargs)
        outputs.append((out.token_ids, out.logprobs))
        new = observations(rows, turn + 1)
        for r, ids in zip(called, out.token_ids):
            prompts[r] = prompts[r] + ids + new[r]
    return outputs


def assert_same(kept, fresh, atol=2e-5):
    for (kept_ids, kept_logprobs), (fresh_ids, fresh_logprobs) in zip(kept, fresh):
        assert kept_ids == fresh_ids
        for a, b in zip(kept_logprobs, fresh_logprobs):
            np.testing.assert_allclose(a, b, atol=atol)


def test_kept_cache_gives_the_tokens_of_re_prefilling_greedy(model):
    assert_same(play(model, kept=True), play(model, kept=False))


def test_a_turn_feeds_only_the_new_observation(model):
    # play()'s six rows and calls: the programs compiled for the greedy test serve.
    cache = models.ConversationCache()
    prompts = observations(6, 0)
    expected_fed = [sum(map(len, prompts))]  # Then each turn's new observations.
    fed = []
    for turn in range(TURNS):
        before = cache.fed_tokens
        out = models.generate(model, prompts, max_new_tokens=5,
                              conversation=models.Conversation(cache, range(6)))
        fed.append(cache.fed_tokens - before)
        new = observations(6, turn + 1)
        expected_fed.append(sum(map(len, new)))
        prompts = [p + ids + obs for p, ids, obs in zip(prompts, out.token_ids, new)]
    assert fed == expected_fed[:TURNS]


def test_kept_cache_gives_the_tokens_of_re_prefilling_sampling(model):
    sampling = dict(temperature=1.0, key=jax.random.key(7))
    assert_same(play(model, True, **sampling), play(model, False, **sampling))


def finishing(turn):
    return range(6 - 2 * turn) if turn < 3 else [1]  # 6, 4, 2, 1 rows.


def test_finished_rows_drop_out_and_the_rest_match(model):
    assert_same(play(model, True, active=finishing), play(model, False, active=finishing))


def test_a_stacked_cache_keeps_the_tokens_of_per_layer_buffers_greedy(model):
    """Kept caches in the stacked layout (relaid as rows finish: ``_gather``) give the
    per-layer buffers' tokens and log-probabilities within 1e-5."""
    assert_same(play(model.with_cache_layout("stacked"), True, active=finishing),
                play(model, True, active=finishing), atol=1e-5)


def test_population_members_keep_their_caches(model):
    for noise in ("lowrank", "full"):
        strategy = es.agentic_esopt(population_size=3, sigma=0.05, learning_rate=1e-3,
                                    noise=noise, rank=2 if noise == "lowrank" else 1)
        population = strategy.ask(strategy.init(jax.random.key(1), model.params))
        members = np.array([0, 1, 2, 0, 1, 2], np.int32)
        kwargs = dict(population=population, members=members)
        assert_same(play(model, True, **kwargs), play(model, False, **kwargs))


def test_long_prompts_fed_in_pieces_give_the_same_tokens(model, request):
    strategy = es.agentic_esopt(population_size=3, sigma=0.05, learning_rate=1e-3,
                                noise="lowrank", rank=2)
    kwargs = dict(population=strategy.ask(strategy.init(jax.random.key(1), model.params)),
                  members=np.array([0, 1, 2, 0, 1, 2], np.int32), temperature=1.0,
                  key=jax.random.key(7), opening=range(3, 43))
    whole = play(model, True, **kwargs)
    widths = request.getfixturevalue("fed_pieces")  # From here on.
    assert_same(play(model, True, **kwargs), whole)
    assert widths[:4] == [16] * 4  # The first turn's 64-token bucket went in four pieces.


def test_a_stacked_cache_keeps_the_tokens_of_per_layer_buffers_sampling(model, fed_pieces):
    """Sampled, a low-rank population, a long opening fed in pieces (each attending to the
    stacked cache the earlier ones wrote in place): the per-layer buffers' tokens and
    log-probabilities within 1e-5."""
    strategy = es.agentic_esopt(population_size=3, sigma=0.05, learning_rate=1e-3,
                                noise="lowrank", rank=2)
    kwargs = dict(population=strategy.ask(strategy.init(jax.random.key(1), model.params)),
                  members=np.array([0, 1, 2, 0, 1, 2], np.int32), temperature=1.0,
                  key=jax.random.key(7), opening=range(3, 43))
    assert_same(play(model.with_cache_layout("stacked"), True, **kwargs),
                play(model, True, **kwargs), atol=1e-5)
    assert fed_pieces == [16] * 14  # Per play: the opening turn in 4 pieces, then 1 a turn.


def test_piece_width_divides_the_chunk_and_bounds_the_scores():
    assert sampling.piece_width(4, 48, 64, 2) == 48  # Within the budget: one piece.
    budget = sampling.MAX_PIECE_SCORES
    width = sampling.piece_width(64, 6144, 6200, 9)
    assert 6144 % width == 0 and 64 * 9 * width * 6200 <= budget < 64 * 9 * 2 * width * 6200
    assert sampling.piece_width(64, 48, 10**9, 9) == 12  # Halved down to <= 16 tokens.
    assert sampling.piece_width(64, 16, 10**9, 9) == 16


def test_trimmed_history_re_prefills_what_changed(model):
    conversation = models.Conversation(models.ConversationCache(), ["a"])
    first = models.generate(model, [[5, 6, 7, 8, 9]], max_new_tokens=3,
                            conversation=conversation)
    # A prompt that drops the middle of the history keeps only the common prefix.
    trimmed = [5, 6, 40, 41] + first.token_ids[0]
    kept = models.generate(model, [trimmed], max_new_tokens=3, conversation=conversation)
    fresh = models.generate(model, [trimmed], max_new_tokens=3)
    assert kept.token_ids == fresh.token_ids


def test_a_prompt_longer_than_the_context_is_a_clear_error(model):
    conversation = models.Conversation(models.ConversationCache(max_context=32), [0])
    with pytest.raises(ValueError, match="exceeds max_context=32"):
        models.generate(model, [list(range(3, 30))], max_new_tokens=8,
                        conversation=conversation)


def test_kept_caches_stay_within_the_maximum_context(model):
    cache = models.ConversationCache(max_context=64)
    prompts = [[3, 4, 5], [6, 7]]
    for _ in range(12):  # Each turn adds up to 3 + 2 tokens; the prompt stays short of 64.
        out = models.generate(model, prompts, max_new_tokens=3,
                              conversation=models.Conversation(cache, [0, 1]))
        prompts = [(p + ids + [9, 10])[-40:] for p, ids in zip(prompts, out.token_ids)]
        # Rows, times the context plus the new-token bucket's rounding (16 - 3).
        assert cache.slot_count() <= 2 * (64 + 13)


def test_conversation_rows_name_each_prompt_once(model):
    with pytest.raises(ValueError, match="rows must name each of the 1 prompts"):
        models.generate(model, [[3, 4]],
                        conversation=models.Conversation(models.ConversationCache(), [1, 2]))
    with pytest.raises(ValueError, match="distinct"):
        models.generate(model, [[3, 4], [5]],
                        conversation=models.Conversation(models.ConversationCache(), [1, 1]))


def test_common_prefix():
    held = np.array([1, 2, 3, 4], np.int32)
    assert kv_cache.common_prefix(held, [1, 2, 9]) == 2
    assert kv_cache.common_prefix(held, [1, 2, 3, 4, 5]) == 4
    assert kv_cache.common_prefix(held, [7]) == 0
    assert kv_cache.common_prefix(held[:0], [7]) == 0


@pytest.mark.parametrize("stacked", [False, True])
def test_relayouts_move_each_row_and_its_slots(stacked):
    rng = np.random.RandomState(0)
    keys, values = rng.normal(size=(2, 5, 3, 4, 7)), rng.normal(size=(2, 5, 3, 7, 4))
    layout = jax.numpy.asarray if stacked else lambda x: tuple(jax.numpy.asarray(x))
    cache = layers.KVCache(layout(keys.astype(np.float32)), layout(values.astype(np.float32)))

    def expected(sources, columns):
        return (np.stack([keys[:, s][..., c] for s, c in zip(sources, columns)], axis=1),
                np.stack([values[:, s][..., c, :] for s, c in zip(sources, columns)], axis=1))

    sources, columns = np.array([4, 0, 0, 2]), rng.randint(0, 7, (4, 6))  # Fewer, longer.
    for got, want in zip(kv_cache._gather(cache, jax.numpy.asarray(sources),
                                          jax.numpy.asarray(columns), None),
                         expected(sources, columns)):
        np.testing.assert_allclose(np.stack(got), want, rtol=1e-6)
    columns = rng.randint(0, 7, (5, 7))  # Same rows, same shape: in place.
    for got, want in zip(kv_cache._compact(cache, jax.numpy.asarray(columns), None),
                         expected(range(5), columns)):
        np.testing.assert_allclose(np.stack(got), want, rtol=1e-6)
