"""The WebArena-Lite adapter's offline parts: task files and the paper's split, site
configuration errors, scoring of recorded answers and URLs, the judge client, NLTK data
without downloads. (Playing episodes needs the WebArena sites, which are not here.)"""

import http.server
import json
import threading

import pytest

from agentic_esopt import envs
from agentic_esopt.envs import webarena_lite
from agentic_esopt.envs.web import webarena_runtime


def config(task_id, eval_types=("string_match",), **eval_fields):
    return {"task_id": task_id, "intent": f"question {task_id}", "sites": ["shopping"],
            "eval": {"eval_types": list(eval_types), **eval_fields}}


@pytest.fixture
def task_files(tmp_path):
    lite = [{**config(i), "old_task_id": old} for i, old in enumerate((4, 7, 15))]
    full = [config(i) for i in (4, 5, 7, 8, 15, 16)]
    paths = tmp_path / "lite.json", tmp_path / "full.json"
    for path, rows in zip(paths, (lite, full)):
        path.write_text(json.dumps(rows))
    return [str(p) for p in paths]


def test_paper_split_holds_lite_out(task_files):
    source = envs.make("webarena_lite", lite_file=task_files[0], full_file=task_files[1],
                       check_sites=False, tasks_per_generation=2, eval_size=165)
    assert [t.id for t in source.eval_tasks] == [f"webarena_lite-{i}" for i in range(3)]
    assert [t.name for t in source.eval_tasks] == ["4", "7", "15"]  # WebArena's ids
    train_names = {t.name for g in range(5) for t in source.train_tasks(g)}
    assert train_names <= {"5", "8", "16"} and len(source.train_tasks(0)) == 2
    source.close()


def test_the_reference_split_keeps_validation_tasks_apart():
    lite = [{"task_id": i, "old_task_id": i} for i in range(165)]
    full = [{"task_id": i} for i in range(812)]
    train, held_out = webarena_lite.paper_split(lite, full, validation_tasks=65)
    assert (len(train), len(held_out)) == (582, 165)
    assert train[-1].name == "746" and {t.name for t in held_out} == {str(i) for i in range(165)}


def test_close_is_idempotent_and_ends_the_pool(task_files):
    with envs.make("webarena_lite", lite_file=task_files[0], full_file=task_files[1],
                   check_sites=False, tasks_per_generation=2) as source:
        env = source.env_factory()
    source.close()
    with pytest.raises(RuntimeError, match="the browser pool is closed"):
        env.reset(source.eval_tasks[0])


def test_task_file_and_option_errors(tmp_path, task_files):
    bad = tmp_path / "bad.json"
    bad.write_text('{"not": "a list"}')
    with pytest.raises(ValueError, match="bad.json: expected a JSON list"):
        webarena_lite.read_configs(bad)
    with pytest.raises(ValueError, match="(?s)lite_file.*not a file.*judge_url"):
        envs.make("webarena_lite", lite_file=str(tmp_path / "missing.json"),
                  judge_url="ftp://judge")
    with pytest.raises(RuntimeError, match=r'no_such_pkg.*pip install -e "\.\[webarena\]"'):
        webarena_lite._package_file("no_such_pkg.sub", "x.json", "no_such_pkg")


class _Handler(http.server.BaseHTTPRequestHandler):
    replies = []
    requests = []

    def do_GET(self):  # pylint: disable=invalid-name
        self.send_response(200)
        self.end_headers()

    def do_POST(self):  # pylint: disable=invalid-name
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).requests.append((self.path, self.headers.get("Authorization"),
                                    json.loads(body)))
        self.send_response(200)
        self.end_headers()
        content = type(self).replies.pop(0)
        self.wfile.write(json.dumps({"choices": [{"message": {"content": content}}]}).encode())

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def test_sites_missing_malformed_unreachable_or_up(server):
    problems = webarena_lite.site_problems({"WA_SHOPPING": "shop.local"})
    assert len(problems) == len(webarena_lite.SITE_VARIABLES)
    assert "WA_SHOPPING='shop.local' is not an http(s) URL" in problems
    with pytest.raises(RuntimeError, match="(?s)not configured.*WA_HOMEPAGE is not set"):
        webarena_lite.check_sites({})
    up = {name: server for name in webarena_lite.SITE_VARIABLES}
    webarena_lite.check_sites(up)
    down = {**up, "WA_MAP": "http://127.0.0.1:9/"}
    with pytest.raises(RuntimeError, match=r"(?s)not reachable.*WA_MAP \(http://127.0.0.1:9/\)"):
        webarena_lite.check_sites(down, timeout_s=2)


