"""Generation: parity with transformers' greedy decoding, batching, sampling, stopping."""

import dataclasses

import jax
import numpy as np
import pytest
import torch

from agentic_esopt import models
from agentic_esopt.models import sampling

PROMPTS = ["hello there", "x", "a much longer prompt!"]


@pytest.fixture(scope="module")
def reference(hf_checkpoint):
    torch_model, path = hf_checkpoint("llama", seed=1)
    return torch_model, models.load(path)


@pytest.fixture(scope="module")
def greedy(reference):
    return models.generate(reference[1], PROMPTS, max_new_tokens=12)


def torch_greedy(torch_model, tokenizer, prompts, max_new_tokens, eos_token_id):
    batch = tokenizer(prompts, add_special_tokens=False, padding=True, padding_side="left",
                      return_tensors="pt")
    with torch.no_grad():
        out = torch_model.generate(**batch, max_new_tokens=max_new_tokens, do_sample=False,
                                   eos_token_id=eos_token_id, pad_token_id=0)
    rows = out[:, batch["input_ids"].shape[1]:].tolist()
    return [row[:row.index(eos_token_id) + 1] if eos_token_id in row else row for row in rows]


def test_greedy_matches_transformers(reference, greedy):
    torch_model, model = reference
    expected = torch_greedy(torch_model, model.tokenizer, PROMPTS, 12, eos_token_id=2)
    assert greedy.token_ids == expected
    assert greedy.finish_reasons == ["length"] * 3
    assert greedy.texts == [model.tokenizer.decode(ids) for ids in expected]


def test_greedy_in_the_stacked_cache_layout_matches_transformers(reference, greedy):
    torch_model, model = reference
    stacked = models.generate(model.with_cache_layout("stacked"), PROMPTS, max_new_tokens=12)
    assert stacked.token_ids == torch_greedy(torch_model, model.tokenizer, PROMPTS, 12,
                                             eos_token_id=2)
    np.testing.assert_allclose(np.concatenate(stacked.logprobs),
                               np.concatenate(greedy.logprobs), atol=1e-5, rtol=0)


def test_eos_ends_rows_like_transformers(reference, greedy):
    torch_model, model = reference
    eos = greedy.token_ids[0][4]
    model = dataclasses.replace(model, config=dataclasses.replace(model.config,
                                                                  eos_token_ids=(eos,)))
    out = models.generate(model, PROMPTS, max_new_tokens=12)
    expected = torch_greedy(torch_model, model.tokenizer, PROMPTS, 12, eos_token_id=eos)
    assert out.token_ids == expected
    assert out.token_ids[0] == greedy.token_ids[0][:5] and out.finish_reasons[0] == "stop"
    for ids, reason in zip(out.token_ids, out.finish_reasons):
        assert reason == ("stop" if eos in ids else "length")


def test_decoding_stops_once_every_real_row_is_done(reference, monkeypatch):
    model = reference[1]
    every_token = tuple(range(model.config.vocab_size))
    model = dataclasses.replace(model, config=dataclasses.replace(model.config,
                                                                  eos_token_ids=every_token))
    calls = []
    decode = sampling._decode

    def recording_decode(config, mode, params, deltas, state, *args, **kwargs):
        done_before = np.asarray(state.done).tolist()
        state = decode(config, mode, params, deltas, state, *args, **kwargs)
        calls.append((done_before, int(state.step)))
        return state

    monkeypatch.setattr(sampling, "_decode", recording_decode)
    out = models.generate(model, PROMPTS + ["four", "five"], max_new_tokens=12)  # 5 rows -> 6.
    assert [len(ids) for ids in out.token_ids] == [1] * 5
    assert out.finish_reasons == ["stop"] * 5
    # One loop call that exits after a step; the filler row never holds the loop up.
    assert calls == [([False] * 5 + [True], 1)]


