"""Constant-weight admissible sets, built greedily in the order a priority function sets.

Definition implemented (the one FunSearch's cap-set work takes from the combinatorics
literature on admissible sets; restated here in our own words). A set A of vectors in
{0, 1, 2}^n is an admissible set A(n, w) when

1. every vector has exactly w non-zero entries, and no two vectors have the same
   support (the set of positions holding a non-zero entry); and
2. any three distinct vectors u, v, x have at least one coordinate i at which the
   multiset {u_i, v_i, x_i} is {0, 1, 2}, {0, 0, 1} or {0, 0, 2}.

Condition 1 caps |A| at C(n, w). The objective is |A| (maximise).

Candidates come from a *block family*: the n coordinates are cut into blocks of
`block_size` and every block holds a cyclic rotation of one of the family's base
patterns. A candidate fixes the base pattern of each block (its "digits"); accepting it
adds every combination of rotations (its orbit) to the set at once.

* ``all_vectors``: blocks of one coordinate with patterns 0, 1, 2, so candidates are
  exactly the weight-w vectors and orbits are single vectors (C(n, w) 2^w candidates).
* ``cyclic_triples``: blocks of three coordinates with the seven patterns
  000, 001, 002, 012, 021, 111, 222 and their cyclic rotations, a symmetric
  restriction that keeps the larger settings tractable.

Both families have the property that two different rotations of one pattern, together
with any rotation of any pattern, always leave a coordinate of the block satisfying
condition 2 (checked when the tables are built). Hence a triple with two vectors from
one orbit is never bad, every orbit is admissible on its own, and only triples from
three different candidates need checking; and supports collide exactly when two
candidates have the same weight in every block.

The greedy scores every candidate once with `priority(el, n, w)` (el: the candidate's
n-tuple with every block in its base rotation), visits candidates by decreasing score
(ties in enumeration order) and accepts one when its whole orbit keeps the set
admissible. Triples are checked block by block through a lookup table derived from the
definition, so the cost grows with the number of accepted candidates, not with the
size of the expanded set.
"""

import itertools
from typing import Callable, NamedTuple, Sequence

import numpy as np

from agentic_esopt.envs.ahd import common
from agentic_esopt.envs.ahd.validation import check_real


class BlockFamily(NamedTuple):
    """Candidate family: blocks of `block_size` coordinates, each a rotation of a pattern."""

    block_size: int
    patterns: tuple[tuple[int, ...], ...]


FAMILIES = {
    "all_vectors": BlockFamily(1, ((0,), (1,), (2,))),
    "cyclic_triples": BlockFamily(
        3, ((0, 0, 0), (0, 0, 1), (0, 0, 2), (0, 1, 2), (0, 2, 1), (1, 1, 1), (2, 2, 2))),
}


class AdmissibleSetting(NamedTuple):
    """One admissible-set problem: vectors of length n and weight w from `family`."""

    n: int
    w: int
    family: str


# The published settings, keyed by n, with the family that keeps each tractable.
SETTINGS = {
    12: AdmissibleSetting(12, 7, "all_vectors"),
    15: AdmissibleSetting(15, 10, "cyclic_triples"),
    21: AdmissibleSetting(21, 15, "cyclic_triples"),
}


def generate_instances(size: int, n: int, seed: int) -> list[AdmissibleSetting]:
    """The published setting with dimension `size` (12, 15 or 21), as a one-item list.

    The problem is deterministic, so `n` and `seed` do not change it and one copy is
    returned whatever `n` is (further copies would score identically).
    """
    del n, seed  # deterministic problem
    if size not in SETTINGS:
        raise ValueError(f"admissible-set size must be one of {sorted(SETTINGS)}, got {size!r}")
    return [SETTINGS[size]]


def is_good_triple(a: int, b: int, c: int) -> bool:
    """Whether one coordinate's values {a, b, c} satisfy condition 2 of the definition."""
    return sorted((a, b, c)) in ([0, 1, 2], [0, 0, 1], [0, 0, 2])


def _rotations(pattern: tuple[int, ...]) -> list[tuple[int, ...]]:
    """Distinct cyclic rotations of a pattern, starting with the pattern itself."""
    shifted = [pattern[k:] + pattern[:k] for k in range(len(pattern))]
    return list(dict.fromkeys(shifted))


