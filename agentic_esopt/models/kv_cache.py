"""KV caches kept across ``generate`` calls, so a new turn feeds only its new tokens.

A ``ConversationCache`` keeps, for each row (e.g. a (member, task) episode of a rollout),
the keys and values of every token the row has been fed. When the row comes back with a
longer prompt, the longest common prefix of what it holds and the new prompt is kept and
only the rest is fed: exactly the tokens re-prefilling would compute (the next turn's
prompt normally extends the last one by the reply and the new observation). A prompt that
does not extend the cached one (history trimming, a new episode) keeps what still matches,
down to nothing.

Layout: one device cache (``layers.KVCache``, S slots) per batch of rows. Every call
writes its new tokens (a left-padded chunk, then the decoded tokens) at the same columns of
every row, from the first column not written yet, so a row's tokens may have gaps: the
host-side ``slots`` (B, S) array records which token sits in each slot (-1: none), and is
the attention mask. When the columns run out, a row set changes or the batch's size
bucket shrinks (finished episodes), the cache is *relaid*: the kept tokens of the called
rows move into a cache sized for the call, each row's kept prefix right before the slots
of its new tokens (in place when the rows and the cache's shape stay the same). Models
whose caches cannot be cut back to a prefix (``Architecture.prefix_cache`` false: Qwen3.5's
recurrent states) re-prefill every call.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Hashable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from agentic_esopt.models import architectures, decoder
from agentic_esopt.models.config import ModelConfig
from agentic_esopt.models.layers import KVCache, rows_axis, slot_axes
from agentic_esopt.sharding import DATA, MODEL

EMPTY = -1


def bucket(n: int, minimum: int = 1) -> int:
    """Smallest power of two or 1.5x power of two that is >= max(n, minimum) (the shapes
    jitted calls see, so recompiles are rare)."""
    n = max(n, minimum)
    power = 1
    while power < n:
        if power >= 2 and power * 3 // 2 >= n:
            return power * 3 // 2
        power *= 2
    return power


def mesh_of(params: Any) -> Mesh | None:
    """The (data, model) mesh ``params`` are placed on (``sharding.Layout``), or None."""
    placement = getattr(jax.tree.leaves(params)[0], "sharding", None)
    if isinstance(placement, NamedSharding) and DATA in placement.mesh.axis_names:
        return placement.mesh
    return None


def rows_sharding(mesh: Mesh, ndim: int) -> NamedSharding:
    """Batch rows (axis 0) split over the mesh's ``data`` axis."""
    return NamedSharding(mesh, P(DATA, *(None,) * (ndim - 1)))


def cache_shardings(mesh: Mesh, cache: Any, rows_axis: int) -> Any:
    """Shardings of a cache's leaves: rows (``rows_axis``: ``Architecture.cache_rows_axis``)
    over ``data``; the heads of keys, values and recurrent states (the axis after the rows
    in leaves of ``rows_axis + 4`` dims) over ``model`` where the axis divides them (else
    replicated over it)."""

    def spec(leaf):
        heads = leaf.ndim == rows_axis + 4 and leaf.shape[rows_axis + 1] % mesh.shape[MODEL] == 0
        return NamedSharding(mesh, P(*(None,) * rows_axis, DATA, *((MODEL,) if heads else ()),
                                     *(None,) * (leaf.ndim - rows_axis - 1 - heads)))

    return jax.tree.map(spec, cache)


def common_prefix(held: np.ndarray, ids: Sequence[int]) -> int:
    """Length of the longest common prefix of two token sequences."""
    n = min(len(held), len(ids))
    differs = np.flatnonzero(np.asarray(held[:n]) != np.asarray(ids[:n], dtype=held.dtype))
    return int(differs[0]) if differs.size else n


