"""reasoning-gym datasets behind ``envs.make("reasoning_gym", ...)``, with scripted replies."""

import json
import sys

import pytest

from agentic_esopt import envs
from agentic_esopt.envs import reasoning_gym as rg_env

pytest.importorskip("reasoning_gym")

# Two-term one-digit sums: only 200 distinct questions, so unpartitioned splits collide.
SMALL_CHAIN_SUM = json.dumps(dict(min_terms=2, max_terms=2, min_digits=1, max_digits=1))


def make(dataset="chain_sum", **options):
    """A source that scores in this process (no worker start-up)."""
    return envs.make("reasoning_gym", dataset=dataset, score_timeout_s=0.0,
                     **{"eval_size": 8, "tasks_per_generation": 4, **options})


def tagged(text):
    return f"Let me think.\n<answer>{text}</answer>"


def wrong_number(task):
    return str(int(task.answer) + 1)


@pytest.fixture(scope="module")
def countdown():
    with envs.make("reasoning_gym", dataset="countdown") as source:
        yield source


def test_contract_countdown_reference_answer_scores_one_and_nonsense_less(countdown):
    task = countdown.eval_tasks[0]
    assert isinstance(task.answer, str) and task.answer
    env = countdown.env_factory()
    assert env.reset(task) == task.question
    _, reward, done, info = env.step(tagged(task.answer))
    assert (reward, done, info["solved"]) == (1.0, True, True)
    env.reset(task)
    _, reward, done, info = env.step("nonsense")
    assert reward < 1.0 and done and not info["solved"]
    assert json.dumps(info)  # trajectories are JSONL
    assert countdown.stop == ("</answer>",) and "<answer>" in countdown.system_prompt
    assert len(countdown.eval_tasks) == 32 and len(countdown.train_tasks(0)) == 4


@pytest.mark.parametrize("reply, answer", [
    ("<answer>42</answer>", "42"),
    ("first <answer>1</answer> then <ANSWER> 2 </Answer>", "2"),
    ("working...\n<answer>3 + 4", "3 + 4"),  # generation stopped at "</answer>"
    ("<answer>1 2\n3 4</answer>\ntrailing words", "1 2\n3 4"),
    ("I think so.\n  7  \n\n", "7"),
    ("", None),
    ("  \n ", None),
    ("<answer> </answer>", None),
    (None, None),
])
def test_extract_answer(reply, answer):
    assert rg_env.extract_answer(reply) == answer


def test_second_dataset_end_to_end_with_last_line_answers():
    source = make("basic_arithmetic")
    env = source.env_factory()
    for task in source.eval_tasks:
        assert env.reset(task) == task.question
        _, reward, done, info = env.step(f"The result is below.\n{task.answer}")
        assert (reward, done, info["solved"], info["answer"]) == (1.0, True, True, task.answer)
    task = source.eval_tasks[0]
    env.reset(task)
    observation, reward, done, info = env.step(tagged(wrong_number(task)))
    assert (reward, done, info["solved"]) == (0.0, True, False)
    assert "scored 0.00" in observation and "Try again" not in observation
    with pytest.raises(RuntimeError, match="has ended"):
        env.step("1")


def test_multi_turn_feedback_then_retry_succeeds():
    source = make(max_turns=3)
    assert "answer again" in source.system_prompt
    task, env = source.eval_tasks[0], source.env_factory()
    assert "You have 3 attempts" in env.reset(task)
    observation, reward, done, info = env.step(tagged(wrong_number(task)))
    assert (reward, done, info["score"]) == (0.0, False, 0.0)
    assert "scored 0.00 out of 1" in observation and "Attempts left: 2" in observation
    observation, reward, done, info = env.step("no idea")
    assert not done and "Attempts left: 1" in observation
    observation, reward, done, info = env.step(tagged(task.answer))
    assert (reward, done, info["solved"], info["turn"]) == (1.0, True, True, 3)
    assert observation == "Correct."


def test_multi_turn_ends_at_the_limit_and_honours_the_rollout_cap():
    source = make(max_turns=3)
    task, env = source.eval_tasks[0], source.env_factory()
    env.reset(task)
    results = [env.step(tagged(wrong_number(task))) for _ in range(3)]
    assert [r.done for r in results] == [False, False, True]
    assert "No attempts left" in results[-1].observation and not results[-1].info["solved"]
    assert env.reset(task, max_turns=1) == task.question
    assert env.step("0").done


@pytest.mark.parametrize("episode_reward, expected", [("final", 0.01), ("best", 0.05)])
def test_episode_reward_is_the_final_or_the_best_score(episode_reward, expected):
    # Countdown scores a wrong arithmetic expression 0.05 and text that is none 0.01.
    source = make("countdown", max_turns=2, episode_reward=episode_reward)
    env = source.env_factory()
    env.reset(source.eval_tasks[0])
    _, reward, done, info = env.step(tagged("1 + 2"))
    assert (reward, done, info["score"]) == (0.0, False, 0.05)
    _, reward, done, info = env.step(tagged("no idea"))
    assert done and info["score"] == 0.01 and info["best_score"] == 0.05
    assert reward == expected and not info["solved"]


