"""Evolution strategies over arbitrary (possibly sharded) parameter pytrees."""

from agentic_esopt.es import fitness, history, noise, schedules
from agentic_esopt.es.noise import LowRank, Population
from agentic_esopt.es.strategy import ESState, Strategy, agentic_esopt, from_spec

__all__ = ["ESState", "LowRank", "Population", "Strategy", "agentic_esopt", "fitness",
           "from_spec", "history", "noise", "schedules"]
