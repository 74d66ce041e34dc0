"""Math problems for the ``math_react`` environment: generated families and JSONL files.

Generated problems have exact answers that take computation (modular powers, digit sums
of huge powers, lattice-path counts, prime counts, big-integer arithmetic, exact fraction
sums, divisor sums); the ``easy`` families are one-line arithmetic whose answer a single
``python3 -c "print(...)"`` prints. Every problem is assigned to one of ``SPLITS`` by a
hash of its family and parameters (as ``sudoku.grid_split`` does with grids), so train,
eval and test never share a problem, whatever the seed and sizes.

JSONL files hold one ``{"id", "question", "answer"}`` object per line (extra keys are
ignored), e.g. the DAPO / AIME anchor sets; ``split_rows`` partitions them by a hash of
the id.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import re
from collections.abc import Callable, Sequence
from fractions import Fraction
from pathlib import Path

import numpy as np

from agentic_esopt.envs import base

SPLITS = ("train", "eval", "test")
DIFFICULTIES = ("standard", "easy")


@dataclasses.dataclass(frozen=True)
class MathTask:
    """One problem. ``answer`` is the exact answer as text (an integer, ``p/q``, LaTeX);
    ``expression`` is, for easy problems, the Python expression whose value it is."""

    id: str
    question: str
    answer: str
    family: str = ""
    expression: str = ""


def problem_split(key: str) -> str:
    """The split a problem belongs to, from its canonical key (family and parameters)."""
    return SPLITS[base.stable_int(key) % len(SPLITS)]


# ----------------------------------------------------------------------------- families
# Each family: rng -> (canonical parameters, question, answer).

Problem = tuple[tuple, str, str]


def _modpow(rng: np.random.Generator) -> Problem:
    a = int(rng.integers(1_000, 1_000_000))
    b = int(rng.integers(10**6, 10**12))
    m = int(rng.integers(10**5, 10**9))
    return ((a, b, m), f"What is the remainder when ${a}^{{{b}}}$ is divided by ${m}$?",
            str(pow(a, b, m)))


def _digit_sum_of_power(rng: np.random.Generator) -> Problem:
    base = int(rng.choice([2, 3, 7, 11, 13]))
    n = int(rng.integers(100, 2_000))
    return ((base, n), f"What is the sum of the decimal digits of ${base}^{{{n}}}$?",
            str(sum(int(d) for d in str(base ** n))))


def _digit_power_sum(rng: np.random.Generator) -> Problem:
    k = int(rng.integers(2, 6))
    n = int(rng.integers(1_000, 20_000))
    total = sum(int(d) ** k for i in range(1, n + 1) for d in str(i))
    return ((k, n), f"For every integer from $1$ to ${n}$, raise each of its decimal digits "
                    f"to the power ${k}$ and add them all up. What is the total?", str(total))


def _lattice_paths(rng: np.random.Generator) -> Problem:
    a, b = (int(v) for v in rng.integers(8, 31, size=2))
    c, d = int(rng.integers(1, a)), int(rng.integers(1, b))
    count = math.comb(c + d, c) * math.comb(a - c + b - d, a - c)
    return ((a, b, c, d), f"How many lattice paths go from $(0,0)$ to $({a},{b})$ using unit "
                          f"steps right $(1,0)$ or up $(0,1)$ and pass through $({c},{d})$?",
            str(count))


def _primes_in_range(rng: np.random.Generator) -> Problem:
    low = int(rng.integers(10_000, 1_000_000))
    high = low + int(rng.integers(500, 20_000))
    sieve = bytearray([1]) * (high + 1)
    sieve[0:2] = b"\x00\x00"
    for p in range(2, math.isqrt(high) + 1):
        if sieve[p]:
            sieve[p * p::p] = bytes(len(range(p * p, high + 1, p)))
    return ((low, high), f"How many prime numbers $p$ satisfy ${low} \\le p \\le {high}$?",
            str(sum(sieve[low:high + 1])))


def _big_arithmetic(rng: np.random.Generator) -> Problem:
    digits = [int(v) for v in rng.integers(15, 26, size=3)]
    a, b, c = (int("".join(str(int(x)) for x in rng.integers(1, 10, size=n))) for n in digits)
    return ((a, b, c), f"Compute ${a} \\times {b} - {c}$.", str(a * b - c))


def _fraction_sum(rng: np.random.Generator) -> Problem:
    start = int(rng.integers(1, 20))
    stop = start + int(rng.integers(4, 15))
    power = int(rng.integers(1, 3))
    total = sum(Fraction(1, k ** power) for k in range(start, stop + 1))
    term = "\\frac{1}{k}" if power == 1 else f"\\frac{{1}}{{k^{power}}}"
    return ((start, stop, power),
            f"Compute $\\sum_{{k={start}}}^{{{stop}}} {term}$ exactly, as a fraction in "
            "lowest terms.", f"{total.numerator}/{total.denominator}")


def _divisor_sum(rng: np.random.Generator) -> Problem:
    n = int(rng.integers(10**6, 10**9))
    total, m, p = 1, n, 2
    while p * p <= m:
        if m % p == 0:
            term = 1
            while m % p == 0:
                m //= p
                term = term * p + 1
            total *= term
        p += 1
    if m > 1:
        total *= m + 1
    return ((n,), f"What is the sum of all positive divisors of ${n}$?", str(total))


def _easy_add(rng: np.random.Generator) -> Problem:
    a, b = (int(v) for v in rng.integers(100, 10_000, size=2))
    return (a, b), f"What is {a} + {b}?", str(a + b)


def _easy_mul(rng: np.random.Generator) -> Problem:
    a, b = int(rng.integers(11, 1_000)), int(rng.integers(11, 100))
    return (a, b), f"What is {a} * {b}?", str(a * b)


def _easy_pow(rng: np.random.Generator) -> Problem:
    a, b = int(rng.integers(2, 10)), int(rng.integers(5, 16))
    return (a, b), f"What is {a} ** {b}?", str(a ** b)


def _easy_mod(rng: np.random.Generator) -> Problem:
    a, b = int(rng.integers(1_000, 100_000)), int(rng.integers(7, 100))
    return (a, b), f"What is {a} % {b}?", str(a % b)


FAMILIES: dict[str, dict[str, Callable[[np.random.Generator], Problem]]] = {
    "standard": {
        "modpow": _modpow, "digit_sum_of_power": _digit_sum_of_power,
        "digit_power_sum": _digit_power_sum, "lattice_paths": _lattice_paths,
        "primes_in_range": _primes_in_range, "big_arithmetic": _big_arithmetic,
        "fraction_sum": _fraction_sum, "divisor_sum": _divisor_sum,
    },
    "easy": {"add": _easy_add, "mul": _easy_mul, "pow": _easy_pow, "mod": _easy_mod},
}


def generate_problems(n: int, seed: int, split: str, difficulty: str = "standard",
                      families: Sequence[str] = ()) -> list[MathTask]:
    """``n`` distinct generated problems of ``split``; deterministic given the arguments.

    Args:
      n: number of problems.
      seed: integer seed.
      split: one of ``SPLITS``; problems are hash-partitioned (``problem_split``).
      difficulty: "standard" or "easy" (see ``FAMILIES``).
      families: the families to draw from, in turn (empty: all of the difficulty's).

    Returns:
      ``MathTask``s with ids ``{split}-{family}-{hash of the parameters}``.
    """
    if difficulty not in FAMILIES:
        raise ValueError(f"unknown difficulty {difficulty!r}; choose one of {DIFFICULTIES}")
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose one of {SPLITS}")
    names = list(families) or sorted(FAMILIES[difficulty])
    unknown = sorted(set(names) - set(FAMILIES[difficulty]))
    if unknown:
        raise ValueError(f"unknown {difficulty} families {unknown}; choose from "
                         f"{sorted(FAMILIES[difficulty])}")
    rng = np.random.default_rng([seed, base.stable_int(split), base.stable_int(difficulty)])
    tasks, seen = [], set()
    for attempt in range(100 * n + 1000):
        if len(tasks) == n:
            break
        family = names[attempt % len(names)]
        params, question, answer = FAMILIES[difficulty][family](rng)
        key = f"{difficulty}/{family}:{params}"
        if key in seen or problem_split(key) != split:
            continue
        seen.add(key)
        expression = question.removeprefix("What is ").removesuffix("?")
        tasks.append(MathTask(id=f"{split}-{family}-{base.stable_int(key):016x}",
                              question=question, answer=answer, family=family,
                              expression=expression if difficulty == "easy" else ""))
    if len(tasks) < n:
        raise ValueError(f"generated only {len(tasks)} of {n} distinct {difficulty} problems")
    return tasks


# ----------------------------------------------------------------------------- JSONL files

# The DAPO set wraps each question in instructions for an "Answer:" line, which contradict
# the environment's \boxed{} protocol; they are removed on loading by default.
_DAPO_PREFIX = re.compile(r"^\s*Solve the following math problem step by step\..*?\n\s*\n",
                          re.DOTALL)
_DAPO_SUFFIX = re.compile(r"\n\s*\n\s*Remember to put your answer on its own line after "
                          r"\"Answer:\"\.?\s*$")


def strip_answer_instructions(question: str) -> str:
    """The question without the DAPO 'Answer: $Answer' instructions (if present)."""
    return _DAPO_SUFFIX.sub("", _DAPO_PREFIX.sub("", question, count=1)).strip()


def load_jsonl(path: str | Path, strip_instructions: bool = True) -> list[MathTask]:
    """Problems from a JSONL file of ``{"id", "question", "answer"}`` objects.

    Raises:
      ValueError: naming the line of a malformed row or a repeated id.
    """
    def parse(row: dict) -> MathTask:
        task_id, question, answer = (str(row[k]) for k in ("id", "question", "answer"))
        if strip_instructions:
            question = strip_answer_instructions(question)
        return MathTask(id=task_id, question=question, answer=answer.strip(),
                        family=str(row.get("source", "")))

    tasks = base.read_task_rows(path, parse, "an {id, question, answer} object")
    repeated = sorted(i for i, n in collections.Counter(t.id for t in tasks).items() if n > 1)
    if repeated:
        raise ValueError(f"{path}: repeated ids {repeated[:5]}")
    return tasks


def split_rows(tasks: Sequence[MathTask], heldout_fraction: float) -> dict[str, list[MathTask]]:
    """Partitions loaded problems into ``SPLITS`` by a hash of each id.

    A fraction ``heldout_fraction`` of the problems goes to each of eval and test, the rest
    to train; file order is kept within each split.
    """
    splits = {name: [] for name in SPLITS}
    for task in tasks:
        u = base.stable_int(f"math_react/{task.id}") / 2.0 ** 64
        split = ("train" if u < 1 - 2 * heldout_fraction else
                 "eval" if u < 1 - heldout_fraction else "test")
        splits[split].append(task)
    return splits