@dataclasses.dataclass
class Chunk:
    """What one call feeds: the new tokens of every batch row, left-padded.

    Attributes:
      batch: cache row of each prompt of the call.
      tokens: (B, T) new token ids, left-padded.
      tokens_mask: (B, T) the real ones.
      positions: (B, T) their rotary positions (tokens held before them + their offset).
      kv_mask: (B, S) slots holding real tokens, the new ones included.
      start: column of the chunk's first slot.
    """

    batch: np.ndarray
    tokens: np.ndarray
    tokens_mask: np.ndarray
    positions: np.ndarray
    kv_mask: np.ndarray
    start: int


@dataclasses.dataclass
class _Rows:
    """One device cache and its bookkeeping (see the module docstring)."""

    keys: list[Hashable]
    slots: np.ndarray  # (B, S) token id in each slot, EMPTY where none.
    end: int  # First column no call has written since the last relayout.
    kv: Any  # The architecture's cache (``decoder.empty_cache``).
    mesh: Mesh | None  # Where ``kv`` is sharded (``cache_shardings``), if anywhere.

    def held(self, row: int) -> np.ndarray:
        return self.slots[row][self.slots[row] != EMPTY]


class ConversationCache:
    """KV caches of a set of rows, kept between ``models.generate`` calls.

    Pass the same instance and a stable key per row
    (``generate(..., conversation=Conversation(c, keys))``) to every turn of a batch of
    episodes. Memory is bounded by ``max_context``: a prompt plus its new tokens longer
    than that fails with a clear error before any compute, and a row never holds more
    than ``max_context`` slots plus the new-token bucket's rounding
    (< 16 + max_new_tokens / 2). Full-rank populations keep one cache per member.
    """

    def __init__(self, max_context: int | None = None):
        if max_context is not None and max_context < 1:
            raise ValueError(f"max_context must be >= 1, got {max_context}")
        self.max_context = max_context
        self.fed_tokens = 0  # Prompt tokens fed to the model, over all calls.
        self.prompt_tokens = 0  # Prompt tokens asked for, over all calls.
        self._parts: dict[Hashable, _Rows] = {}

    def slot_count(self) -> int:
        """Slots held on the device over all rows and parts (what bounds memory)."""
        return sum(part.slots.size for part in self._parts.values())

    def check_fits(self, token_lists: Sequence[Sequence[int]], new_tokens: int) -> None:
        """Raises ValueError when a prompt plus ``new_tokens`` exceeds ``max_context``."""
        if self.max_context is None:
            return
        for i, ids in enumerate(token_lists):
            if len(ids) + new_tokens > self.max_context:
                raise ValueError(
                    f"prompt {i} has {len(ids)} tokens; with {new_tokens} new tokens it "
                    f"exceeds max_context={self.max_context}. Raise the maximum context or "
                    f"keep fewer turns of history (rollout.history_turns).")

    def prepare(self, config: ModelConfig, dtype: Any, part: Hashable,
                keys: Sequence[Hashable], token_lists: Sequence[Sequence[int]],
                min_chunk: int, new_slots: int, pad_id: int, mesh: Mesh | None = None
                ) -> tuple[Chunk, Any]:
        """Lays out one call: keeps each row's cached prefix of its prompt, relays the
        cache if needed, and returns the chunk to feed and the device cache to feed it
        into (which the call consumes; ``record`` stores the one it returns). On a
        ``mesh`` the batch is a multiple of its ``data`` axis and the cache is sharded
        (``cache_shardings``)."""
        if len(set(keys)) != len(keys):
            raise ValueError("rows must be distinct within a call")
        rows = self._parts.pop(part, None)
        reusable = architectures.get(config).prefix_cache
        if rows is not None and (not reusable or rows.kv is None or rows.mesh != mesh):
            rows = None  # Cannot be cut back to a prefix; a call died holding it; moved.
        index = {} if rows is None else {key: i for i, key in enumerate(rows.keys)}
        kept = [0 if key not in index else
                min(common_prefix(rows.held(index[key]), ids), len(ids) - 1)
                for key, ids in zip(keys, token_lists)]
        new_lengths = [len(ids) - k for ids, k in zip(token_lists, kept)]
        self.fed_tokens += sum(new_lengths)
        self.prompt_tokens += sum(len(ids) for ids in token_lists)
        width = bucket(max(new_lengths), min_chunk)
        batch = _round_up(bucket(len(keys)), 1 if mesh is None else mesh.shape[DATA])
        in_place = (rows is not None and batch == rows.slots.shape[0]
                    and all(key in index for key in keys)
                    and rows.end + width + new_slots <= rows.slots.shape[1])
        if in_place:
            for key, k in zip(keys, kept):
                _truncate(rows.slots[index[key]], k)
        else:
            start = max(0, max(len(ids) for ids in token_lists) - width)
            rows = self._relay(config, dtype, rows, index, keys, kept,
                               [start + width - n for n in new_lengths], batch,
                               start + width + new_slots, mesh)
            rows.end = start
            index = {key: i for i, key in enumerate(rows.keys)}
        self._parts[part] = rows
        chunk = self._chunk(rows, [index[key] for key in keys], token_lists, kept, width,
                            pad_id)
        kv, rows.kv = rows.kv, None  # The call consumes (donates) it.
        return chunk, kv

    def record(self, part: Hashable, chunk: Chunk, kv: Any, generated: np.ndarray) -> None:
        """Stores the cache a call returned and the tokens it fed and generated.

        ``generated`` (n, steps): every token the decode loop fed for the call's rows (those
        after a stop too: their keys and values are in the cache all the same).
        """
        rows = self._parts[part]
        width = chunk.tokens.shape[1]
        steps = generated.shape[1]
        decoded = chunk.start + width
        rows.slots[chunk.batch, decoded:decoded + steps] = generated
        rows.end = decoded + steps
        rows.kv = kv

    def _relay(self, config: ModelConfig, dtype: Any, old: _Rows | None,
               index: dict[Hashable, int], keys: Sequence[Hashable], kept: Sequence[int],
               ends: Sequence[int], batch: int, needed: int, mesh: Mesh | None) -> _Rows:
        """A cache of ``batch`` rows for ``keys``: row i's kept prefix moves to the slots
        just before ``ends[i]``, where its new tokens will follow without a gap."""
        length = bucket(needed)
        if self.max_context is not None:
            length = max(needed, min(length, self.max_context))
        slots = np.full((batch, length), EMPTY, np.int32)
        sources = np.zeros(batch, np.int32)
        columns = np.zeros((batch, length), np.int32)
        for row, (key, k, end) in enumerate(zip(keys, kept, ends)):
            if k:
                held_columns = np.flatnonzero(old.slots[index[key]] != EMPTY)[:k]
                sources[row], columns[row, end - k:end] = index[key], held_columns
                slots[row, end - k:end] = old.slots[index[key], held_columns]
        if old is None or not any(kept):
            if old is not None:
                old.kv = None  # Freed before the new cache is allocated.
            kv = _empty(config, batch, length, dtype, mesh)
        elif old.slots.shape == (batch, length) and all(
                index[key] == row for row, (key, k) in enumerate(zip(keys, kept)) if k):
            kv, old.kv = _compact(old.kv, jnp.asarray(columns), mesh), None
        else:
            kv = _gather(old.kv, jnp.asarray(sources), jnp.asarray(columns), mesh)
        return _Rows(list(keys), slots, 0, kv, mesh)

    @staticmethod
    def _chunk(rows: _Rows, batch_rows: list[int], token_lists: Sequence[Sequence[int]],
               kept: Sequence[int], width: int, pad_id: int) -> Chunk:
        B, start = rows.slots.shape[0], rows.end
        tokens = np.full((B, width), pad_id, np.int32)
        tokens_mask = np.zeros((B, width), bool)
        positions = np.zeros((B, width), np.int32)
        for row, ids, k in zip(batch_rows, token_lists, kept):
            new = np.asarray(ids[k:], np.int32)
            tokens[row, width - len(new):] = new
            tokens_mask[row, width - len(new):] = True
            positions[row, width - len(new):] = np.arange(k, k + len(new))
            rows.slots[row, start + width - len(new):start + width] = new
        real = rows.slots != EMPTY
        return Chunk(np.asarray(batch_rows), tokens, tokens_mask, positions, real, start)


