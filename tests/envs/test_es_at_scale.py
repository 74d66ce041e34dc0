"""ES at Scale's Countdown prompt and reward (``envs.es_at_scale``), and the reasoning_gym
env's ``prompt_style="es_at_scale"`` and ``train_pool``.

Expected values are theirs: github.com/VsonicV/es-fine-tuning-paper,
``countdown/data/countdown.json`` entry 0 (the prompt) and ``countdown/countdown_task.py``
(format reward 1.0 / 0.1 think + 0.5 answer, scored on "<think>" + completion; total
0.1 * format + answer).
"""

import json

import pytest

from agentic_esopt import envs
from agentic_esopt.envs import es_at_scale

# countdown.json entry 0: numbers [44, 19, 35], target "98", its "context" field.
THEIR_CONTEXT = (
    "You are a helpful assistant. You first think about the reasoning process in your mind "
    "and then provide the user with the answer.Using the numbers [44 19 35], create an "
    "equation that equals 98. You can use basic arithmetic operations (+, -, *, /) and each "
    "number can only be used once. Show your work in <think> </think> tags. And return the "
    "final answer in <answer> </answer> tags, for example <answer> (1 + 2) / 3 </answer>."
    "Let me solve this step by step.\n<think>")
NUMBERS, TARGET = [44, 19, 35], 98


def test_prompt_is_their_context_field():
    prompt = es_at_scale.SYSTEM + es_at_scale.user_text(NUMBERS, TARGET)
    assert prompt + es_at_scale.REPLY_PREFIX == THEIR_CONTEXT


@pytest.mark.parametrize("completion, fmt", [
    (" 44 + 19 = 63 </think>\n<answer>44 + 19 + 35</answer>", 1.0),
    (" sum them </think>\n<answer>44 + 19 + 35</answer>\n", 1.0),  # Python's $
    (" sum them </think>\n<answer>44 + 19 + 35</answer> done", 0.6),
    (" sum them </think> <answer>44 + 19 + 35</answer>", 0.6),  # no newline between
    (" sum them </think>\nThe answer is 98.", 0.1),
    (" no closing tag <answer>1</answer>", 0.5),
    (" nothing", 0.0),
    ("", 0.0),
])
def test_format_reward_of_good_and_bad_replies(completion, fmt):
    reply = es_at_scale.REPLY_PREFIX + completion
    assert es_at_scale.format_reward(es_at_scale.thought_text(reply)) == pytest.approx(fmt)
    # Without the prefix the completion is scored as if the prompt had opened <think>.
    assert es_at_scale.thought_text(completion) == "<think>" + completion


@pytest.mark.parametrize("answer, reward", [
    ("44 + 19 + 35", 1.0),
    ("(44 + 19) + 35", 1.0),
    (" 35+19+44 ", 1.0),
    ("44 + 19 - 35", 0.0),            # wrong value
    ("44 + 19 + 35 + 0", 0.0),        # a number that is not the puzzle's
    ("44 + 54", 0.0),                 # 19 + 35 folded: numbers not used as given
    ("44 + 19 + 35 = 98", 0.0),       # "=" is not allowed
    ("44 + 19 +", 0.0),               # not an expression
    ("44 / (19 - 19) + 35", 0.0),     # a repeated number, and a division by zero
    ("", 0.0),
    (None, 0.0),
])
def test_answer_reward(answer, reward):
    assert es_at_scale.answer_reward(answer, NUMBERS, TARGET) == reward


def test_answer_reward_follows_python_arithmetic_but_refuses_powers():
    assert es_at_scale.answer_reward("(2 * 3) / 4", [2, 3, 4], 1.5) == 1.0
    assert es_at_scale.answer_reward("7 // 2 - -1", [7, 2, 1], 4) == 1.0
    assert es_at_scale.answer_reward("9 / 0 + 9", [9, 0, 9], 9) == 0.0
    assert es_at_scale.answer_reward("9**9**9", [9, 9, 9], 9) == 0.0  # returns at once


def test_reward_is_a_tenth_of_the_format_plus_the_answer_of_the_last_tag():
    good = es_at_scale.REPLY_PREFIX + " add </think>\n<answer>44 + 19 + 35</answer>"
    assert es_at_scale.reward(good, NUMBERS, TARGET) == pytest.approx((1.1, 1.0, 1.0))
    second = (es_at_scale.REPLY_PREFIX + " <answer>44 + 19 + 35</answer> no: "
              "<answer>44 - 19 + 35</answer>")
    assert es_at_scale.reward(second, NUMBERS, TARGET) == pytest.approx((0.05, 0.5, 0.0))


COUNTDOWN_3_4 = json.dumps(dict(min_numbers=3, max_numbers=4, max_value=99, min_target=1,
                                max_target=100))


def make(**options):
    return envs.make("reasoning_gym", **{"dataset": "countdown", "eval_size": 4,
                                         "dataset_options": COUNTDOWN_3_4,
                                         "prompt_style": "es_at_scale", **options})


def test_env_plays_their_prompt_and_reward():
    source = make()
    assert (source.system_prompt, source.stop) == (es_at_scale.SYSTEM, ())
    task, env = source.eval_tasks[0], source.env_factory()
    numbers = task.entry["metadata"]["numbers"]
    observation = env.reset(task)
    assert observation == es_at_scale.user_text(numbers, task.entry["metadata"]["target"])
    assert "[" + " ".join(map(str, numbers)) + "]" in observation
    reply = es_at_scale.REPLY_PREFIX + f" done </think>\n<answer>{task.answer}</answer>"
    _, reward, done, info = env.step(reply)
    assert (reward, done, info["solved"]) == (pytest.approx(1.1), True, True)
    assert (info["format_reward"], info["answer_reward"], info["answer"]) == (
        1.0, 1.0, task.answer)
    assert json.dumps(info)
    env.reset(task)
    _, reward, done, info = env.step(es_at_scale.REPLY_PREFIX + " I give up.")
    assert (reward, done, info["solved"], info["answer"]) == (0.0, True, False, None)
    with pytest.raises(RuntimeError, match="not reset or has ended"):
        env.step("again")


def test_train_pool_plays_one_fixed_set():
    pooled = make(train_pool=6, tasks_per_generation=6)
    first = {t.id for t in pooled.train_tasks(0)}
    assert len(first) == 6 and all({t.id for t in pooled.train_tasks(g)} == first
                                   for g in range(1, 4))
    subset = make(train_pool=6, tasks_per_generation=3)
    draws = [[t.id for t in subset.train_tasks(g)] for g in range(6)]
    assert all(set(d) <= first for d in draws) and len({tuple(d) for d in draws}) > 1
    fresh = make(tasks_per_generation=6)
    assert {t.id for t in fresh.train_tasks(0)} != {t.id for t in fresh.train_tasks(1)}
    with pytest.raises(ValueError, match="train_pool .2. must hold at least"):
        make(train_pool=2, tasks_per_generation=3)


@pytest.mark.parametrize("options, message", [
    (dict(dataset="chain_sum", dataset_options="{}"), "dataset must be 'countdown'"),
    (dict(max_turns=2), "max_turns must be 1"),
    (dict(prompt_style="tinyzero"), "prompt_style must be one of"),
    (dict(train_pool=-1), "train_pool must be >= 0"),
])
def test_bad_es_at_scale_options_are_named(options, message):
    with pytest.raises(ValueError, match=message):
        make(**options)
