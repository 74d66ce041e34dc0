"""math_react: action parsing, the answer checker, episodes, containment and the data."""

import json
import os
import sys
import tempfile
import time
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentic_esopt import envs
from agentic_esopt.envs import base, math_data, math_react
from agentic_esopt.envs.math_data import MathTask
from agentic_esopt.envs.math_react import FinalAnswer, FormatError, ToolCall

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "sandbox"))
import test_sandbox  # noqa: E402  pylint: disable=wrong-import-position

IS_ROOT = os.geteuid() == 0
ANCHORS = os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "data",
                       "anchors", "trace2skill", "math_reasoning")
BASH = {"name": "bash", "arguments": {"command": "echo hi"}}
TASK = MathTask(id="t", question="What is 6 * 7?", answer="42")
PRINT_42 = 'Action: {"name": "bash", "arguments": {"command": "python3 -c \\"print(6*7)\\""}}'


def action(obj) -> str:
    return "Action: " + json.dumps(obj)


# ----------------------------------------------------------------------------- parsing


@pytest.mark.parametrize("text", [
    action(BASH),
    "I will compute it.\n" + action(BASH) + "\n",
    "Thought: list files.\nAction: ```json\n" + json.dumps(BASH) + "\n```",
    "Action:\n```\n" + json.dumps(BASH) + "\n```\nThen I will read the result.",
    action(BASH) + " and some trailing text } with braces",
    "Action: {'name': 'bash', 'arguments': {'command': 'echo hi'}}",
    'Action: {"name": "bash", "arguments": {"command": "echo hi"}',  # missing brace
    'Action: {"name": "bash", "arguments": {"command": "echo hi"',  # missing both
    'Action: {"name": "bash", "arguments": {"command": "echo hi',  # truncated string
    'Action: {"name": "bash", "command": "echo hi"}',  # flattened
    'Action: {"name": "bash", "arguments": "{\\"command\\": \\"echo hi\\"}"}',
    '**Action:** {"name": "Bash", "arguments": {"command": "echo hi"}}',
    'action: {"name":"bash","arguments":{"command":"echo hi"}}',
])
def test_every_bash_action_format_parses(text):
    assert math_react.parse_reply(text) == ToolCall("bash", {"command": "echo hi"})


def test_unescaped_inner_quotes_are_recovered():
    text = 'Action: {"name": "bash", "arguments": {"command": "python3 -c "print(6*7)""}}'
    assert math_react.parse_reply(text) == ToolCall("bash",
                                                    {"command": 'python3 -c "print(6*7)"'})


def test_python_tool_and_unknown_tools_parse():
    assert math_react.parse_reply(action({"name": "python", "arguments": {"code": "print(1)"}})
                                  ) == ToolCall("python", {"code": "print(1)"})
    assert math_react.parse_reply(action({"name": "calculator", "arguments": {"x": 1}})
                                  ) == ToolCall("calculator", {"x": 1})


@pytest.mark.parametrize("text, boxed", [
    ("Final answer: \\boxed{42}", "42"),
    ("So the result is 7.\nFinal answer: \\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
    ("\\boxed{1} no wait. Final Answer: \\boxed{2}", "2"),
    ("The answer is \\boxed{1,234}.", "1,234"),
    ("Final answer: \\boxed{x^{2}", "x^{2}"),  # unclosed: the rest of the text
])
def test_final_answers_take_the_last_box(text, boxed):
    assert math_react.parse_reply(text) == FinalAnswer(boxed)


def test_an_action_before_the_final_answer_wins_and_after_it_does_not():
    assert isinstance(math_react.parse_reply(action(BASH) + "\nFinal answer: \\boxed{3}"),
                      ToolCall)
    assert math_react.parse_reply("Final answer: \\boxed{3}\n" + action(BASH)) == \
        FinalAnswer("3")


@pytest.mark.parametrize("text, reason", [
    ("", "no tool call and no final answer"),
    ("I think the answer is 42.", "no tool call and no final answer"),
    ("Final answer: 42", "\\boxed"),
    ("Action: run python please", "must be followed by a JSON object"),
    ("Action: {{{{", "could not be read"),
    ('Action: {"arguments": {"command": "ls"}}', 'no "name"'),
    ('Action: {"name": "bash", "arguments": [1, 2]}', '"arguments" must be'),
])
def test_malformed_replies_become_feedback(text, reason):
    parsed = math_react.parse_reply(text)
    assert isinstance(parsed, FormatError) and reason in parsed.reason, parsed


_PIECES = st.sampled_from(["Action:", "action :", "Final answer:", "\\boxed{", "{", "}", '"',
                           "'", "```json", "```", '"name"', ": ", '"bash"', '"arguments"',
                           '"command"', '"code"', "\\", "\n", ",", "[", "]", "None", "1e9",
                           "\x00", "é", "\\frac{1}{2}", "Observation:"])


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(st.text(max_size=300), st.lists(_PIECES | st.text(max_size=5),
                                                 max_size=40).map("".join)))
