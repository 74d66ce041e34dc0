"""MiniWoB++ in a real Chromium (the web extra and Debian's chromium, as CI installs them).

Scripted agents solve pages through the text interface; hostile replies are feedback;
parallel episodes are isolated; no browser process outlives a pool, an exception or the
death of its parent.
"""

import os
import re
import subprocess
import sys
import textwrap
import threading

import hypothesis
import hypothesis.strategies as st
import pytest

from agentic_esopt import envs
from agentic_esopt.agents import rollout
from agentic_esopt.envs import miniwob
from agentic_esopt.envs.web import actions
from agentic_esopt.envs.web.env import WebEnv, WebTask
from agentic_esopt.envs.web.pool import BrowserPool, descendants, wait_gone


@pytest.fixture(scope="module")
def pool():
    with BrowserPool(2) as shared:
        yield shared


def task(name, seed=0):
    return WebTask(f"{name}-s{seed}", "miniwob", name, seed)


def bid_of(observation, role, name=None):
    """The id of the first element with ``role`` (and accessible ``name``)."""
    label = "" if name is None else f" '{re.escape(name)}"
    return re.search(rf"\[(\w+)\] {role}{label}", observation).group(1)


def quoted(goal):
    return re.findall(r'"([^"]*)"', goal)


def goal_of(observation):
    return observation.splitlines()[0].removeprefix("Goal: ")


def enter_text(observation, turn):
    if turn == 0:
        return f"fill('{bid_of(observation, 'textbox')}', '{quoted(goal_of(observation))[0]}')"
    return f"click('{bid_of(observation, 'button', 'Submit')}')"


def login_user(observation, turn):
    username, password = quoted(goal_of(observation))
    boxes = re.findall(r"\[(\w+)\] textbox", observation)
    return [f"fill('{boxes[0]}', '{username}')", f"fill('{boxes[1]}', '{password}')",
            f"click('{bid_of(observation, 'button', 'Login')}')"][turn]


def use_autocomplete(observation, turn):
    start, *end = quoted(goal_of(observation))
    if turn < len(start):
        return f"press('{bid_of(observation, 'textbox')}', '{start[turn]}')"
    if turn == len(start):
        return "noop(500)"  # the menu opens after a short delay
    items = re.findall(r"\[(\w+)\] generic\n\s*StaticText '([^']*)'", observation)
    matching = [b for b, text in items if text.startswith(start) and text.endswith("".join(end))]
    if turn == len(start) + 1:
        return f"click('{matching[0]}')"
    return f"click('{bid_of(observation, 'button', 'Submit')}')"


def search_engine(observation, turn):
    """Results come 3 a page behind links to '#' (stock BrowserGym fails on the fragment)."""
    goal = goal_of(observation)
    rank = int(re.search(r"(\d+)(?:st|nd|rd|th) search result", goal).group(1))
    page = (rank - 1) // 3 + 1
    if turn == 0:
        return f"fill('{bid_of(observation, 'textbox')}', '{quoted(goal)[0]}')"
    if turn == 1:
        return f"click('{bid_of(observation, 'button', 'Search')}')"
    if turn == 2 and page > 1:
        return f"click('{bid_of(observation, 'link', str(page))}')"
    results = [b for b, name in re.findall(r"\[(\w+)\] link '([^']*)'", observation)
               if not name.isdigit() and name not in ("<", ">")]
    return f"click('{results[(rank - 1) % 3]}')"


def play(env, episode_task, agent, max_turns=10):
    observation = env.reset(episode_task, max_turns=max_turns)
    for turn in range(max_turns):
        observation, reward, done, info = env.step(agent(observation, turn))
        if done:
            return reward, info
    return 0.0, info


def test_contract_click_test():
    with envs.make("miniwob", tasks=["click-test"], browsers=1, eval_size=2) as source:
        assert isinstance(source, envs.TaskSource)
        env = source.env_factory()
        observation = env.reset(source.eval_tasks[0])
        assert "Click the button." in observation and re.search(r"\[\d+\] button",
                                                               observation)
        result = env.step(f"click('{bid_of(observation, 'button')}')")
        assert result.done and result.reward == 1.0 and result.info["solved"]
        assert result.info["action"] == f"click('{bid_of(observation, 'button')}')"
        source.env_factory().close()


