"""The rollout engine with fake policies (no model), prompts, and the model-policy adapter."""

import itertools

import jax
import numpy as np
import pytest

from agentic_esopt import models
from agentic_esopt.agents import prompts, rollout, skills
from agentic_esopt.envs import sudoku
from agentic_esopt.envs.base import StepResult
from agentic_esopt.registry import PluginError

TASKS = (sudoku.generate_tasks(1, 4, 2, seed=0, split="train")
         + sudoku.generate_tasks(1, 4, 4, seed=0, split="train"))


class OracleForMemberZero:
    """Member 0 plays the solution (blanks in row-major order); other members babble.

    Stands in for "member i's parameters": only member 0's rows can ever be solved.
    """

    def __init__(self, tasks):
        self.tasks = tasks
        self.calls = []
        self.task_indices = []

    def __call__(self, conversations, members, task_indices):
        self.calls.append(list(members))
        self.task_indices.append(list(task_indices))
        return [self.reply(c) if m == 0 else f"member {m} thinks" for c, m in
                zip(conversations, members)]

    def reply(self, conversation):
        opening = next(m["content"] for m in conversation if m["role"] == "user")
        task, = [t for t in self.tasks if sudoku.render_board(t.puzzle) in opening]
        played = sum(m["role"] == "assistant" for m in conversation)
        r, c = [(r, c) for r, c in itertools.product(range(task.size), repeat=2)
                if task.puzzle[r][c] == 0][played]
        return f"<answer>set {r + 1} {c + 1} {task.solution[r][c]}</answer>"


def run(policy, members=(0, 1, 2), **kwargs):
    return rollout.run_episodes(sudoku.SudokuEnv, TASKS, policy, members,
                                system_prompt="You play Sudoku.", generation=3, **kwargs)


def test_rows_act_with_their_own_member_and_finished_rows_drop_out():
    policy = OracleForMemberZero(TASKS)
    trajectories = run(policy)
    # Member 0 solves the H*=2 and H*=4 tasks in 2 and 4 turns; members 1 and 2 use all
    # 3·H* turns (6 and 12). One policy call per turn covers every active row.
    assert [len(call) for call in policy.calls] == [6, 6, 5, 5, 4, 4] + [2] * 6
    assert policy.calls[0] == [0, 0, 1, 1, 2, 2] and policy.calls[-1] == [1, 2]
    assert policy.task_indices[0] == [0, 1, 0, 1, 0, 1] and policy.task_indices[-1] == [1, 1]
    assert [(t.member, t.task_id) for t in trajectories] == [
        (m, task.id) for m in (0, 1, 2) for task in TASKS]
    assert [t.num_turns for t in trajectories] == [2, 4, 6, 12, 6, 12]
    assert [t.solved for t in trajectories] == [True, True] + [False] * 4
    np.testing.assert_array_equal(rollout.member_rewards(trajectories, 3), [1.0, 0.0, 0.0])


def test_trajectory_records_the_conversation():
    trajectory = run(OracleForMemberZero(TASKS), members=[0])[0]
    assert trajectory.generation == 3 and trajectory.rewards == [0.0, 1.0]
    assert trajectory.total_reward == 1.0 and trajectory.info["solved"]
    roles = [m["role"] for m in trajectory.messages]
    assert roles == ["system", "user", "assistant", "user", "assistant", "user"]
    assert [m["content"] for m in trajectory.messages[2::2]] == trajectory.actions
    assert "solved" in trajectory.messages[-1]["content"]


def test_max_turns_caps_every_episode():
    policy = OracleForMemberZero(TASKS)
    trajectories = run(policy, max_turns=3)
    assert [t.num_turns for t in trajectories] == [2, 3, 3, 3, 3, 3]
    assert len(policy.calls) == 3


def test_member_rewards_average_over_tasks():
    def reward_for(member, total):
        return rollout.Trajectory(member=member, task_id="t", generation=0, messages=[],
                                  actions=[], rewards=[total], total_reward=total,
                                  num_turns=1, solved=False, info={})

    trajectories = [reward_for(0, 1.0), reward_for(1, 0.5), reward_for(0, 0.0),
                    reward_for(1, 0.25)]
    np.testing.assert_allclose(rollout.member_rewards(trajectories, 2), [0.5, 0.375])
    with pytest.raises(ValueError, match=r"members without trajectories: \[2\]"):
        rollout.member_rewards(trajectories, 3)
    with pytest.raises(ValueError, match="outside a population of 1"):
        rollout.member_rewards(trajectories, 1)


def test_trajectories_are_appended_as_jsonl(tmp_path):
    path = tmp_path / "runs" / "trajectories.jsonl"
    first = run(OracleForMemberZero(TASKS), trajectory_path=path)
    second = run(OracleForMemberZero(TASKS), members=[1], trajectory_path=path)
    assert len(path.read_text().splitlines()) == 8
    assert rollout.read_trajectories(path) == first + second