def test_parser_never_raises(text):
    parsed = math_react.parse_reply(text)
    assert isinstance(parsed, (ToolCall, FinalAnswer, FormatError))
    if isinstance(parsed, ToolCall):
        assert isinstance(parsed.name, str) and isinstance(parsed.arguments, dict)


def test_parser_survives_deep_nesting_and_huge_replies():
    start = time.monotonic()
    for text in ("Action: {" + '"command": "x' * 20_000,
                 'Action: {"name": "bash", ' + '"command": "' * 30_000 + "y" * 50_000,
                 "Action: " + "{" * 100_000, "Action: " + "[" * 5000 + "{",
                 "Action: {\"name\": \"bash\", \"arguments\": {\"command\": \"" + "x" * 10**6,
                 "\\boxed{" * 10_000, "Final answer: " + "\\boxed{{" * 1000):
        assert isinstance(math_react.parse_reply(text), (ToolCall, FinalAnswer, FormatError))
    assert time.monotonic() - start < 10


# ----------------------------------------------------------------------------- reward


@pytest.mark.parametrize("predicted, expected", [
    ("42", "42"), ("42.0", "42"), ("$42$", "42"), ("42.", "42"),
    ("1,234", "1234"), ("1{,}234", "1234"), ("1234", "1,234"),
    ("\\frac{1}{2}", "1/2"), ("\\dfrac{1}{2}", "\\frac{1}{2}"), ("0.5", "1/2"),
    ("-\\frac{3}{4}", "-3/4"), ("\\frac{-3}{4}", "-0.75"),
    ("1/3", "0.333333333333"), ("\\text{42}", "42"), ("2^{10}", "1024"),
    ("\\sqrt{2}", "2^{1/2}"), ("3\\pi", "3 \\pi"),
    ("50236736039969153591797497473754441364", "50236736039969153591797497473754441364"),
])
def test_equivalent_answers_match(predicted, expected):
    assert math_react.answers_match(predicted, expected)


@pytest.mark.parametrize("predicted, expected", [
    ("43", "42"), ("", "42"), ("   ", "42"), ("x", "42"), ("42.0000001", "42"),
    ("1/2", "1/3"), ("12345678901234567890", "12345678901234567891"), ("4,2", "42"),
    ("-42", "42"), ("\\frac{1}{0}", "1"), ("1e400", "1"), ("\\boxed{}", "0"),
])
def test_wrong_answers_do_not_match(predicted, expected):
    assert not math_react.answers_match(predicted, expected)


def test_exact_match_fallback_works_without_math_verify(monkeypatch):
    monkeypatch.setattr(math_react, "_math_verify", lambda: None)
    assert math_react.answers_match("1,234", "1234")
    assert math_react.answers_match("\\frac{1}{2}", "0.5")
    assert not math_react.answers_match("2^{10}", "1024")  # needs math-verify


def test_checker_works_off_the_main_thread():
    import concurrent.futures  # pylint: disable=import-outside-toplevel
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda pair: math_react.answers_match(*pair),
                                [("\\frac{1}{2}", "0.5"), ("2^{10}", "1024"), ("3", "4")]))
    assert results == [True, True, False]


def test_cut_middle_keeps_both_ends_within_the_limit():
    text = "HEAD" + "x" * 10_000 + "TAIL"
    cut = math_react.cut_middle(text, 6000)
    assert len(cut) <= 6000 and cut.startswith("HEAD") and cut.endswith("TAIL")
    assert "characters cut" in cut
    assert math_react.cut_middle("short", 6000) == "short"


# ----------------------------------------------------------------------------- episodes


def make_env(**kwargs):
    kwargs.setdefault("limits", math_react.ToolLimits(timeout_s=5))
    return math_react.MathReactEnv(**kwargs)


