"""Host-side agents: prompts, batched multi-turn rollouts, heuristic search, and the reward
sources that turn a population of the current policy into one reward per member."""

from agentic_esopt.agents import ahd_prompts, eoh, prompts, rollout, skills, sources
from agentic_esopt.agents.rollout import (Trajectory, make_model_policy, member_rewards,
                                          read_trajectories, run_episodes, write_trajectories)

__all__ = ["Trajectory", "ahd_prompts", "eoh", "make_model_policy", "member_rewards",
           "prompts", "read_trajectories", "rollout", "run_episodes", "skills", "sources",
           "write_trajectories"]