class NeverEnds:
    def reset(self, task, *, max_turns=None):
        return "go"

    def step(self, action_text):
        return StepResult("again", 0.0, False, {})


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(members=[]), ValueError, "at least one member"),
    (dict(members=[0, 0]), ValueError, "distinct"),
    (dict(max_turns=0), ValueError, "max_turns must be"),
])
def test_bad_arguments(kwargs, error, message):
    kwargs = {"members": [0], **kwargs}
    with pytest.raises(error, match=message):
        rollout.run_episodes(sudoku.SudokuEnv, TASKS, OracleForMemberZero(TASKS), **kwargs)


def test_policy_and_environment_contract_violations_are_errors():
    with pytest.raises(ValueError, match="policy must return 2 strings"):
        rollout.run_episodes(sudoku.SudokuEnv, TASKS, lambda c, m, t: ["set 1 1 1"], [0])
    with pytest.raises(RuntimeError, match="did not end its episodes within max_turns=4"):
        rollout.run_episodes(NeverEnds, TASKS, lambda c, m, t: ["x"] * len(c), [0], max_turns=4)


class ThreeTuples(NeverEnds):
    """Returns (observation, reward, done): the wrong shape."""

    def step(self, text):
        return "ok", 1.0, True


class ListObservations(NeverEnds):
    def reset(self, task, *, max_turns=None):
        return ["a list"]


@pytest.mark.parametrize("env, message", [
    (ThreeTuples, r"ThreeTuples.step must return StepResult\(observation: str, reward: float, "
                  r"done: bool, info: dict\), got \('ok', 1.0, True\)"),
    (ListObservations, r"ListObservations.reset must return the first observation, a str, "
                       r"got \['a list'\]")])
def test_an_environment_of_the_wrong_shape_is_a_plugin_error(env, message):
    with pytest.raises(PluginError, match=message):
        rollout.run_episodes(env, TASKS, lambda c, m, t: ["x"] * len(c), [0])


def test_trim_history_keeps_system_first_observation_and_last_turns():
    messages = prompts.initial_messages("sys", "obs0")
    for turn in range(1, 4):
        messages = prompts.add_turn(messages, f"act{turn}", f"obs{turn}")
    contents = [m["content"] for m in prompts.trim_history(messages, 1)]
    assert contents == ["sys", "obs0", "act3", "obs3"]
    assert prompts.trim_history(messages, 10) == messages == prompts.trim_history(messages, None)
    no_system = prompts.initial_messages(None, "obs0") + messages[2:]
    assert [m["content"] for m in prompts.trim_history(no_system, 2)] == [
        "obs0", "act2", "obs2", "act3", "obs3"]
    assert [m["content"] for m in prompts.trim_history(messages, 0)] == ["sys", "obs3"]
    assert prompts.trim_history(messages[:2], 0) == messages[:2]
    assert [m["content"] for m in prompts.trim_history(no_system, 0)] == ["obs3"]
    with pytest.raises(ValueError, match="keep_turns"):
        prompts.trim_history(messages, -1)


class FakeTokenizer:
    def apply_chat_template(self, messages, add_generation_prompt, tokenize):
        assert add_generation_prompt and not tokenize
        return "|".join(f"{m['role']}:{m['content']}" for m in messages) + "|assistant:"


class FakeModel:
    tokenizer = FakeTokenizer()


def test_model_policy_templates_trims_and_routes_members():
    calls = []

    def fake_generate(model, prompts_, **kwargs):
        calls.append((prompts_, kwargs))
        return type("Out", (), {"texts": [f"reply {i}" for i in range(len(prompts_))]})()

    population = object()
    options = rollout.Options(max_new_tokens=7, history_turns=1, top_k=5,
                              presence_penalty=2.0)
    policy = rollout.make_model_policy(FakeModel(), population, options, temperature=0.5,
                                       key=jax.random.key(0), generate=fake_generate,
                                       extra_stop=("Observation:",))
    long = prompts.add_turn(prompts.initial_messages("sys", "o0"), "a1", "o1")
    long = prompts.add_turn(long, "a2", "o2")
    replies = policy([long, prompts.initial_messages("sys", "o0")], [3, 1], [4, 0])
    policy([long], [0], [4])
    assert replies == ["reply 0", "reply 1"]
    (first_prompts, first), (_, second) = calls
    assert first_prompts == ["system:sys|user:o0|assistant:a2|user:o2|assistant:",
                             "system:sys|user:o0|assistant:"]
    assert first["population"] is population
    np.testing.assert_array_equal(first["members"], [3, 1])
    np.testing.assert_array_equal(first["streams"], [4, 0])
    assert first["sampling"] == models.Sampling(
        max_new_tokens=7, temperature=0.5, top_k=5, top_p=None, presence_penalty=2.0,
        frequency_penalty=0.0, stop=("Observation:",))
    assert first["conversation"].rows == [(3, 4), (1, 0)]  # Each episode keeps its KV cache.
    assert second["conversation"].cache is first["conversation"].cache
    assert second["conversation"].rows == [(0, 4)]
    assert not np.array_equal(jax.random.key_data(first["key"]),
                              jax.random.key_data(second["key"]))

    prefixed = rollout.Options(max_new_tokens=7, reply_prefix="set ", stop_at_newline=True)
    greedy = rollout.make_model_policy(FakeModel(), None, prefixed, temperature=0.0, key=None,
                                       generate=fake_generate)
    assert greedy([long], [5], [0]) == ["set reply 0"]
    assert calls[-1][0][0].endswith("|assistant:set ")
    assert calls[-1][1]["sampling"].stop == ("\n",)
    assert calls[-1][1]["members"] is None and calls[-1][1]["key"] is None
    uncached = rollout.Options(keep_kv_cache=False)
    rollout.make_model_policy(FakeModel(), None, uncached, temperature=0.0, key=None,
                              generate=fake_generate)([long], [0], [0])
    assert calls[-1][1]["conversation"] is None
    with pytest.raises(ValueError, match="needs a key"):
        rollout.make_model_policy(FakeModel(), None, options, temperature=1.0, key=None,
                                  generate=fake_generate)


