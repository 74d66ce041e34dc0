"""A heuristic-design task scored in-process (no sandbox), registered as "toy_search".

Heuristics approximate x² on [0, 1]; objective = 100 · mean squared error (minimise).
"""

import dataclasses
from typing import NamedTuple

import numpy as np

from agentic_esopt import envs
from agentic_esopt.envs.ahd.source import AHDSource

GRID = np.linspace(0.0, 1.0, 11)


@dataclasses.dataclass(frozen=True)
class ScaledSquareTask:
    description: str = "Approximate the square function on the unit interval."
    function_name: str = "priority"
    minimise: bool = True
    seed_heuristic_source: str = "def priority(x):\n    return x\n"

    def interface(self):
        return 'def priority(x: float) -> float:\n    """Estimates x squared."""\n'


class Scored(NamedTuple):
    valid: bool
    objective: float | None
    error: str | None


def objective_of(coefficient):
    return float(100 * np.mean((coefficient * GRID ** 2 - GRID ** 2) ** 2))


def evaluate(codes):
    results = []
    for code in codes:
        namespace = {}
        exec(code, namespace)  # pylint: disable=exec-used  # the test's own programs
        results.append(Scored(True, float(100 * np.mean(
            [(namespace["priority"](x) - x * x) ** 2 for x in GRID])), None))
    return results


@dataclasses.dataclass(frozen=True)
class Options:
    search: str = "sample"
    eoh_population: int = 3
    samples_per_member: int = 1

    def problems(self):
        return [] if self.search in ("eoh", "sample") else [f"search: {self.search!r}"]


def make_source(options, splits):
    del splits
    score = lambda code: evaluate([code])[0]._asdict()
    return AHDSource(ScaledSquareTask(), options, evaluate, score, "grid")


envs.registry.register("toy_search", __name__)
