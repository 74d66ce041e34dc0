"""Batched, jitted KV-cache generation and population-aware logits.

Prompts are left-padded into a batch whose size and length are rounded up to a few bucket
shapes (powers of two and 1.5x powers of two), so recompiles are rare. Rotary positions
come from the attention mask and padded slots are masked out, so a row's output does not
depend on the rest of the batch. A prompt chunk whose attention scores would exceed
``MAX_PIECE_SCORES`` (a long system prompt at a large batch) is fed in pieces, each
attending to the cache the earlier ones wrote: memory stays bounded and the outputs are
those of feeding it whole (up to float rounding). Decoding runs in one jitted
``while_loop`` over steps (the cache is donated); with stop strings the loop runs in
chunks between which the host checks the decoded text.

Populations: with a low-rank population, one batched call serves all members (row b uses
member ``members[b]``; the factors are computed once per call, before the decode loop).
With a full-rank population each member's parameters are materialised with
``es.noise.perturb`` and its rows run as one batch, one member after another.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Hashable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from agentic_esopt.es import noise as es_noise
from agentic_esopt.models import architectures, decoder
from agentic_esopt.models.config import ModelConfig
from agentic_esopt.models.kv_cache import (Conversation, ConversationCache, bucket,
                                           constrain_cache, mesh_of, rows_sharding)
from agentic_esopt.models.layers import Deltas
from agentic_esopt.models.loading import Model

PyTree = Any
MIN_PROMPT_BUCKET = 16
MIN_NEW_TOKENS_BUCKET = 16
STOP_CHECK_INTERVAL = 16
# Attention scores (rows x heads x new tokens x slots) one fed piece may hold: longer
# prompts (e.g. a skill in the system prompt, at a batch of 64) are fed in pieces.
MAX_PIECE_SCORES = 2**28


class GenerationOutput(NamedTuple):
    """Generated continuations, in prompt order.

    Attributes:
      texts: decoded continuations (special tokens skipped, cut before a stop string).
      token_ids: generated ids (including a final EOS; up to the token completing a stop
        string).
      finish_reasons: "stop" (EOS or stop string) or "length" (max_new_tokens reached).
      logprobs: float32 log-probability of each generated token under the distribution it
        was sampled from before truncation: ``log_softmax(logits / temperature)`` (the
        temperature is 1 when greedy; top-k, top-p and penalties are not applied), one per
        entry of ``token_ids`` (what a policy gradient's importance ratio needs).
      fed_tokens: per row, the tokens the model processed: the prompt's new tokens (those
        a kept cache did not hold) and every generated token (FLOP estimates).
    """

    texts: list[str]
    token_ids: list[list[int]]
    finish_reasons: list[str]
    logprobs: list[list[float]]
    fed_tokens: list[int]


@dataclasses.dataclass(frozen=True)
class Sampling:
    """How ``generate`` chooses each row's tokens and when the row ends.

    Attributes:
      max_new_tokens: maximum tokens generated per row.
      temperature: 0 for greedy decoding, else the softmax temperature.
      top_k: sample among the k most likely tokens (None: all).
      top_p: sample from the smallest set of tokens with probability mass >= top_p
        (None: all).
      presence_penalty: subtracted once from the logit of every token generated so far.
      frequency_penalty: subtracted from a generated token's logit per occurrence.
      stop: strings that end a row's generation (excluded from its text); one string, a
        sequence or None, kept as a tuple.

    Raises:
      ValueError: out-of-range values.
    """

    max_new_tokens: int = 64
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    stop: tuple[str, ...] = ()

    def __post_init__(self):
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        object.__setattr__(self, "stop", stop)
        penalties = (self.presence_penalty, self.frequency_penalty)
        problems = [
            (self.max_new_tokens < 1, f"max_new_tokens must be >= 1, got {self.max_new_tokens}."),
            (self.temperature < 0, f"temperature must be >= 0, got {self.temperature}."),
            (self.top_k is not None and self.top_k < 1, f"top_k must be >= 1, got {self.top_k}."),
            (self.top_p is not None and not 0 < self.top_p <= 1,
             f"top_p must be in (0, 1], got {self.top_p}."),
            (not all(math.isfinite(p) for p in penalties),
             f"presence and frequency penalties must be finite, got {penalties}."),
            (not all(stop), "Stop strings must be non-empty."),
        ]
        messages = [message for failed, message in problems if failed]
        if messages:
            raise ValueError(" ".join(messages))


@dataclasses.dataclass(frozen=True)
class SamplingMode:
    """Static sampling choices (jit-static); temperature, top_p and penalty values are
    dynamic."""

    greedy: bool
    top_k: int | None
    top_p: bool
    penalized: bool = False


class DecodeState(NamedTuple):
    """Loop state of one batch.

    Attributes:
      cache: the architecture's cache of S slots (``decoder.empty_cache``).
      kv_mask: (B, S) slots holding real tokens.
      logits: (B, V) float32 logits for the next token.
      positions: (B,) rotary position of the next token.
      tokens: (B, N) generated tokens.
      logprobs: (B, N) float32 log-probabilities of the generated tokens (see
        ``GenerationOutput``).
      done: (B,) rows that hit EOS (or a stop string, set by the host).
      step: () tokens generated so far.
      slot: () cache slot of the next generated token.
    """

    cache: Any
    kv_mask: jax.Array
    logits: jax.Array
    positions: jax.Array
    tokens: jax.Array
    logprobs: jax.Array
    done: jax.Array
    step: jax.Array
    slot: jax.Array


def sample_tokens(logits: jax.Array, keys: jax.Array, mode: SamplingMode,
                  temperature: jax.Array, top_p: jax.Array) -> jax.Array:
    """Next tokens (B,) from float32 logits (B, V) with one key per row."""
    if mode.greedy:
        return first_max_index(logits)
    logits = logits / temperature
    if mode.top_k is not None:
        kth_largest = jax.lax.top_k(logits, mode.top_k)[0][:, -1:]
        logits = jnp.where(logits < kth_largest, -jnp.inf, logits)
    if mode.top_p:
        sorted_logits = jnp.sort(logits, axis=-1)[:, ::-1]
        probs = jax.nn.softmax(sorted_logits, axis=-1)
        mass_before = jnp.cumsum(probs, axis=-1) - probs
        cutoff = jnp.min(jnp.where(mass_before < top_p, sorted_logits, jnp.inf), axis=-1,
                         keepdims=True)
        logits = jnp.where(logits < cutoff, -jnp.inf, logits)
    return jax.vmap(jax.random.categorical)(keys, logits).astype(jnp.int32)


def first_max_index(logits: jax.Array) -> jax.Array:
    """``argmax`` over the last axis (the first index on ties), as two plain reductions:
    XLA:CPU's fused value-and-index argmax took ~4x longer on (64, 49152) logits."""
    vocab = logits.shape[-1]
    top = jnp.max(logits, axis=-1, keepdims=True)
    first = jnp.min(jnp.where(logits == top, jnp.arange(vocab, dtype=jnp.int32), vocab), axis=-1)
    return jnp.minimum(first, vocab - 1)  # NaN logits match nothing: still a valid id.