class Conversation(NamedTuple):
    """The rows of a ``ConversationCache`` that a ``generate`` call continues.

    Attributes:
      cache: the cache kept across calls.
      rows: a distinct hashable key per prompt naming its row (e.g. an episode's
        (member, task)).
    """

    cache: ConversationCache
    rows: Sequence[Hashable]


def _truncate(slots: np.ndarray, keep: int) -> None:
    """Empties a row's slots after its first ``keep`` tokens (in place)."""
    held = np.flatnonzero(slots != EMPTY)
    slots[held[keep:]] = EMPTY


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def constrain_cache(cache: Any, mesh: Mesh | None, rows_axis: int) -> Any:
    """``cache`` constrained to ``cache_shardings`` inside a jitted function (on a mesh)."""
    if mesh is None:
        return cache
    return jax.lax.with_sharding_constraint(cache, cache_shardings(mesh, cache, rows_axis))


@functools.partial(jax.jit, static_argnames=("config", "batch", "length", "dtype", "mesh"))
def _empty(config: ModelConfig, batch: int, length: int, dtype: Any, mesh: Mesh | None) -> Any:
    cache = decoder.empty_cache(config, batch, length, dtype)
    return constrain_cache(cache, mesh, architectures.get(config).cache_rows_axis(cache))