def test_scripted_agent_that_computes_then_boxes_gets_reward_1():
    env = make_env()
    first = env.reset(TASK)
    assert "What is 6 * 7?" in first and "at least once" in first
    obs, reward, done, info = env.step("Let me compute.\n" + PRINT_42)
    assert obs == "Observation from bash:\n42\n[exit_code] 0"
    assert (reward, done, info["tool_calls"]) == (0.0, False, 1)
    obs, reward, done, info = env.step("Final answer: \\boxed{42}")
    assert (reward, done, info["solved"]) == (1.0, True, True)
    json.dumps(info)


def test_boxing_without_the_tool_gets_0_and_a_wrong_answer_gets_0():
    env = make_env()
    env.reset(TASK)
    _, reward, done, info = env.step("Final answer: \\boxed{42}")
    assert (reward, done, info["solved"]) == (0.0, True, False)
    assert info["reason"] == "the tool was never used"
    env.reset(TASK)
    env.step(PRINT_42)
    _, reward, done, info = env.step("Final answer: \\boxed{41}")
    assert (reward, done, info["reason"]) == (0.0, True, "wrong answer")


def test_python_tool_stderr_exit_code_and_files_persist_within_an_episode():
    env = make_env()
    env.reset(TASK)
    obs = env.step(action({"name": "python", "arguments": {
        "code": "import sys\nopen('n.txt', 'w').write('7')\nprint('out'); "
                "print('bad', file=sys.stderr); sys.exit(3)"}})).observation
    assert obs == "Observation from python:\nout\n[stderr]\nbad\n[exit_code] 3"
    obs = env.step(action({"name": "bash", "arguments": {"command": "cat n.txt"}})).observation
    assert obs == "Observation from bash:\n7\n[exit_code] 0"
    env.close()


@pytest.mark.parametrize("reply, expected", [
    ("no idea", "Format warning: no tool call"),
    (action({"name": "wolfram", "arguments": {"q": "6*7"}}), "Error: unknown tool 'wolfram'"),
    (action({"name": "bash", "arguments": {"cmd2": "ls"}}), 'Error: bash needs "arguments"'),
    (action({"name": "bash", "arguments": {"command": ""}}), "Error: bash needs"),
])
def test_bad_replies_are_observations_and_the_episode_goes_on(reply, expected):
    env = make_env()
    env.reset(TASK)
    obs, reward, done, info = env.step(reply)
    assert obs.startswith(expected) and (reward, done) == (0.0, False)
    assert info["tool_calls"] == 0
    assert env.step(PRINT_42).observation.endswith("42\n[exit_code] 0")


def test_long_output_is_cut_keeping_both_ends():
    env = make_env()
    env.reset(TASK)
    obs = env.step(action({"name": "python", "arguments": {
        "code": "print('FIRST'); print('y' * 50000); print('LAST')"}})).observation
    assert len(obs) <= 6000 and obs.startswith("Observation from python:\nFIRST")
    assert obs.endswith("LAST\n[exit_code] 0") and "characters cut" in obs


def test_turn_limit_ends_the_episode_with_reward_0():
    env = make_env(max_turns=50)
    env.reset(TASK, max_turns=2)
    assert not env.step("hmm").done
    obs, reward, done, info = env.step(PRINT_42)
    assert done and reward == 0.0 and info["reason"] == "turn limit" and not info["solved"]
    with pytest.raises(RuntimeError):
        env.step("Final answer: \\boxed{42}")


def test_close_removes_the_working_directory():
    env = make_env()
    env.reset(TASK)
    env.step(PRINT_42)
    path = env._workspace.path  # pylint: disable=protected-access
    assert os.path.isdir(path)
    env.close()
    assert not os.path.exists(os.path.dirname(path))
    env.close()  # idempotent


def test_episodes_have_separate_working_directories():
    one, two = make_env(), make_env()
    one.reset(TASK)
    two.reset(TASK)
    one.step(action({"name": "bash", "arguments": {"command": "echo secret > mine.txt"}}))
    obs = two.step(action({"name": "bash", "arguments": {"command": "cat mine.txt"}}))
    assert "No such file" in obs.observation and "[exit_code] 1" in obs.observation
    one.close()
    two.close()


# ----------------------------------------------------------------------------- containment