def logprobs_at(logits: jax.Array, tokens: jax.Array, temperature: Any) -> jax.Array:
    """``log_softmax(logits / temperature)`` at ``tokens`` (logits (..., V), tokens (...)),
    as each token's scaled logit minus a logsumexp, so the (..., V) log-probabilities are
    never written."""
    scaled = logits / temperature
    picked = jnp.take_along_axis(scaled, tokens[..., None], axis=-1)[..., 0]
    return picked - jax.nn.logsumexp(scaled, axis=-1)


def penalize(logits: jax.Array, tokens: jax.Array, step: jax.Array,
             penalties: jax.Array) -> jax.Array:
    """Logits (B, V) less presence and frequency penalties for the tokens generated so far.

    ``penalties`` is (presence, frequency): a generated token's logit drops by the presence
    penalty once and by the frequency penalty per occurrence (as in OpenAI's API and vLLM;
    the prompt does not count). ``tokens`` (B, N) holds the generated tokens in its first
    ``step`` columns.
    """
    generated = jnp.arange(tokens.shape[1]) < step
    counts = jax.vmap(lambda row: jnp.zeros(logits.shape[-1], jnp.float32).at[row].add(
        generated.astype(jnp.float32)))(tokens)
    return logits - penalties[0] * (counts > 0) - penalties[1] * counts