def _move_rows(old: KVCache | None, new: KVCache, sources: jax.Array,
               columns: jax.Array) -> KVCache:
    """``new`` with each row r set to row ``sources[r]`` of ``old`` (None: of ``new`` as it
    stands when row r is written), its slots reordered to ``columns[r]`` (either layout).

    One row at a time, written in place: taking all rows and then all their slots as two
    whole-cache gathers ran ~5x slower on XLA:CPU (7.5 vs 1.6 s for 64 rows of 2,048
    SmolLM2 slots) and held an extra copy of the cache.
    """

    axis = rows_axis(new)

    def write_row(row, out):
        def move(out_x, held_x, slot_axis):  # Rows on axis, slots on slot_axis.
            held = jax.lax.dynamic_index_in_dim(held_x, sources[row], axis=axis)
            return jax.lax.dynamic_update_index_in_dim(
                out_x, jnp.take(held, columns[row], axis=slot_axis), row, axis=axis)

        return jax.tree.map(move, out, out if old is None else old, slot_axes(out))

    return jax.lax.fori_loop(0, columns.shape[0], write_row, new)


@functools.partial(jax.jit, static_argnames=("mesh",))
def _gather(kv: KVCache, sources: jax.Array, columns: jax.Array,
            mesh: Mesh | None) -> KVCache:
    """Rows ``sources`` (B',) of a cache, each's slots reordered to ``columns`` (B', S'), in
    a fresh cache."""

    def fresh(x, slot_axis):
        shape = list(x.shape)
        shape[rows_axis(kv)], shape[slot_axis] = columns.shape
        return jnp.zeros(shape, x.dtype)

    new = jax.tree.map(fresh, kv, slot_axes(kv))
    return constrain_cache(_move_rows(kv, new, sources, columns), mesh, rows_axis(kv))


@functools.partial(jax.jit, static_argnames=("mesh",), donate_argnames=("kv",))
def _compact(kv: KVCache, columns: jax.Array, mesh: Mesh | None) -> KVCache:
    """Each row's slots reordered to ``columns`` (B, S) in place: a relayout that keeps the
    rows and the cache's shape allocates nothing (a fresh 6 GB cache took seconds just to
    be zeroed, page by page, at the end of a 64-row, 30-turn rollout)."""
    rows = jnp.arange(columns.shape[0])
    return constrain_cache(_move_rows(None, kv, rows, columns), mesh, rows_axis(kv))