def test_rows_do_not_depend_on_the_batch(reference, greedy):
    model = reference[1]
    for prompt, expected in zip(PROMPTS, greedy.token_ids):
        assert models.generate(model, [prompt], max_new_tokens=12).token_ids == [expected]
    long_prompt = "a prompt long enough for a bigger length bucket"
    mixed = models.generate(model, [long_prompt, PROMPTS[0]], max_new_tokens=12)
    assert mixed.token_ids[1] == greedy.token_ids[0]


def test_token_id_prompts_equal_string_prompts(reference, greedy):
    model = reference[1]
    ids = [model.tokenizer(p, add_special_tokens=False)["input_ids"] for p in PROMPTS]
    assert models.generate(model, ids, max_new_tokens=12).token_ids == greedy.token_ids


def test_sampling_is_reproducible_per_key(reference, greedy):
    model = reference[1]

    def sample(key, **kwargs):
        return models.generate(model, PROMPTS, max_new_tokens=12, temperature=1.0, key=key,
                               **kwargs).token_ids

    first = sample(jax.random.key(0))
    assert first == sample(jax.random.key(0))
    assert first != sample(jax.random.key(1))
    assert first != greedy.token_ids
    assert sample(jax.random.key(3), top_k=1) == greedy.token_ids
    assert sample(jax.random.key(4), top_p=1e-6) == greedy.token_ids


def test_rows_sharing_a_stream_draw_the_same_sample(reference):
    model = reference[1]
    prompts = [PROMPTS[0]] * 4

    def sample(streams):
        return models.generate(model, prompts, max_new_tokens=12, temperature=1.0,
                               key=jax.random.key(5), streams=streams).token_ids

    independent = sample(None)
    assert len({tuple(ids) for ids in independent}) > 1
    shared = sample([7, 7, 2, 7])
    assert shared[0] == shared[1] == shared[3] != shared[2]
    assert sample([0, 1, 2, 3]) == independent  # The default stream is the row index.


def test_top_k_and_top_p_restrict_the_support():
    logits = np.log(np.array([[0.5, 0.3, 0.15, 0.05]] * 2000, np.float32))
    keys = jax.random.split(jax.random.key(0), 2000)

    def draw(top_k, top_p):
        mode = sampling.SamplingMode(greedy=False, top_k=top_k, top_p=top_p is not None)
        return set(np.asarray(sampling.sample_tokens(logits, keys, mode, np.float32(1.0),
                                                     np.float32(top_p or 1.0))).tolist())

    assert draw(None, None) == {0, 1, 2, 3}
    assert draw(2, None) == {0, 1}
    assert draw(None, 0.7) == {0, 1}
    assert draw(None, 0.85) == {0, 1, 2}


def test_stop_strings_and_max_new_tokens(reference, greedy):
    model = reference[1]
    text, ids = greedy.texts[0], greedy.token_ids[0]
    stop = text[5:7]
    out = models.generate(model, PROMPTS, max_new_tokens=12, stop=[stop, "never-seen"])
    cut = text.find(stop)
    assert out.texts[0] == text[:cut] and out.finish_reasons[0] == "stop"
    kept = out.token_ids[0]
    assert kept == ids[:len(kept)]
    assert stop in model.tokenizer.decode(kept) and stop not in model.tokenizer.decode(kept[:-1])
    for row in (1, 2):
        if stop not in greedy.texts[row]:
            assert out.token_ids[row] == greedy.token_ids[row]
            assert out.finish_reasons[row] == "length"
    short = models.generate(model, PROMPTS, max_new_tokens=5)
    assert short.token_ids == [row[:5] for row in greedy.token_ids]
    assert short.finish_reasons == ["length"] * 3


def test_stop_strings_end_generation_between_chunks(reference):
    model = reference[1]
    long = models.generate(model, PROMPTS[:1], max_new_tokens=40)
    text = long.texts[0]
    stop = text[20:22]
    out = models.generate(model, PROMPTS[:1], max_new_tokens=40, stop=stop)
    assert out.texts[0] == text[:text.find(stop)]
    assert len(out.token_ids[0]) < 40 and out.finish_reasons == ["stop"]