def test_model_policy_without_chat_template_joins_the_texts_then_the_reply_prefix():
    prompts_seen = []

    def fake_generate(model, prompts_, **kwargs):
        prompts_seen.extend(prompts_)
        return type("Out", (), {"texts": ["4 </think>"] * len(prompts_)})()

    plain = rollout.Options(chat_template=False, reply_prefix="Think.\n<think>")
    policy = rollout.make_model_policy(FakeModel(), None, plain, temperature=0.0, key=None,
                                       generate=fake_generate)
    opening = prompts.initial_messages("System.", "Question?")
    assert policy([opening], [0], [0]) == ["Think.\n<think>4 </think>"]
    later = prompts.add_turn(opening, "Think.\n<think>4 </think>", "Again?")
    policy([later], [0], [0])
    assert prompts_seen == ["System.Question?Think.\n<think>",
                            "System.Question?Think.\n<think>4 </think>Again?Think.\n<think>"]


def test_skill_is_appended_to_the_system_prompt_without_its_provenance(tmp_path):
    skill = tmp_path / "skill.md"
    skill.write_text("- Check the row first.\n\n<!-- provenance\nL1: task 3\n-->\n")
    assert skills.with_skill("Play well.", str(skill)) == (
        "Play well.\n\nAdditional skill instructions:\n- Check the row first.")
    assert skills.with_skill(None, str(skill)).startswith("Additional skill instructions:")
    assert skills.with_skill("Play well.", None) == "Play well."


class ClosingEnv:
    closed = []

    def __init__(self, fail_on_step=False):
        self.fail_on_step = fail_on_step

    def reset(self, task, *, max_turns=None):
        return "go"

    def step(self, action):
        if self.fail_on_step:
            raise RuntimeError("browser crashed")
        return StepResult("done", 1.0, True, {})

    def close(self):
        ClosingEnv.closed.append(self)


def test_environments_are_closed_after_the_episode_and_on_error():
    Task = type("Task", (), {"id": "t"})
    ClosingEnv.closed = []
    policy = lambda conversations, members, tasks: ["x"] * len(conversations)
    rollout.run_episodes(ClosingEnv, [Task()], policy, range(3))
    assert len(ClosingEnv.closed) == 3
    ClosingEnv.closed = []
    with pytest.raises(RuntimeError, match="browser crashed"):
        rollout.run_episodes(lambda: ClosingEnv(fail_on_step=True), [Task()], policy, range(2))
    assert len(ClosingEnv.closed) == 2


def test_member_task_rewards_place_every_episode_in_its_cell():
    def episode(member, task_id, total):
        return rollout.Trajectory(member=member, task_id=task_id, generation=0, messages=[],
                                  actions=[], rewards=[total], total_reward=total,
                                  num_turns=1, solved=False, info={})

    trajectories = [episode(1, "b", 0.25), episode(0, "a", 1.0), episode(1, "a", 0.5),
                    episode(0, "b", 0.0)]
    np.testing.assert_array_equal(rollout.member_task_rewards(trajectories, 2, ["a", "b"]),
                                  [[1.0, 0.0], [0.5, 0.25]])
    with pytest.raises(ValueError, match="member 2 on 'a', member 2 on 'b'"):
        rollout.member_task_rewards(trajectories, 3, ["a", "b"])
    with pytest.raises(ValueError, match="played task 'a' twice"):
        rollout.member_task_rewards(trajectories + [episode(0, "a", 1.0)], 2, ["a", "b"])
    with pytest.raises(ValueError, match=r"on task 'b' is outside 2 members × tasks \['a'\]"):
        rollout.member_task_rewards(trajectories, 2, ["a"])