def _support(pattern: tuple[int, ...]) -> frozenset[int]:
    return frozenset(i for i, value in enumerate(pattern) if value)


class _Tables(NamedTuple):
    """Per-block lookup tables of a family (D = number of patterns)."""

    weights: np.ndarray       # (D,) non-zeros per pattern
    bad: np.ndarray           # (D, D, D) bool: some rotations of the three patterns leave
                              # no coordinate of the block satisfying condition 2


def _block_is_bad(*blocks: tuple[int, ...]) -> bool:
    return not any(is_good_triple(*values) for values in zip(*blocks))


def _family_tables(family: BlockFamily) -> _Tables:
    """Builds the lookup table and checks the structural properties the greedy relies on."""
    orbits = [_rotations(pattern) for pattern in family.patterns]
    flat = [rotation for orbit in orbits for rotation in orbit]
    if len(set(flat)) != len(flat):
        raise ValueError("family patterns must have disjoint rotation orbits")
    orbit_supports = [frozenset(map(_support, orbit)) for orbit in orbits]
    if any(len(supports) != len(orbit) for supports, orbit in zip(orbit_supports, orbits)):
        raise ValueError("rotations of one pattern must have distinct supports")
    weights = [len(_support(pattern)) for pattern in family.patterns]
    for first, second in itertools.combinations(range(len(orbits)), 2):
        if weights[first] == weights[second] and orbit_supports[first] != orbit_supports[second]:
            raise ValueError("patterns of equal weight must have rotations of equal supports")
    for orbit, third in itertools.product(orbits, flat):
        if any(_block_is_bad(p, q, third) for p, q in itertools.permutations(orbit, 2)):
            raise ValueError("two rotations of one pattern must never make a bad block")
    size = len(family.patterns)
    bad = np.zeros((size, size, size), dtype=bool)
    for digits in itertools.product(range(size), repeat=3):
        bad[digits] = any(_block_is_bad(*blocks)
                          for blocks in itertools.product(*(orbits[d] for d in digits)))
    return _Tables(weights=np.array(weights), bad=bad)


def _enumerate_candidates(setting: AdmissibleSetting, tables: _Tables) -> np.ndarray:
    """Digit arrays (k, blocks) of total weight w, in lexicographic order."""
    family = FAMILIES[setting.family]
    blocks = setting.n // family.block_size
    size = len(family.patterns)
    digits = np.stack(np.unravel_index(np.arange(size ** blocks), (size,) * blocks), axis=1)
    return digits[tables.weights[digits].sum(axis=1) == setting.w]


def _check_setting(setting: AdmissibleSetting) -> BlockFamily:
    if setting.family not in FAMILIES:
        raise ValueError(f"unknown family {setting.family!r}; known: {sorted(FAMILIES)}")
    family = FAMILIES[setting.family]
    if setting.n < 1 or setting.n % family.block_size:
        raise ValueError(
            f"n must be a positive multiple of {family.block_size} for {setting.family}, "
            f"got {setting.n}")
    if not 0 < setting.w <= setting.n:
        raise ValueError(f"w must lie in 1..n, got w={setting.w}, n={setting.n}")
    return family