def constrain(config: ModelConfig, state: DecodeState, mesh: Mesh | None) -> DecodeState:
    """The loop state's shardings on a mesh: rows over ``data``, the cache's heads over
    ``model`` (``kv_cache.cache_shardings``); counters replicated."""
    if mesh is None:
        return state
    rows = {name: jax.lax.with_sharding_constraint(x, rows_sharding(mesh, x.ndim))
            for name, x in state._asdict().items() if name not in ("cache", "step", "slot")}
    cache = constrain_cache(state.cache, mesh,
                            architectures.get(config).cache_rows_axis(state.cache))
    return state._replace(cache=cache, **rows)


def _feed(config: ModelConfig, params: PyTree, deltas: Deltas, cache: Any,
          tokens: jax.Array, token_mask: jax.Array, positions: jax.Array, kv_mask: jax.Array,
          start: jax.Array, new_tokens: int, mesh: Mesh | None = None) -> DecodeState:
    """Feeds a left-padded chunk (B, T) (real where ``token_mask``) into the cache from slot
    ``start``: the state that decodes up to ``new_tokens`` tokens after it (sharded as
    ``constrain`` says on a ``mesh``)."""
    batch, width = tokens.shape
    h, cache = decoder.forward(config, params, deltas, tokens, positions, kv_mask, cache, start,
                               token_mask=token_mask)
    state = DecodeState(cache=cache, kv_mask=kv_mask,
                        logits=decoder.lm_head(config, params, deltas, h[:, -1]),
                        positions=positions[:, -1] + 1,
                        tokens=jnp.zeros((batch, new_tokens), jnp.int32),
                        logprobs=jnp.zeros((batch, new_tokens), jnp.float32),
                        done=jnp.zeros((batch,), bool), step=jnp.int32(0),
                        slot=start + width)
    return constrain(config, state, mesh)


_extend = jax.jit(_feed, static_argnames=("config", "new_tokens", "mesh"),
                  donate_argnames=("cache",))


@functools.partial(jax.jit, static_argnames=("config", "new_tokens"))
def _prefill(config: ModelConfig, params: PyTree, deltas: Deltas, tokens: jax.Array,
             mask: jax.Array, new_tokens: int) -> DecodeState:
    """Runs left-padded prompts (B, P) into a fresh cache of P + ``new_tokens`` slots."""
    batch, prompt_len = tokens.shape
    cache = decoder.empty_cache(config, batch, prompt_len + new_tokens,
                                params["embed"]["embedding"].dtype)
    kv_mask = jnp.pad(mask.astype(bool), ((0, 0), (0, new_tokens)))
    return _feed(config, params, deltas, cache, tokens, mask.astype(bool),
                 decoder.positions_from_mask(mask), kv_mask, jnp.int32(0), new_tokens)


@functools.partial(jax.jit, static_argnames=("config", "mode", "mesh"),
                   donate_argnames=("state",))
def _decode(config: ModelConfig, mode: SamplingMode, params: PyTree, deltas: Deltas,
            state: DecodeState, row_keys: jax.Array, eos_ids: jax.Array,
            temperature: jax.Array, top_p: jax.Array, penalties: jax.Array,
            end_step: jax.Array, mesh: Mesh | None = None) -> DecodeState:
    """Samples and feeds tokens until ``end_step`` tokens exist or every row is done."""

    def unfinished(s: DecodeState) -> jax.Array:
        return (s.step < end_step) & ~jnp.all(s.done)

    def step(s: DecodeState) -> DecodeState:
        keys = jax.vmap(jax.random.fold_in, in_axes=(0, None))(row_keys, s.step)
        logits = penalize(s.logits, s.tokens, s.step, penalties) if mode.penalized else s.logits
        token = sample_tokens(logits, keys, mode, temperature, top_p)
        logprob = logprobs_at(s.logits, token, temperature)
        kv_mask = s.kv_mask.at[:, s.slot].set(True)
        h, cache = decoder.forward(config, params, deltas, token[:, None], s.positions[:, None],
                                   kv_mask, s.cache, s.slot)
        return constrain(config, DecodeState(
            cache=cache, kv_mask=kv_mask, logits=decoder.lm_head(config, params, deltas, h[:, 0]),
            positions=s.positions + 1, tokens=s.tokens.at[:, s.step].set(token),
            logprobs=s.logprobs.at[:, s.step].set(logprob),
            done=s.done | jnp.isin(token, eos_ids), step=s.step + 1, slot=s.slot + 1), mesh)

    return jax.lax.while_loop(unfinished, step, state)


