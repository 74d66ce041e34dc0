"""Evolution strategies over arbitrary (possibly sharded) parameter pytrees."""

from agentic_esopt.es import (fitness, history, noise, options, schedules, strategies,
                              strategy, update)
from agentic_esopt.es.noise import LowRank, Population
from agentic_esopt.es.strategies import from_options, from_spec
from agentic_esopt.es.strategies.agentic_esopt import agentic_esopt
from agentic_esopt.es.strategies.random_search import random_search
from agentic_esopt.es.strategy import ESState, Strategy

__all__ = ["ESState", "LowRank", "Population", "Strategy", "agentic_esopt", "fitness",
           "from_options", "from_spec", "history", "noise", "options", "random_search",
           "schedules", "strategies", "strategy", "update"]
