"""Host-side agent loop: prompts, action parsing and batched multi-turn rollouts.

Submodules load on first use, so light users (the sandbox child, parsers) never import
jax through this package.
"""

import importlib

_EXPORTS = {
    "ParseError": "parsing", "SetAction": "parsing", "parse_set_action": "parsing",
    "Trajectory": "rollout", "make_model_policy": "rollout", "member_rewards": "rollout",
    "read_trajectories": "rollout", "run_episodes": "rollout",
    "write_trajectories": "rollout",
}
_SUBMODULES = ("ahd_prompts", "eoh", "parsing", "prompts", "rollout")

__all__ = sorted([*_EXPORTS, *_SUBMODULES])


def __getattr__(name):
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