@functools.partial(jax.jit, static_argnames=("mesh",))
def _population_deltas(params: PyTree, population: es_noise.Population,
                       members: jax.Array, mesh: Mesh | None = None) -> Deltas:
    """Deltas of rows running ``members`` (B,); on a mesh the member-level factors are
    replicated and ``members`` is sharded like the rows."""
    deltas = decoder.population_deltas(es_noise.population_factors(population, params),
                                       members)
    if mesh is None:
        return deltas
    replicated = NamedSharding(mesh, P())
    return Deltas(
        jax.tree.map(lambda x: jax.lax.with_sharding_constraint(x, replicated), deltas.factors),
        jax.lax.with_sharding_constraint(members, rows_sharding(mesh, 1)))


_sequence_logits = jax.jit(decoder.logits, static_argnames=("config",))


def logits(config: ModelConfig, params: PyTree, input_ids: Any, attention_mask: Any = None,
           population: es_noise.Population | None = None, members: Any = None) -> jax.Array:
    """float32 next-token logits (B, T, V) of a left-padded batch.

    Args:
      config: model config.
      params: parameters.
      input_ids: (B, T) token ids.
      attention_mask: (B, T), 1 for real tokens (default all ones).
      population: optional ``es.Population``; row b is evaluated as member ``members[b]``.
      members: (B,) member index per row (required with ``population``).
    """
    input_ids = jnp.asarray(input_ids, jnp.int32)
    if input_ids.ndim != 2:
        raise ValueError(f"input_ids must be (B, T), got shape {input_ids.shape}.")
    mask = (jnp.ones_like(input_ids) if attention_mask is None
            else jnp.asarray(attention_mask, jnp.int32))
    if mask.shape != input_ids.shape:
        raise ValueError(f"attention_mask shape {mask.shape} != input_ids shape "
                         f"{input_ids.shape}.")
    run_by = _check_members(population, members, input_ids.shape[0])
    if run_by is None:
        return _sequence_logits(config, params, decoder.no_deltas(params), input_ids, mask)
    if run_by.population.noise == "lowrank":
        deltas = _population_deltas(params, run_by.population, jnp.asarray(run_by.members))
        return _sequence_logits(config, params, deltas, input_ids, mask)

    def member_logits(member_params, rows, _):
        rows = np.asarray(rows)
        return _sequence_logits(config, member_params, decoder.no_deltas(params),
                                input_ids[rows], mask[rows])

    return jnp.stack(_run_each_member(params, run_by, member_logits))