HOSTILE_COMMANDS = {
    "fork_bomb": ":(){ :|:& };:",
    "python_fork_bomb": "python3 -c 'import os\nwhile True: os.fork()'",
    "memory_bomb": "python3 -c 'x = bytearray(8 << 30)'",
    "infinite_loop": "while true; do :; done",
    "sleep_forever_in_background": "nohup sleep 1000 > /dev/null 2>&1 & setsid sleep 1001 &",
    "flood": "yes",
    "flood_stderr": "yes >&2",
    "kill_parent": "kill -9 $PPID; kill -9 -1; pkill -9 python",
    "socket": "python3 -c \"import socket; socket.create_connection(('1.1.1.1', 80), 1)\"",
    "huge_file": "head -c 100000000 /dev/zero > big.bin; ls -la big.bin",
}


@pytest.mark.parametrize("name", sorted(HOSTILE_COMMANDS) + [f"py:{n}" for n in
                                                             sorted(test_sandbox.HOSTILE)])
def test_hostile_commands_are_contained_and_the_episode_goes_on(name):
    if name.startswith("py:"):  # the sandbox's hostile candidates, run by python3
        source = test_sandbox.HOSTILE[name[3:]][0] + "\nscore([1.0, 2.0])\n"
        reply = action({"name": "python", "arguments": {"code": source}})
    else:
        reply = action({"name": "bash", "arguments": {"command": HOSTILE_COMMANDS[name]}})
    env = make_env(limits=math_react.ToolLimits(timeout_s=2, memory_mb=512))
    env.reset(TASK)
    start = time.monotonic()
    obs, reward, done, _ = env.step(reply)
    assert time.monotonic() - start < 15
    assert obs.startswith("Observation from ") and "[exit_code]" in obs
    assert len(obs) <= 6000 and (reward, done) == (0.0, False)
    assert env.step(PRINT_42).observation.endswith("42\n[exit_code] 0")
    assert env.step("Final answer: \\boxed{42}").reward == 1.0


def _processes_running(needle: bytes) -> list[str]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as file:
                found += [pid] if needle in file.read() else []
        except OSError:
            continue
    return found


def test_background_processes_do_not_outlive_the_command():
    env = make_env()
    env.reset(TASK)
    env.step(action({"name": "bash", "arguments": {
        "command": "(setsid sleep 271.828 &); nohup sleep 271.828 >/dev/null 2>&1 &"}}))
    time.sleep(0.2)
    assert not _processes_running(b"271.828")
    env.close()


@pytest.mark.skipif(not IS_ROOT, reason="writes elsewhere are blocked by the uid drop (root)")
def test_writes_outside_the_working_directory_leave_no_file():
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    targets = [os.path.join(tempfile.gettempdir(), f"pwned_{uuid.uuid4().hex}"),
               os.path.join("/dev/shm", f"pwned_{uuid.uuid4().hex}"),
               os.path.join("/var/tmp", f"pwned_{uuid.uuid4().hex}"),
               os.path.join(repo, f"pwned_{uuid.uuid4().hex}")]
    env = make_env()
    env.reset(TASK)
    command = "; ".join(f"echo x > {t}; mkdir {t}.d; mkfifo {t}.f" for t in targets)
    obs = env.step(action({"name": "bash", "arguments": {"command": command}})).observation
    assert "Permission denied" in obs  # the repository is not writable
    for target in targets:
        for path in (target, target + ".d", target + ".f"):
            assert not os.path.lexists(path), path
    obs = env.step(action({"name": "bash", "arguments": {"command": "id -u"}})).observation
    assert int(obs.splitlines()[1]) != 0
    env.close()


def test_no_network():
    env = make_env()
    env.reset(TASK)
    obs = env.step(action({"name": "python", "arguments": {"code": (
        "import socket\ntry:\n    socket.create_connection(('127.0.0.1', 9), 1)\n"
        "except OSError as e:\n    print('blocked', e)")}})).observation
    assert "blocked" in obs and ("unreachable" in obs or "refused" not in obs)
    env.close()


# ----------------------------------------------------------------------------- data & source


def test_make_returns_tasks_with_question_and_answer_and_the_contract_episode():
    source = envs.make("math_react", seed=0, tasks_per_generation=4, eval_size=8)
    assert source.stop == ("Observation:",)
    assert "Action:" in source.system_prompt and "\\boxed" in source.system_prompt
    task = source.eval_tasks[0]
    assert task.question and task.answer
    env = source.env_factory()
    env.reset(task)
    obs = env.step(PRINT_42).observation
    assert "42" in obs
    _, reward, done, _ = env.step(f"Final answer: \\boxed{{{task.answer}}}")
    assert done and reward == 1.0
    env.reset(task)
    env.step(PRINT_42)
    assert env.step("Final answer: \\boxed{-1}").reward == 0.0