def test_a_sampling_record_is_its_keywords(reference, greedy):
    model = reference[1]
    record = models.Sampling(max_new_tokens=12, stop="never-seen")
    assert record.stop == ("never-seen",)
    assert models.generate(model, PROMPTS, record).token_ids == greedy.token_ids
    with pytest.raises(TypeError, match="sampling and its fields"):
        models.generate(model, PROMPTS, record, max_new_tokens=12)


@pytest.mark.parametrize("kwargs, message", [
    (dict(prompts="one string"), "list of strings"),
    (dict(prompts=[""]), "empty"),
    (dict(prompts=[[1, 999]]), "outside"),
    (dict(temperature=0.5), "needs a key"),
    (dict(top_p=1.5, temperature=1.0, key=0), "top_p"),
    (dict(max_new_tokens=0), "max_new_tokens"),
    (dict(members=[0]), "without a population"),
    (dict(stop=[""]), "non-empty"),
    (dict(streams=[0, 1]), "streams must be 1 integers"),
    (dict(streams=[-1]), "streams must be in"),
    (dict(presence_penalty=float("nan")), "penalties must be finite"),
])
def test_bad_arguments_raise(kwargs, message):
    model = models.load("tiny")
    kwargs = {"prompts": ["hi"], **kwargs}
    with pytest.raises(ValueError, match=message):
        models.generate(model, **kwargs)


@pytest.mark.parametrize("presence, frequency", [(3.0, 0.0), (0.0, 1.5), (1.0, 0.5)])
def test_penalties_equal_a_step_by_step_reference(presence, frequency):
    model = models.load("tiny")
    prompt = [5, 9, 2, 7]
    out = models.generate(model, [prompt], max_new_tokens=10, presence_penalty=presence,
                          frequency_penalty=frequency)
    tokens, counts = list(prompt), np.zeros(model.config.vocab_size)
    for _ in range(10):
        logits = np.asarray(models.logits(model.config, model.params,
                                          np.asarray([tokens])))[0, -1]
        token = int(np.argmax(logits - presence * (counts > 0) - frequency * counts))
        tokens.append(token)
        counts[token] += 1
    assert out.token_ids[0] == tokens[len(prompt):]
    plain = models.generate(model, [prompt], max_new_tokens=10).token_ids[0]
    assert len(set(plain)) < len(plain), "the tiny model repeats itself without penalties"
    if presence == 3.0:
        assert len(set(out.token_ids[0])) == len(out.token_ids[0])


def test_bucket_sizes():
    assert [sampling.bucket(n) for n in (1, 2, 3, 5, 7, 9, 13, 17, 25, 33, 49)] == [
        1, 2, 3, 6, 8, 12, 16, 24, 32, 48, 64]
    assert sampling.bucket(3, minimum=16) == 16


def test_first_max_index_is_argmax_with_ties_to_the_first():
    logits = np.random.RandomState(0).randint(0, 4, (64, 300)).astype(np.float32)  # Many ties.
    logits[1, :] = -np.inf
    np.testing.assert_array_equal(sampling.first_max_index(jax.numpy.asarray(logits)),
                                  np.argmax(logits, axis=-1))
    logits[2, 5] = np.nan
    assert 0 <= int(sampling.first_max_index(jax.numpy.asarray(logits))[2]) < 300


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_at_are_log_softmax_at_the_tokens(temperature):
    rng = np.random.RandomState(0)
    logits = rng.normal(0, 5, (3, 4, 300)).astype(np.float32)
    tokens = rng.randint(0, 300, (3, 4))
    expected = np.take_along_axis(
        jax.nn.log_softmax(logits / temperature), tokens[..., None], axis=-1)[..., 0]
    np.testing.assert_allclose(
        sampling.logprobs_at(jax.numpy.asarray(logits), jax.numpy.asarray(tokens),
                             temperature), expected, rtol=1e-6, atol=1e-5)