@pytest.mark.parametrize("name,agent", [("enter-text", enter_text), ("login-user", login_user),
                                        ("use-autocomplete", use_autocomplete),
                                        ("search-engine", search_engine)])
def test_scripted_agents_solve_pages(pool, name, agent):
    env = WebEnv(pool)
    try:
        for seed in (0, 1):
            reward, info = play(env, task(name, seed), agent)
            assert reward == 1.0 and info["solved"], (name, seed, info)
    finally:
        env.close()


def test_answers_are_recorded(pool):
    env = WebEnv(pool, action_format="webrl")
    env.reset(task("click-test", 5))
    result = env.step('exit(message="The button is clicked.")')
    assert result.info["answer"] == "The button is clicked."
    assert result.info["action"] == "send_msg_to_user('The button is clicked.')"
    env.close()


def test_webrl_format_drives_the_same_browser(pool):
    env = WebEnv(pool, action_format="webrl")
    observation = env.reset(task("enter-text", 2))
    text = quoted(goal_of(observation))[0]
    env.step(f'do(action="Type", argument="{text}", element="{bid_of(observation, "textbox")}")')
    result = env.step(f'Done. do(action="Click", element="{bid_of(observation, "button")}")')
    assert result.reward == 1.0 and result.done


HOSTILE = [
    "", "   ", "click()", "click('99999')", "click(13", "click('13'); import os",
    "fill('14', __import__('os').system('touch /tmp/pwned'))", "fill('14', 'x' * 10**6)",
    "click(bid='13', button='middle', modifiers=['Shift'])", "select_option('13', 'nope')",
    "press('13', 'Control+w')", "goto('http://192.0.2.1/')", "go_back()", "scroll(1e308, -1e308)",
    "noop(-5)", "send_msg_to_user(12)", "report_infeasible('no')", "\x00\ud800 click('13')",
    "do(action='Click', element='13')", "click('13'" + ")" * 1000, "(" * 500 + "click('13')",
    "send_msg_to_user('" + "a" * 5000 + "')", "click([1, 2])", "fill('9', 'x')",
]


def test_hostile_replies_are_feedback(pool):
    env = WebEnv(pool, max_turns=40)
    try:
        observation = env.reset(task("click-test", 3))
        for reply in HOSTILE:
            result = env.step(reply)
            assert isinstance(result.observation, str) and isinstance(result.info, dict)
            if result.done:
                observation = env.reset(task("click-test", 3))
        assert "Goal:" in observation
    finally:
        env.close()


@hypothesis.settings(max_examples=300, deadline=None)
@hypothesis.given(st.one_of(st.text(max_size=200),
                            st.builds(lambda name, args: f"{name}({args})",
                                      st.sampled_from(sorted(actions.BROWSERGYM_ACTIONS)
                                                      + ["do", "exit"]),
                                      st.text(alphabet="'\"()[]{},=0123456789abc \\",
                                              max_size=40))),
                  st.sampled_from(actions.FORMATS))
def test_parser_never_raises(text, action_format):
    parsed = actions.parse_action(text, action_format)
    assert isinstance(parsed, (actions.Action, actions.ParseError))
    if isinstance(parsed, actions.Action):  # canonical code re-parses to itself
        assert actions.parse_action(parsed.code.splitlines()[0]).code == \
            parsed.code.splitlines()[0]


