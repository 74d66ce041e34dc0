"""Evolution strategies over arbitrary (possibly sharded) parameter pytrees."""

from agentic_esopt.es import fitness, history, noise, schedules, strategies, strategy
from agentic_esopt.es.noise import LowRank, Population
from agentic_esopt.es.strategies.agentic_esopt import agentic_esopt, from_spec
from agentic_esopt.es.strategy import ESState, Strategy

__all__ = ["ESState", "LowRank", "Population", "Strategy", "agentic_esopt", "fitness",
           "from_spec", "history", "noise", "schedules", "strategies", "strategy"]