@pytest.mark.parametrize("difficulty", math_data.DIFFICULTIES)
def test_generated_splits_are_disjoint_and_deterministic(difficulty):
    source = envs.make("math_react", seed=3, tasks_per_generation=16, eval_size=64,
                       difficulty=difficulty)
    again = envs.make("math_react", seed=3, tasks_per_generation=16, eval_size=64,
                      difficulty=difficulty)
    assert source.train_tasks(5) == again.train_tasks(5)
    assert source.eval_tasks == again.eval_tasks
    train = {t.question for g in range(20) for t in source.train_tasks(g)}
    test = envs.make("math_react", eval_split="test", eval_size=64, difficulty=difficulty)
    held = {t.question for t in source.eval_tasks} | {t.question for t in test.eval_tasks}
    assert not train & held
    assert not {t.question for t in source.eval_tasks} & {t.question for t in test.eval_tasks}
    assert len({t.family for t in source.eval_tasks}) == len(math_data.FAMILIES[difficulty])
    assert source.train_tasks(0) != source.train_tasks(1)


def test_generated_answers_are_right():
    for task in math_data.generate_problems(40, 0, "eval"):
        if task.family == "modpow":
            a, b, m = (int(x) for x in __import__("re").findall(r"\d+", task.question))
            assert task.answer == str(pow(a, b, m))
        assert task.answer and task.answer == task.answer.strip()
    easy = math_data.generate_problems(20, 0, "eval", "easy")
    for task in easy:
        expression = task.question.removeprefix("What is ").removesuffix("?")
        assert str(eval(expression)) == task.answer  # pylint: disable=eval-used


def test_jsonl_data_is_split_deterministically_and_disjointly(tmp_path):
    path = tmp_path / "p.jsonl"
    rows = [{"id": f"q{i}", "question": f"What is {i} + 1?", "answer": str(i + 1), "x": 0}
            for i in range(200)]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    source = envs.make("math_react", data=str(path), eval_size=100)
    test = envs.make("math_react", data=str(path), eval_split="test", eval_size=100)
    train = {t.id for g in range(50) for t in source.train_tasks(g)}
    evals, tests = {t.id for t in source.eval_tasks}, {t.id for t in test.eval_tasks}
    assert not train & evals and not train & tests and not evals & tests
    assert 20 <= len(evals) <= 60 and 20 <= len(tests) <= 60
    assert source.train_tasks(1) == envs.make("math_react", data=str(path)).train_tasks(1)
    task = source.eval_tasks[0]
    env = source.env_factory()
    env.reset(task)
    env.step(PRINT_42)
    assert env.step(f"Final answer: \\boxed{{{task.answer}}}").reward == 1.0


def test_eval_data_file_is_held_out(tmp_path):
    train, held = tmp_path / "train.jsonl", tmp_path / "held.jsonl"
    train.write_text("".join(json.dumps({"id": f"a{i}", "question": f"Q{i}", "answer": "1"})
                             + "\n" for i in range(10)))
    held.write_text("".join(json.dumps({"id": f"b{i}", "question": f"Q{i}", "answer": "1"})
                            + "\n" for i in range(8, 12)))
    source = envs.make("math_react", data=str(train), eval_data=str(held), eval_size=3,
                       tasks_per_generation=8)
    assert [t.id for t in source.eval_tasks] == ["b8", "b9", "b10"]
    assert {t.question for t in source.train_tasks(0)} == {f"Q{i}" for i in range(8)}


@pytest.mark.skipif(not os.path.isdir(ANCHORS), reason="anchor data not present")
def test_anchor_files_load_through_the_option_without_dapo_instructions():
    source = envs.make("math_react", data=os.path.join(ANCHORS, "dapo_evolve.jsonl"),
                       eval_data=os.path.join(ANCHORS, "dapo_test.jsonl"),
                       tasks_per_generation=16, eval_size=100)
    assert len(source.eval_tasks) == 100
    for task in source.train_tasks(0) + list(source.eval_tasks):
        assert "Answer:" not in task.question and task.question and task.answer
    aime = envs.make("math_react", data=os.path.join(ANCHORS, "aime_2026.jsonl"),
                     tasks_per_generation=4)
    assert 1 <= len(aime.eval_tasks) < 30


