"""The rollout engine issues a turn's resets and steps together for ``concurrent`` envs."""

import threading
from typing import NamedTuple

import pytest

from agentic_esopt.agents import rollout
from agentic_esopt.envs.base import StepResult


class Task(NamedTuple):
    id: str


class MeetingEnv:
    """Each reset and step waits until ``parties`` calls are in flight at once: it only
    returns when the engine runs the rows' calls in parallel."""

    def __init__(self, barrier, concurrent):
        self.barrier = barrier
        self.concurrent = concurrent
        self.threads = set()

    def reset(self, task, *, max_turns=None):
        return self._meet(f"start {task.id}")

    def step(self, action_text):
        return StepResult(self._meet(action_text), 1.0, True, {"solved": True})

    def _meet(self, text):
        self.threads.add(threading.current_thread().name)
        self.barrier.wait()
        return text


def echo(conversations, members, task_indices):
    return [c[-1]["content"] for c in conversations]


def test_concurrent_envs_run_a_turn_together():
    barrier = threading.Barrier(4, timeout=10)
    made = []

    def factory():
        made.append(MeetingEnv(barrier, concurrent=True))
        return made[-1]

    trajectories = rollout.run_episodes(factory, [Task("a"), Task("b")], echo, [0, 1])
    assert [t.actions for t in trajectories] == [["start a"], ["start b"]] * 2
    assert all(threading.main_thread().name not in env.threads for env in made)


def test_other_envs_run_in_order_on_the_calling_thread():
    barrier = threading.Barrier(1)
    made = []

    def factory():
        made.append(MeetingEnv(barrier, concurrent=False))
        return made[-1]

    rollout.run_episodes(factory, [Task("a"), Task("b")], echo, [0])
    assert all(env.threads == {threading.main_thread().name} for env in made)


def test_a_failing_row_fails_the_turn():
    class Broken(MeetingEnv):
        def step(self, action_text):
            raise ValueError("browser gone")

    with pytest.raises(ValueError, match="browser gone"):
        rollout.run_episodes(lambda: Broken(threading.Barrier(1), True), [Task("a")] * 2,
                             echo, [0])