def generate(model: Model, prompts: Sequence[str] | Sequence[Sequence[int]],
             sampling: Sampling | None = None, *, key: jax.Array | int | None = None,
             population: es_noise.Population | None = None, members: Any = None,
             streams: Any = None, conversation: Conversation | None = None,
             **sampling_fields: Any) -> GenerationOutput:
    """Generates continuations for a batch of prompts.

    Args:
      model: a loaded ``Model`` (its tokenizer decodes the outputs).
      prompts: strings (already chat-templated; tokenised without special tokens) or
        lists of token ids.
      sampling: how tokens are chosen and when a row ends (default ``Sampling()``).
      key: PRNG key (or int seed) for sampling; row r uses ``fold_in(key, streams[r])``,
        step t then ``fold_in(row key, t)``.
      population: optional ``es.Population``: row b is generated by member ``members[b]``.
      members: (B,) member index per row (required with ``population``).
      streams: (B,) sampling stream per row (default: the row index). Rows with the same
        stream draw the same random numbers, e.g. ES members playing the same task
        (common random numbers).
      conversation: rows of a ``ConversationCache`` kept across calls: each row keeps the
        keys and values of what it was fed, and a prompt that extends them feeds only its
        new tokens (the outputs are those of a fresh call). Default: a fresh cache for
        this call.
      **sampling_fields: ``Sampling``'s fields as keywords instead of ``sampling``
        (``max_new_tokens=64, temperature=0.0``, ...).

    Returns:
      A ``GenerationOutput`` in prompt order.
    """
    if sampling is not None and sampling_fields:
        raise TypeError(f"generate got sampling and its fields {sorted(sampling_fields)}.")
    sampling = Sampling(**sampling_fields) if sampling is None else sampling
    tokenizer = model.tokenizer
    if tokenizer is None:
        raise ValueError("generate needs a model with a tokenizer to decode its outputs.")
    token_lists = _tokenize(tokenizer, prompts, model.config.vocab_size)
    if not token_lists:
        return GenerationOutput([], [], [], [], [])
    settings = _Settings.build(model.config, tokenizer, sampling, key)
    run_by = _check_members(population, members, len(token_lists))
    if conversation is None:
        conversation = Conversation(ConversationCache(), range(len(token_lists)))
    batch = _Batch(token_lists, _check_streams(streams, len(token_lists)),
                   _check_rows(conversation.rows, len(token_lists)))
    cache = conversation.cache
    cache.check_fits(token_lists, sampling.max_new_tokens)
    if run_by is not None and run_by.population.noise == "full":
        results = _run_each_member(
            model.params, run_by, lambda member_params, rows, member: _generate_batch(
                model.config, member_params, batch.take(rows), settings, cache, member))
    else:
        results = _generate_batch(model.config, model.params, batch, settings, cache, None,
                                  run_by)
    texts, token_ids, reasons = zip(*(_finish(ids, settings) for ids, _, _ in results))
    logprobs = [row_logprobs[:len(ids)] for (_, row_logprobs, _), ids in zip(results, token_ids)]
    return GenerationOutput(list(texts), list(token_ids), list(reasons), logprobs,
                            [fed for _, _, fed in results])


class _Batch(NamedTuple):
    """A call's prompts, in order: their token ids, sampling streams and cache rows."""

    token_lists: list[list[int]]
    streams: list[int]
    rows: list[Hashable]

    def take(self, indices: Sequence[int]) -> _Batch:
        """The prompts at ``indices``."""
        return _Batch(*([field[i] for i in indices] for field in self))


class _Members(NamedTuple):
    """The population member ``members[b]`` (B,) that runs each row b."""

    population: es_noise.Population
    members: np.ndarray


@dataclasses.dataclass(frozen=True)
class _Settings:
    """A call's ``Sampling``, resolved against the model and its tokenizer."""

    mode: SamplingMode
    max_new_tokens: int
    temperature: float
    top_p: float
    penalties: tuple[float, float]
    key: jax.Array
    eos_ids: tuple[int, ...]
    stop: tuple[str, ...]
    pad_id: int
    decode: Callable[[list[int]], str]

    @classmethod
    def build(cls, config: ModelConfig, tokenizer: Any, sampling: Sampling,
              key: jax.Array | int | None) -> _Settings:
        s = sampling
        greedy = s.temperature == 0
        if not greedy and key is None:
            raise ValueError("Sampling with temperature > 0 needs a key.")
        eos_ids = set(config.eos_token_ids)
        if tokenizer.eos_token_id is not None:
            eos_ids.add(tokenizer.eos_token_id)
        penalties = (float(s.presence_penalty), float(s.frequency_penalty))
        mode = SamplingMode(
            greedy=greedy,
            top_k=None if greedy or s.top_k is None else min(s.top_k, config.vocab_size),
            top_p=not greedy and s.top_p is not None and s.top_p < 1,
            penalized=any(p != 0 for p in penalties))
        return cls(mode=mode, max_new_tokens=int(s.max_new_tokens),
                   temperature=float(s.temperature) if not greedy else 1.0,
                   top_p=float(s.top_p or 1.0), penalties=penalties, key=_typed_key(key),
                   eos_ids=tuple(sorted(eos_ids)), stop=s.stop,
                   pad_id=pad_id(config, tokenizer),
                   decode=functools.partial(tokenizer.decode, skip_special_tokens=True))


def pad_id(config: ModelConfig, tokenizer: Any) -> int:
    """The id that fills padded slots (any id would do: they are masked)."""
    return next(i for i in (tokenizer.pad_token_id, config.pad_token_id,
                            tokenizer.eos_token_id, 0) if i is not None)


def _typed_key(key: jax.Array | int | None) -> jax.Array:
    if key is None:
        return jax.random.key(0)
    if isinstance(key, int):
        return jax.random.key(key)
    if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        return key
    return jax.random.wrap_key_data(jnp.asarray(key, jnp.uint32))