def test_bad_jsonl_names_the_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"id": "a", "question": "q", "answer": "1"}\n{"id": "b"}\n')
    with pytest.raises(ValueError, match="bad.jsonl:2"):
        math_data.load_jsonl(path)


@pytest.mark.parametrize("options, message", [
    (dict(max_turns=0), "max_turns must be >= 1, got 0"),
    (dict(difficulty="hard"), "difficulty must be one of"),
    (dict(families=("modpow", "nope")), "families ['nope']"),
    (dict(data="/no/such.jsonl"), "is not a file"),
    (dict(heldout_fraction=0.5), "heldout_fraction"),
    (dict(tool_timeout_s=0.0), "tool_timeout_s"),
])
def test_option_problems_are_reported(options, message):
    with pytest.raises(ValueError) as error:
        envs.make("math_react", **options)
    assert message in str(error.value)


def test_families_option_restricts_the_problems():
    source = envs.make("math_react", families=("modpow",), eval_size=5)
    assert {t.family for t in source.eval_tasks} == {"modpow"}
    assert envs.registry.default_options("math_react")["max_turns"] == 50
    assert isinstance(source, base.TaskSource)


def test_command_hint_shows_a_call_that_solves_easy_problems():
    source = envs.make("math_react", difficulty="easy", hint="command", eval_size=8)
    for task in source.eval_tasks:
        env = source.env_factory()
        first = env.reset(task)
        hinted = next(line for line in first.splitlines() if line.startswith("Action:"))
        assert math_react.parse_reply(hinted) == ToolCall(
            "bash", {"command": f'python3 -c "print({task.expression})"'})
        obs = env.step(hinted).observation
        number = obs.splitlines()[1]
        assert env.step(f"Final answer: \\boxed{{{number}}}").reward == 1.0
    standard = envs.make("math_react", hint="command", eval_size=1)
    first = standard.env_factory().reset(standard.eval_tasks[0])
    assert "to compute 12 * 34" in first
    plain = envs.make("math_react", eval_size=1)
    assert "Action:" not in plain.env_factory().reset(plain.eval_tasks[0])
    with pytest.raises(ValueError, match="hint must be one of"):
        envs.make("math_react", hint="yes")


@pytest.mark.parametrize("text, expected", [
    ("```python\nprint(6 * 7)\n```", ToolCall("python", {"code": "print(6 * 7)"})),
    ("Here is the code:\n\n```py\nx = 6\nprint(x * 7)", ToolCall("python",
                                                                 {"code": "x = 6\nprint(x * 7)"})),
    ("```\nprint(1)\n```\nOutput: 1", ToolCall("python", {"code": "print(1)"})),
    ("```bash\necho hi\n```", ToolCall("bash", {"command": "echo hi"})),
    (action(BASH), ToolCall("bash", {"command": "echo hi"})),
    ("Final answer: \\boxed{\\frac{1}{2}}", FinalAnswer("\\frac{1}{2}")),
    ("Final answer: 408", FinalAnswer("408")),
    ("The final answer is 43.\n[exit_code] 0", FinalAnswer("43")),
    ("So 7190 + 4521 is equal to 11,711.", FinalAnswer("11,711")),
    ("The answer: -3/4", FinalAnswer("-3/4")),
])
def test_code_protocol_reads_code_blocks_and_lenient_answers(text, expected):
    assert math_react.parse_code_reply(text) == expected


@pytest.mark.parametrize("text", ["I am not sure.", "```python\n\n```", "", None])
def test_code_protocol_replies_without_code_or_number_are_feedback(text):
    assert isinstance(math_react.parse_code_reply(text), FormatError)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_PIECES | st.sampled_from(["```python\n", "```bash\n", "42", "answer is"])
                | st.text(max_size=5), max_size=40).map("".join))
def test_code_protocol_parser_never_raises(text):
    assert isinstance(math_react.parse_code_reply(text), (ToolCall, FinalAnswer, FormatError))