class _CandidatePool:
    """Candidates still allowed, eliminated eagerly as the greedy accepts others.

    A candidate stays alive while no accepted candidate has its weight pattern (so its
    supports are new) and no triple of distinct vectors from its orbit and two accepted
    orbits violates condition 2. Accepting R kills every X with the same weight pattern
    and every X that forms a bad triple with R and some accepted P. That test uses, per
    block and digit pair (a, c), a packed bitset of the live candidates whose digit d
    makes (a, d, c) bad in that block: X is killed when its bit survives the AND over
    blocks for some P. Bitsets are rebuilt over the live candidates whenever fewer than
    half of those indexed are still alive, so work shrinks as the pool empties.
    """

    CHUNK = 256  # accepted candidates combined per bitset pass (bounds memory)

    def __init__(self, tables: _Tables, candidates: np.ndarray):
        self.tables = tables
        self.candidates = candidates
        weights = tables.weights[candidates]  # (k, blocks), read as digits of one integer
        self.weight_patterns = weights @ (weights.max() + 1) ** np.arange(weights.shape[1])
        self.alive = np.ones(len(candidates), dtype=bool)
        self._reindex()

    def _reindex(self) -> None:
        """Rebuilds the bitsets over the currently alive candidates."""
        self.indexed = np.flatnonzero(self.alive)
        bad = self.tables.bad[:, self.candidates[self.indexed], :]  # (D, k, blocks, D)
        padding = -self.indexed.size % 64
        bad = np.pad(bad.transpose(2, 0, 3, 1), [(0, 0)] * 3 + [(0, padding)])
        self.bitsets = np.packbits(bad, axis=-1).view(np.uint64)  # (blocks, D, D, k/64)

    def accept(self, index: int, accepted: np.ndarray) -> None:
        """Marks candidate `index` accepted after `accepted` (indices) and kills conflicts."""
        self.alive[self.weight_patterns == self.weight_patterns[index]] = False
        new = self.candidates[index]
        blocks = np.arange(len(new))
        killed = np.zeros(self.bitsets.shape[-1], dtype=np.uint64)
        for start in range(0, len(accepted), self.CHUNK):
            previous = self.candidates[accepted[start:start + self.CHUNK]]  # (c, blocks)
            words = self.bitsets[blocks, previous, new]  # (c, blocks, k/64)
            killed |= np.bitwise_or.reduce(np.bitwise_and.reduce(words, axis=1), axis=0)
        hit = np.unpackbits(killed.view(np.uint8), count=self.indexed.size).astype(bool)
        self.alive[self.indexed[hit]] = False
        if 2 * self.alive[self.indexed].sum() < self.indexed.size:
            self._reindex()


def _expand(family: BlockFamily, digits: np.ndarray) -> np.ndarray:
    """All vectors in the orbits of the given candidates: (m, n)."""
    orbits = [_rotations(pattern) for pattern in family.patterns]
    vectors = [sum(blocks, ()) for row in digits
               for blocks in itertools.product(*(orbits[d] for d in row))]
    return np.array(vectors, dtype=np.int64).reshape(len(vectors), -1)


def build_admissible_set(priority: Callable, setting: AdmissibleSetting) -> np.ndarray:
    """The admissible set the greedy builds in `priority` order: (size, n) int array.

    Raises:
        InvalidHeuristicOutput: a priority that is not a real number or is NaN.
    """
    family = _check_setting(setting)
    tables = _family_tables(family)
    candidates = _enumerate_candidates(setting, tables)
    patterns = np.array(family.patterns)
    representatives = patterns[candidates].reshape(len(candidates), setting.n).tolist()
    scores = np.array([check_real(priority(tuple(el), setting.n, setting.w), "priority output")
                       for el in representatives])
    pool = _CandidatePool(tables, candidates)
    accepted = []
    for index in np.argsort(-scores, kind="stable"):
        if pool.alive[index]:
            pool.accept(index, np.array(accepted, dtype=np.int64))
            accepted.append(index)
    return _expand(family, candidates[accepted])


def is_admissible(vectors: np.ndarray, w: int) -> bool:
    """Direct check of the definition (cubic in the set size: for small sets and tests)."""
    vectors = np.asarray(vectors, dtype=np.int64)
    if vectors.ndim != 2 or not np.isin(vectors, (0, 1, 2)).all():
        raise ValueError("vectors must be an (m, n) array over {0, 1, 2}")
    supports = vectors != 0
    if (supports.sum(axis=1) != w).any() or len(np.unique(supports, axis=0)) != len(vectors):
        return False
    good = np.zeros((3, 3, 3), dtype=bool)
    for values in itertools.product(range(3), repeat=3):
        good[values] = is_good_triple(*values)
    for first, second in itertools.combinations(range(len(vectors)), 2):
        has_good = good[vectors[first], vectors[second], vectors].any(axis=1)
        has_good[[first, second]] = True
        if not has_good.all():
            return False
    return True


def evaluate(priority: Callable, instances: Sequence[AdmissibleSetting]) -> float:
    """Mean size of the admissible sets the greedy builds (higher is better)."""
    return common.mean_objective(
        lambda setting: len(build_admissible_set(priority, AdmissibleSetting(*setting))),
        instances)