def test_a_scorer_that_raises_is_feedback():
    source = make("prime_factorization")  # its scorer raises on a non-number
    env = source.env_factory()
    env.reset(source.eval_tasks[0])
    observation, reward, done, info = env.step(tagged("nonsense"))
    assert reward == 0.0 and done and "could not be checked" in observation
    assert "ValueError" in info["error"]


def test_worker_kills_a_stalled_score_and_recovers_and_close_stops_it():
    source = envs.make("reasoning_gym", dataset="countdown", max_turns=2,
                       score_timeout_s=0.5, eval_size=2)
    task, env = source.eval_tasks[0], source.env_factory()
    env.reset(task)
    _, reward, done, info = env.step(tagged("9**9**9"))  # sympy never finishes
    assert (reward, done) == (0.0, False) and "longer than 0.5 s" in info["error"]
    _, reward, done, _ = env.step(tagged(task.answer))
    assert (reward, done) == (1.0, True)
    process = env.scorer._state["process"]  # pylint: disable=protected-access
    assert process.poll() is None
    source.close()
    assert process.poll() is not None
    source.close()


def test_splits_never_share_a_question_even_when_the_dataset_repeats_itself():
    source = make(dataset_options=SMALL_CHAIN_SUM, eval_size=20)
    test = make(dataset_options=SMALL_CHAIN_SUM, eval_size=20, eval_split="test")
    held_out = {t.question for t in source.eval_tasks}
    tested = {t.question for t in test.eval_tasks}
    trained = {t.question for g in range(20) for t in source.train_tasks(g)}
    assert len(held_out) == len(tested) == 20 and len(trained) > 40
    assert not held_out & trained and not tested & trained and not held_out & tested
    assert all(rg_env.question_split(t.question) == "eval" for t in source.eval_tasks)
    # The raw streams of two seeds do share questions: the partition is what separates.
    raw = [{e["question"] for e in rg_env._create(  # pylint: disable=protected-access
        "chain_sum", json.loads(SMALL_CHAIN_SUM), seed=s, size=60)} for s in (1, 2)]
    assert raw[0] & raw[1]


@pytest.mark.parametrize("dataset", ["countdown", "basic_arithmetic"])
def test_split_seeds_are_distinct_and_generation_tasks_a_function_of_seed(dataset):
    source, again, other = make(dataset), make(dataset), make(dataset, seed=1)
    questions = [t.question for t in source.train_tasks(5)]
    assert questions == [t.question for t in again.train_tasks(5)]
    assert questions != [t.question for t in source.train_tasks(6)]
    assert questions != [t.question for t in other.train_tasks(5)]
    assert [t.id for t in source.eval_tasks] == [t.id for t in again.eval_tasks]
    trained = {t.question for g in range(10) for t in source.train_tasks(g)}
    assert not trained & {t.question for t in source.eval_tasks}
    assert len({t.id for t in source.eval_tasks}) == 8
    assert rg_env.split_seed(0, "eval") != rg_env.split_seed(0, "test")


def test_composite_mixes_datasets_and_scores_each_with_its_own_scorer():
    specs = [{"name": "chain_sum"}, {"name": "basic_arithmetic", "weight": 2}]
    source = make("composite", dataset_options=json.dumps({"datasets": specs}))
    env = source.env_factory()
    for task in source.eval_tasks:
        env.reset(task)
        assert env.step(tagged(task.answer)).reward == 1.0


@pytest.mark.parametrize("options, message", [
    (dict(dataset="countdwn"), "dataset 'countdwn'; did you mean 'countdown'?"),
    (dict(dataset_options='{"max_numbrs": 4}'), "'max_numbrs'; did you mean 'max_numbers'?"),
    (dict(dataset_options='{"min_numbers": 1}'), "min_numbers must be greater than 1"),
    (dict(dataset_options='{"seed": 3}'), "'seed' is set by the run"),
    (dict(dataset_options="{max_numbers: 4}"), "dataset_options is not JSON"),
    (dict(dataset_options="[4]"), "dataset_options must be a JSON object"),
    (dict(dataset_options={"max_numbers": 4}), "dataset_options must be str"),
    (dict(max_turns=0), "max_turns must be >= 1"),
    (dict(episode_reward="mean"), "episode_reward must be one of ('final', 'best')"),
    (dict(score_timeout_s=-1.0), "score_timeout_s must be >= 0"),
    (dict(colour="red"), "unknown option 'colour'"),
])
def test_bad_options_are_named_before_any_task_is_made(options, message):
    with pytest.raises(ValueError) as error:
        envs.make("reasoning_gym", **options)
    assert message in str(error.value)


def test_missing_package_names_the_install_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)  # import now fails
    assert envs.default_options("reasoning_gym")["dataset"] == "countdown"
    with pytest.raises(ValueError, match=r'pip install -e "\.\[reasoning\]"'):
        envs.make("reasoning_gym")