def test_parallel_episodes_of_one_task_are_isolated():
    with BrowserPool(1) as one_browser:  # both contexts live in the same Chromium
        first, second = WebEnv(one_browser), WebEnv(one_browser)
        observations = [first.reset(task("enter-text", 4)), second.reset(task("enter-text", 4))]
        assert goal_of(observations[0]) == goal_of(observations[1])
        box = bid_of(observations[0], "textbox")
        results = {}
        threads = [threading.Thread(target=lambda: results.update(a=first.step(
                       f"fill('{box}', 'only in the first')"))),
                   threading.Thread(target=lambda: results.update(b=second.step("noop(0)")))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert "only in the first" in results["a"].observation
        assert "only in the first" not in results["b"].observation
        assert "only in the first" not in second.step("noop(0)").observation
        first.close()
        second.close()


def test_rollout_plays_rows_together_and_closes_on_error():
    source = envs.make("miniwob", tasks=["click-test"], browsers=2, eval_size=3)

    def clicker(conversations, members, task_indices):
        return [f"click('{bid_of(c[-1]['content'], 'button')}')" for c in conversations]

    trajectories = rollout.run_episodes(source.env_factory, source.eval_tasks, clicker, [0, 1],
                                        max_turns=3)
    assert [t.total_reward for t in trajectories] == [1.0] * 6

    def fails_on_second_turn(conversations, members, task_indices):
        if len(conversations[0]) > 3:
            raise RuntimeError("the policy broke")
        return ["noop(0)"] * len(conversations)

    with pytest.raises(RuntimeError, match="the policy broke"):
        rollout.run_episodes(source.env_factory, source.eval_tasks, fails_on_second_turn, [0],
                             max_turns=5)
    pool = source.env_factory().pool
    assert pool.open_episodes() == 0  # every episode's context was closed
    pids = pool.pids()
    assert len(pids) >= 2  # workers and their Chromium processes
    source.close()
    assert wait_gone(pids) == []


def chromium_processes():
    """The Chromium processes below this one."""
    found = set()
    for pid in descendants(os.getpid()):
        try:
            with open(f"/proc/{pid}/comm", encoding="utf-8") as f:
                found |= {pid} if "chrom" in f.read() else set()
        except OSError:
            continue
    return found


def test_close_ends_every_browser_and_is_idempotent():
    before = chromium_processes()  # the module's shared pool may have its own
    source = envs.make("miniwob", tasks=["click-test"], browsers=1, eval_size=1)
    env = source.env_factory()
    env.reset(source.eval_tasks[0])
    started = chromium_processes() - before
    assert started
    source.close()
    assert wait_gone(list(started)) == [] and not chromium_processes() - before
    env.close()  # an episode left open is closed without its browser
    source.close()
    with pytest.raises(RuntimeError, match="the browser pool is closed"):
        source.env_factory().reset(source.eval_tasks[0])


def test_leaving_a_with_block_on_an_error_ends_every_browser():
    before = chromium_processes()
    with pytest.raises(RuntimeError, match="the agent broke"):
        with envs.make("miniwob", tasks=["click-test"], browsers=1, eval_size=1) as source:
            source.env_factory().reset(source.eval_tasks[0])
            started = chromium_processes() - before
            raise RuntimeError("the agent broke")
    assert started and wait_gone(list(started)) == []
    assert not chromium_processes() - before


def test_no_browser_outlives_a_killed_parent(tmp_path):
    script = textwrap.dedent("""
        import os, signal
        from agentic_esopt.envs.web.env import WebEnv, WebTask
        from agentic_esopt.envs.web.pool import BrowserPool
        pool = BrowserPool(1)
        WebEnv(pool).reset(WebTask("t", "miniwob", "click-test", 0))
        print(" ".join(map(str, pool.pids())), flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120, check=False)
    pids = [int(p) for p in run.stdout.split()]
    assert run.returncode == -9 and len(pids) >= 2
    assert wait_gone(pids, timeout_s=30) == []


def test_missing_pieces_are_named(monkeypatch):
    from agentic_esopt.envs.web import runtime
    monkeypatch.setattr(runtime, "CHROMIUM_CANDIDATES", ("no-such-chromium",))
    with pytest.raises(RuntimeError, match="apt-get install -y chromium"):
        runtime.chromium_binary()
    with pytest.raises(RuntimeError, match=r'pip install -e "\.\[web\]"'):
        runtime.require_package("no_such_module_xyz", "no-such-module")
    with pytest.raises(RuntimeError, match="'no-such-package'"):
        runtime.require_package("no_such_package_xyz.core", "no-such-package")


def test_splits_are_disjoint_and_options_checked():
    pages = miniwob.EASY
    train = miniwob.instances(pages, "train", 60)
    held_out = miniwob.instances(pages, "eval", 30) + miniwob.instances(pages, "test", 30)
    assert not {t.id for t in train} & {t.id for t in held_out}
    assert {t.name for t in held_out} == set(pages)
    with pytest.raises(ValueError, match="(?s)not MiniWoB pages.*browsers must be >= 1"):
        envs.make("miniwob", tasks=["no-such-page"], browsers=0)
