"""Skill distillation: selection, prompts, merging under a budget, provenance, the LLMs."""

import dataclasses
import http.server
import json
import threading

import pytest

from agentic_esopt import models
from agentic_esopt.agents import rollout, skills
from agentic_esopt.agents.rollout import Trajectory


def trajectory(task_id, generation=0, member=0, solved=False, reply="Action: oops"):
    messages = [{"role": "system", "content": "You are an agent."},
                {"role": "user", "content": f"Problem {task_id}"},
                {"role": "assistant", "content": reply},
                {"role": "user", "content": "Format warning: bad"}]
    return Trajectory(member=member, task_id=task_id, generation=generation,
                      messages=messages, actions=[reply], rewards=[float(solved)],
                      total_reward=float(solved), num_turns=1, solved=solved,
                      info={"solved": solved})


class FakeLLM:
    """Answers analysis prompts with lessons and merge prompts with a tagged merge."""

    def __init__(self, lessons_per_failure=5, merge_tags=True, merge_reply=None):
        self.calls = []
        self.lessons_per_failure = lessons_per_failure
        self.merge_tags = merge_tags
        self.merge_reply = merge_reply

    def __call__(self, prompts):
        self.calls.append(list(prompts))
        replies = []
        for prompt in prompts:
            if prompt.startswith("An AI agent failed"):
                task = prompt.split("Problem ")[1].split("\n")[0]
                replies.append("Here you go:\n" + "\n".join(
                    f"- Lesson {k} about {task}." for k in range(self.lessons_per_failure)))
            else:
                if self.merge_reply is not None:
                    replies.append(self.merge_reply)
                    continue
                merged = {}
                for line in prompt.splitlines():  # one line per lesson number k, tags united
                    if not line.startswith("- "):
                        continue
                    text, tags = (line[2:].rsplit(" [", 1) if "[L" in line
                                  else (line[2:], ""))
                    key = text.split(" about")[0].split(" for all")[0]
                    merged.setdefault(key, set()).update(
                        t for t in tags.rstrip("]").split(", ") if t)
                replies.append("\n".join(
                    f"- {k} for all tasks." + (f" [{', '.join(sorted(t))}]"
                                               if self.merge_tags else "")
                    for k, t in merged.items()))
        return replies


def test_select_failures_keeps_each_tasks_latest_failure():
    trajs = [trajectory("a", 0, 0), trajectory("a", 2, 1), trajectory("a", 2, 0),
             trajectory("b", 1, 0, solved=True), trajectory("c", 1, 3), trajectory("a", 1)]
    chosen = skills.select_failures(trajs)
    assert [(t.task_id, t.generation, t.member) for t in chosen] == [("c", 1, 3),
                                                                     ("a", 2, 0)]
    assert [t.task_id for t in skills.select_failures(trajs, max_failures=1)] == ["a"]
    assert skills.select_failures(trajs, max_failures=0) == []
    assert skills.select_failures([trajectory("x", solved=True)]) == []


@pytest.mark.parametrize("reply, lessons", [
    ("- one\n- two\n- three\n- four", ["one", "two", "three"]),
    ("Analysis:\n1. Use the tool.\n2) Box it.", ["Use the tool.", "Box it."]),
    ("Just print the result first.\n\nThen answer.", ["Just print the result first.",
                                                      "Then answer."]),
    ("- same\n* same\n- 123", ["same"]),
    ("", []),
])
def test_parse_lessons(reply, lessons):
    assert skills.parse_lessons(reply) == lessons


def test_distill_end_to_end_with_a_fake_llm(tmp_path):
    trajs = [trajectory(f"t{i}", generation=i % 3) for i in range(10)]
    trajs += [trajectory("t0", generation=5, member=2), trajectory("won", solved=True)]
    path = tmp_path / "trajectories" / "gen_00000.jsonl"
    rollout.write_trajectories(path, trajs)
    loaded = skills.load_trajectories(skills.trajectory_files(tmp_path / "trajectories"))
    assert loaded == trajs
    llm = FakeLLM()
    skill = skills.distill(loaded, llm, batch_size=4, max_lines=80)
    analysis = [p for call in llm.calls for p in call if p.startswith("An AI agent failed")]
    assert len(analysis) == 10  # one per failed task, t0 once
    assert all(len(call) <= 4 for call in llm.calls)
    assert "[ASSISTANT]\nAction: oops" in analysis[0] and "not solved" in analysis[0]
    assert len(skill.lessons) == 30  # at most 3 lessons each
    t0 = [lesson for lesson in skill.lessons if lesson.task_id == "t0"]
    assert {(lesson.generation, lesson.member) for lesson in t0} == {(5, 2)}
    assert skill.lines == ("Lesson 0 for all tasks.", "Lesson 1 for all tasks.",
                           "Lesson 2 for all tasks.")
    assert len(skill.sources[0]) == 10  # every failure's lesson 0
    document = skills.render(skill)
    assert document.count("\n- ") == 3
    assert "L1: task t3, generation 0, member 0: Lesson 0 about t3." in document
    assert "L28: task t0, generation 5, member 2: Lesson 0 about t0." in document
    assert "line 1: from L1, L4" in document
    text = skills.skill_text(document)
    assert "provenance" not in text and "L1:" not in text and text.endswith("tasks.")
    out = tmp_path / "skill.md"
    out.write_text(document)
    assert skills.read_skill(out) == text