def test_string_rules_on_recorded_answers():
    def never(*_):
        raise AssertionError("the judge is only asked for fuzzy matches")

    duffles = {"must_include": ["Impulse Duffle", "Overnight Duffle"]}
    assert webarena_lite.string_score("The top sellers: impulse duffle, Overnight Duffle.",
                                      duffles, "q", never) == 1.0
    assert webarena_lite.string_score("Impulse Duffle only", duffles, "q", never) == 0.0
    assert webarena_lite.string_score(None, duffles, "q", never) == 0.0
    assert webarena_lite.string_score('"$25.99"', {"exact_match": "$25.99"}, "q", never) == 1.0
    one = {"must_include": ["1"]}  # a lone one-character reference must be a whole token
    assert webarena_lite.string_score("There is 1 order.", one, "q", never) == 1.0
    assert webarena_lite.string_score("There are 10 orders.", one, "q", never) == 0.0
    assert webarena_lite.string_score("n/a", {"fuzzy_match": "N/A"}, "q", never) == 1.0
    asked = []

    def judge(answer, reference, question):
        asked.append((answer, reference, question))
        return 1.0

    assert webarena_lite.string_score(" 'Two Days' ", {"fuzzy_match": ["2 days"]}, "how long?",
                                      judge) == 1.0
    assert asked == [("two days", "2 days", "how long?")]


def test_url_rule():
    reference = "http://shop/catalog/search?q=shoes&page=1 |OR| http://shop/alt"
    assert webarena_lite.url_score("http://shop/catalog/search/?page=1&q=shoes&x=2",
                                   reference) == 1.0
    assert webarena_lite.url_score("http://shop/catalog/search?q=boots&page=1", reference) == 0.0
    assert webarena_lite.url_score("http://shop/home", reference) == 0.0


def test_judge_client_and_verdicts(server, monkeypatch):
    _Handler.requests.clear()
    _Handler.replies[:] = ["The answer is correct.", "Partially correct.", "Incorrect."]
    monkeypatch.setenv("MY_JUDGE_KEY", "secret")
    judge = webarena_lite.judge_from_environment({
        "AGENTIC_ESOPT_JUDGE_URL": server + "/v1", "AGENTIC_ESOPT_JUDGE_MODEL": "judge-7b",
        "AGENTIC_ESOPT_JUDGE_KEY_ENV": "MY_JUDGE_KEY", "MY_JUDGE_KEY": "secret"})
    assert [judge("a", "b", "q") for _ in range(3)] == [1.0, 0.0, 0.0]
    path, authorization, body = _Handler.requests[0]
    assert path == "/v1/chat/completions" and authorization == "Bearer secret"
    assert body["model"] == "judge-7b" and "reference answer: b" in body["messages"][1]["content"]
    with pytest.raises(RuntimeError, match="judge_url"):
        webarena_lite.judge_from_environment({})("a", "b", "q")


def test_nltk_data_without_download(tmp_path, monkeypatch):
    import nltk

    def no_download(*args, **kwargs):
        raise AssertionError("nothing may be downloaded")

    monkeypatch.setattr(nltk, "download", no_download)
    monkeypatch.setattr(nltk.data, "path", [str(tmp_path / "empty")])
    nltk.data._resource_cache.clear()  # pylint: disable=protected-access
    root = webarena_runtime.ensure_punkt_tab(tmp_path / "cache")
    assert root == tmp_path / "cache" / "nltk_data"
    assert nltk.data.find("tokenizers/punkt_tab")  # the check BrowserGym runs on import
    assert nltk.data.find("tokenizers/punkt_tab/english/")
    assert webarena_runtime.ensure_punkt_tab(tmp_path / "cache") is None  # found now
    assert webarena_lite.must_include("1", "Orders: 1.", tokenize=True) == 1.0