def test_code_protocol_episode_asks_for_the_answer_and_keeps_the_reward_rules():
    source = envs.make("math_react", difficulty="easy", hint="command", protocol="code",
                       eval_size=4)
    assert source.system_prompt == math_react.CODE_SYSTEM_PROMPT
    assert source.stop == ("Observation:", "\n```\n")
    for task in source.eval_tasks:
        env = source.env_factory()
        first = env.reset(task)
        assert first.endswith(f"```python\nprint({task.expression})\n```")
        obs = env.step(first[first.index("```"):]).observation
        assert obs == (f"Observation from python:\n{task.answer}\n[exit_code] 0"
                       + math_react.CODE_ANSWER_REQUEST)
        assert env.step(f"The answer is {task.answer}.").reward == 1.0
    env = source.env_factory()
    env.reset(source.eval_tasks[0])
    result = env.step(f"It is {source.eval_tasks[0].answer}.")  # no tool call first
    assert (result.reward, result.done, result.info["reason"]) == (
        0.0, True, "the tool was never used")
    with pytest.raises(ValueError, match="protocol must be one of"):
        envs.make("math_react", protocol="json")


def test_timeouts_and_floods_are_reported_in_the_observation():
    env = make_env(limits=math_react.ToolLimits(timeout_s=1, max_output_bytes=1 << 16))
    env.reset(TASK)
    start = time.monotonic()
    obs = env.step(action({"name": "bash", "arguments": {"command": "echo start; sleep 30"}}))
    assert time.monotonic() - start < 5
    assert obs.observation.startswith("Observation from bash:\nstart\n[timeout] killed after")
    assert obs.observation.endswith("[exit_code] -9")
    obs = env.step(action({"name": "bash", "arguments": {"command": "seq 1 1000000"}}))
    assert obs.observation.startswith("Observation from bash:\n1\n2\n3\n")
    assert "[output] too much output" in obs.observation and len(obs.observation) <= 6000
    env.close()


def test_rollout_engine_plays_math_react_and_closes_every_episode():
    from agentic_esopt.agents import rollout  # pylint: disable=import-outside-toplevel
    source = envs.make("math_react", difficulty="easy", eval_size=3)

    def policy(conversations, members, task_indices):
        replies = []
        for conversation in conversations:
            last = conversation[-1]["content"]
            if last.startswith("Observation from python:"):
                replies.append(f"Final answer: \\boxed{{{last.splitlines()[1]}}}")
            else:
                expression = last.split("What is ")[1].split("?")[0]
                replies.append(action({"name": "python",
                                       "arguments": {"code": f"print({expression})"}}))
        return replies

    before = {n for n in os.listdir(tempfile.gettempdir()) if n.startswith("math_react_")}
    trajectories = rollout.run_episodes(source.env_factory, source.eval_tasks, policy, [0, 1],
                                        system_prompt=source.system_prompt)
    assert [t.solved for t in trajectories] == [True] * 6
    assert all(t.num_turns == 2 and t.total_reward == 1.0 for t in trajectories)
    after = {n for n in os.listdir(tempfile.gettempdir()) if n.startswith("math_react_")}
    assert after <= before


def test_filling_the_disk_is_stopped_and_the_directory_emptied():
    env = make_env(limits=math_react.ToolLimits(timeout_s=10, max_disk_mb=20))
    env.reset(TASK)
    env.step(action({"name": "bash", "arguments": {"command": "echo keep > small.txt"}}))
    start = time.monotonic()
    obs = env.step(action({"name": "bash", "arguments": {
        "command": "for i in $(seq 1 100000); do head -c 8000000 /dev/zero > f$i; done"}}))
    assert time.monotonic() - start < 8
    assert "[disk] the working directory grew too large" in obs.observation
    assert os.listdir(env._workspace.path) == []  # pylint: disable=protected-access
    assert env.step(PRINT_42).observation.endswith("42\n[exit_code] 0")
    env.close()


@pytest.mark.skipif(not IS_ROOT, reason="the shared temporary directories are watched by uid")
def test_filling_dev_shm_is_stopped():
    env = make_env(limits=math_react.ToolLimits(timeout_s=10, max_disk_mb=20))
    env.reset(TASK)
    start = time.monotonic()
    obs = env.step(action({"name": "bash", "arguments": {"command": (
        "d=$(mktemp -d -p /dev/shm); for i in $(seq 1 100000); do "
        "head -c 8000000 /dev/zero > $d/f$i; done")}}))
    assert time.monotonic() - start < 8
    assert "[disk]" in obs.observation
    env.close()