def test_line_budget_and_untagged_or_useless_merges():
    trajs = [trajectory(f"t{i}") for i in range(6)]
    skill = skills.distill(trajs, FakeLLM(merge_reply="I cannot do that."), max_lines=5,
                           batch_size=4)
    assert len(skill.lines) == 5 and all(len(s) == 1 for s in skill.sources)
    assert len(skill.lessons) == 18
    long_merge = "\n".join(f"- rule {i}" for i in range(200))
    skill = skills.distill(trajs, FakeLLM(merge_reply=long_merge), max_lines=7)
    assert skill.lines == tuple(f"rule {i}" for i in range(7))
    assert skill.sources == ((),) * 7
    assert skills.render(skill).count("\n- ") == 7
    skill = skills.distill(trajs, FakeLLM(merge_tags=False), max_lines=80)
    assert len(skill.lines) == 3 and "line 1:" not in skills.render(skill)


def test_nothing_failed_gives_an_empty_skill():
    llm = FakeLLM()
    skill = skills.distill([trajectory("a", solved=True)], llm)
    assert skill.lines == () and skill.lessons == () and llm.calls == []
    assert skills.skill_text(skills.render(skill)).startswith("# Skill")


def test_trajectory_files_leave_out_eval_episodes(tmp_path):
    for name in ("gen_00001.jsonl", "gen_00000.jsonl", "eval_00000.jsonl", "notes.txt"):
        (tmp_path / name).write_text("")
    assert [p.name for p in skills.trajectory_files(tmp_path)] == ["gen_00000.jsonl",
                                                                   "gen_00001.jsonl"]
    assert len(skills.trajectory_files(tmp_path, include_eval=True)) == 3


def test_long_trajectories_are_cut_in_prompts():
    long = trajectory("a", reply="x" * 100_000)
    prompt = skills.analysis_prompt(long, max_chars=3000)
    assert len(prompt) < 4000 and "characters cut" in prompt and "[OUTCOME]" in prompt


def test_distill_with_the_tiny_model():
    model = models.load("tiny")
    llm = skills.model_llm(model, max_new_tokens=8, batch_size=2)
    trajs = [trajectory(f"t{i}") for i in range(3)]
    skill = skills.distill(trajs, llm, max_lines=4, batch_size=2)
    assert len(skill.lines) <= 4
    assert all(lesson.task_id in {"t0", "t1", "t2"} for lesson in skill.lessons)
    document = skills.render(skill)
    assert document.startswith("# Skill") and skills.PROVENANCE_START in document
    # Other parameters change the replies: the run's fine-tuned ones are used when given.
    zeros = skills.model_llm(model, params=dataclasses.replace(model).params,
                             max_new_tokens=4, temperature=0.7, seed=1)(["hi", "there"])
    assert len(zeros) == 2 and all(isinstance(r, str) for r in zeros)


class _ChatHandler(http.server.BaseHTTPRequestHandler):
    requests = []

    def do_POST(self):  # pylint: disable=invalid-name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append((self.path, dict(self.headers), body))
        if body["model"] == "broken":
            self.send_response(500)
            self.end_headers()
            self.wfile.write(b"server exploded")
            return
        prompt = body["messages"][-1]["content"]
        content = ("- Check the tool output." if prompt.startswith("An AI agent") else
                   "- Check the tool output before answering. [L1]")
        payload = json.dumps({"choices": [{"message": {"role": "assistant",
                                                       "content": content}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args):  # quiet
        pass


@pytest.fixture(name="server")
def fixture_server():
    _ChatHandler.requests = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _ChatHandler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                              daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def test_endpoint_client_against_a_local_server(server):
    llm = skills.endpoint_llm(server, "test-model", api_key="k", max_tokens=32,
                              timeout_s=10)
    skill = skills.distill([trajectory("a"), trajectory("b")], llm)
    assert skill.lines == ("Check the tool output before answering.",)
    assert skill.sources == ((1,),)
    path, headers, body = _ChatHandler.requests[0]
    assert path == "/v1/chat/completions"
    assert headers["Authorization"] == "Bearer k"
    assert body["model"] == "test-model" and body["max_tokens"] == 32
    assert [m["role"] for m in body["messages"]] == ["system", "user"]
    assert len(_ChatHandler.requests) == 3  # 2 analyses + 1 merge
    assert skills.endpoint_llm(server + "/chat/completions", "m")([]) == []
    with pytest.raises(RuntimeError, match="HTTP 500: server exploded"):
        skills.endpoint_llm(server, "broken", timeout_s=10)(["x"])


def test_endpoint_client_reports_an_unreachable_server():
    with pytest.raises(RuntimeError, match="127.0.0.1:9"):
        skills.endpoint_llm("http://127.0.0.1:9/v1", "m", timeout_s=2)(["x"])