def _tokenize(tokenizer: Any, prompts: Sequence[Any], vocab_size: int) -> list[list[int]]:
    if isinstance(prompts, str):
        raise ValueError("prompts must be a list of strings or token-id lists, not one string.")
    prompts = list(prompts)
    if prompts and all(isinstance(p, str) for p in prompts):
        token_lists = tokenizer(prompts, add_special_tokens=False)["input_ids"]
    elif all(not isinstance(p, str) for p in prompts):
        token_lists = [[int(t) for t in p] for p in prompts]
    else:
        raise ValueError("prompts must be all strings or all token-id lists.")
    for i, ids in enumerate(token_lists):
        if not ids:
            raise ValueError(f"Prompt {i} is empty.")
        if min(ids) < 0 or max(ids) >= vocab_size:
            raise ValueError(f"Prompt {i} has token ids outside [0, {vocab_size}).")
    return token_lists


def _check_members(population: es_noise.Population | None, members: Any,
                   batch: int) -> _Members | None:
    if population is None:
        if members is not None:
            raise ValueError("members were given without a population.")
        return None
    if members is None:
        raise ValueError("A population needs members: one member index per batch row.")
    members = np.asarray(members)
    if members.shape != (batch,) or not np.issubdtype(members.dtype, np.integer):
        raise ValueError(f"members must be ({batch},) ints, got {members.dtype} "
                         f"{members.shape}.")
    if batch and (members.min() < 0 or members.max() >= population.size):
        raise ValueError(f"members must lie in [0, {population.size}).")
    return _Members(population, members.astype(np.int32))


def _check_streams(streams: Any, batch: int) -> list[int]:
    if streams is None:
        return list(range(batch))
    streams = np.asarray(streams)
    if streams.shape != (batch,) or not np.issubdtype(streams.dtype, np.integer):
        raise ValueError(f"streams must be {batch} integers (one per prompt), got shape "
                         f"{streams.shape} and dtype {streams.dtype}")
    if streams.size and (streams.min() < 0 or streams.max() > np.iinfo(np.int32).max):
        raise ValueError("streams must be in [0, 2**31)")
    return streams.tolist()


def _check_rows(rows: Sequence[Hashable], batch: int) -> list[Hashable]:
    rows = list(rows)
    if len(rows) != batch:
        raise ValueError(f"rows must name each of the {batch} prompts, got {len(rows)}.")
    return rows


def _run_each_member(params: PyTree, run_by: _Members,
                     run: Callable[[PyTree, list[int], int], Sequence[Any]]) -> list[Any]:
    """Full-rank populations: ``run(member params, rows, member)`` per distinct member, one
    at a time.

    Returns the per-row results in row order.
    """
    groups: dict[int, list[int]] = {}
    for row, member in enumerate(run_by.members.tolist()):
        groups.setdefault(member, []).append(row)
    results = {}
    for member, rows in groups.items():
        results.update(zip(rows, run(es_noise.perturb(params, run_by.population, member), rows,
                                     member)))
    return [results[row] for row in range(len(run_by.members))]


