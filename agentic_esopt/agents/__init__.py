"""Host-side agent loop: prompts, action parsing and batched multi-turn rollouts."""

from agentic_esopt.agents import parsing, prompts, rollout
from agentic_esopt.agents.parsing import ParseError, SetAction, parse_set_action
from agentic_esopt.agents.rollout import (Trajectory, make_model_policy, member_rewards,
                                          read_trajectories, run_episodes, write_trajectories)

__all__ = ["ParseError", "SetAction", "Trajectory", "make_model_policy", "member_rewards",
           "parse_set_action", "parsing", "prompts", "read_trajectories", "rollout",
           "run_episodes", "write_trajectories"]