def _generate_batch(config: ModelConfig, params: PyTree, batch: _Batch, settings: _Settings,
                    cache: ConversationCache, part: Any, run_by: _Members | None = None
                    ) -> list[tuple[list[int], list[float], int]]:
    """(generated ids (cut after EOS), their log-probabilities, tokens fed) per row: the
    prompts' new tokens are fed into ``cache``'s rows, then decoded in one batch (row b by
    member ``run_by.members[b]``, if given)."""
    new_tokens = bucket(settings.max_new_tokens, MIN_NEW_TOKENS_BUCKET)
    mesh = mesh_of(params)
    chunk, kv = cache.prepare(config, params["embed"]["embedding"].dtype, part, batch.rows,
                              batch.token_lists, MIN_PROMPT_BUCKET, new_tokens, settings.pad_id,
                              mesh)
    padded_batch = chunk.tokens.shape[0]
    called = np.zeros(padded_batch, bool)
    called[chunk.batch] = True
    padded_members = np.zeros(padded_batch, np.int32)
    padded_streams = np.zeros(padded_batch, np.int32)
    padded_streams[chunk.batch] = batch.streams

    def put(x):  # Host rows onto the devices (split over the mesh's data axis).
        return jnp.asarray(x) if mesh is None else jax.device_put(x, rows_sharding(mesh, x.ndim))

    if run_by is None:
        deltas = decoder.no_deltas(params)
    else:
        padded_members[chunk.batch] = run_by.members
        deltas = _population_deltas(params, run_by.population, put(padded_members), mesh)
    row_keys = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(settings.key,
                                                               put(padded_streams))
    kv_mask = put(chunk.kv_mask)
    width = piece_width(*chunk.tokens.shape, kv_mask.shape[1], config.num_heads)
    for start in range(0, chunk.tokens.shape[1], width):
        piece = slice(start, start + width)
        state = _extend(config, params, deltas, kv, put(chunk.tokens[:, piece]),
                        put(chunk.tokens_mask[:, piece]), put(chunk.positions[:, piece]),
                        kv_mask, jnp.int32(chunk.start + start), new_tokens=new_tokens,
                        mesh=mesh)
        kv = state.cache
    state = state._replace(done=put(~called))  # Rows not called never wait.
    interval = STOP_CHECK_INTERVAL if settings.stop else settings.max_new_tokens
    eos_ids = jnp.asarray(settings.eos_ids or (-1,), jnp.int32)
    steps = 0
    while steps < settings.max_new_tokens:
        end = min(steps + interval, settings.max_new_tokens)
        state = _decode(config, settings.mode, params, deltas, state, row_keys, eos_ids,
                        jnp.float32(settings.temperature), jnp.float32(settings.top_p),
                        jnp.asarray(settings.penalties, jnp.float32), jnp.int32(end), mesh=mesh)
        steps = int(state.step)
        done = np.array(state.done)
        if settings.stop and not done.all():
            generated = np.asarray(state.tokens[:, :steps])
            for row in np.flatnonzero(~done):
                text = settings.decode(generated[row].tolist())
                done[row] = _stop_index(text, settings.stop) is not None
            state = state._replace(done=put(done))
        if done.all():
            break
    generated = np.asarray(state.tokens[chunk.batch, :steps])
    logprobs = np.asarray(state.logprobs[chunk.batch, :steps])
    cache.record(part, chunk, state.cache, generated)
    cut = [_cut_after_eos(ids.tolist(), settings.eos_ids) for ids in generated]
    prompt_fed = np.asarray(chunk.tokens_mask[chunk.batch]).sum(axis=1)
    return [(ids, row_logprobs[:len(ids)].tolist(), int(fed) + len(ids))
            for ids, row_logprobs, fed in zip(cut, logprobs, prompt_fed)]


def piece_width(batch: int, width: int, slots: int, heads: int) -> int:
    """Width of the pieces a chunk of ``width`` new tokens is fed in: the widest that
    divides it by halving and keeps the attention scores within ``MAX_PIECE_SCORES``
    (a piece attends to the cache the earlier pieces wrote, so the result is the same)."""
    while width % 2 == 0 and width > MIN_PROMPT_BUCKET and (
            batch * heads * width * slots > MAX_PIECE_SCORES):
        width //= 2
    return width


def _cut_after_eos(ids: list[int], eos_ids: tuple[int, ...]) -> list[int]:
    for i, token in enumerate(ids):
        if token in eos_ids:
            return ids[:i + 1]
    return ids


def _stop_index(text: str, stop: tuple[str, ...]) -> int | None:
    """Earliest position of any stop string in text, or None."""
    positions = [i for i in (text.find(s) for s in stop) if i >= 0]
    return min(positions) if positions else None


def _finish(ids: list[int], settings: _Settings) -> tuple[str, list[int], str]:
    """(text, token ids, finish reason) of one row, applying stop strings."""
    text = settings.decode(ids)
    cut = _stop_index(text, settings.stop)
    if cut is None:
        hit_eos = bool(ids) and ids[-1] in settings.eos_ids
        return text, ids, "stop" if hit_eos else "length"
    shortest, longest = 1, len(ids)  # Shortest prefix whose text holds a stop string.
    while shortest < longest:
        middle = (shortest + longest) // 2
        if _stop_index(settings.decode(ids[:middle]), settings.stop) is None:
            shortest = middle + 1
        else:
            longest = middle
    return text[:cut], ids[:shortest], "stop"
