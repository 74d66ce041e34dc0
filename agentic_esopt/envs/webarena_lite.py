"""WebArena-Lite over BrowserGym, for users who host the WebArena sites.

``envs.make("webarena_lite", ...)`` plays WebArena tasks in Chromium through
``browsergym-webarenalite`` (``pip install -e ".[webarena]"``). The split is the paper's:
Lite's 165 tasks are held out (eval and test), training samples the remaining WebArena
tasks (812 − 165). Sites come from the standard ``WA_*`` variables (``SITE_VARIABLES``);
a missing variable or an unreachable site is an error naming it, before any episode.
With ``WA_FULL_RESET`` set, the sites are reset before every episode. Answers
(``send_msg_to_user`` / ``exit(message=...)``) and final URLs are scored with WebArena's
string and URL rules (``string_score``, ``url_score``); its LLM-judged fuzzy matches go to
a configurable OpenAI-compatible endpoint (``judge_*`` options); ``program_html`` checks
run BrowserGym's evaluator on the live page with the same judge.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Callable

from agentic_esopt import options as options_lib
from agentic_esopt.envs import base
from agentic_esopt.envs.web import runtime
from agentic_esopt.envs.web.env import WebTask, episode_problems, task_source
from agentic_esopt.envs.web.pool import BrowserPool

INSTALL_WEBARENA = 'pip install -e ".[webarena]"'
SITE_VARIABLES = ("WA_SHOPPING", "WA_SHOPPING_ADMIN", "WA_REDDIT", "WA_GITLAB",
                  "WA_WIKIPEDIA", "WA_MAP", "WA_HOMEPAGE")
RESET_VARIABLE = "WA_FULL_RESET"
# The judge settings reach the browser workers through these variables.
JUDGE_VARIABLES = ("AGENTIC_ESOPT_JUDGE_URL", "AGENTIC_ESOPT_JUDGE_MODEL",
                   "AGENTIC_ESOPT_JUDGE_KEY_ENV")
FUZZY_PROMPT = (
    "Help a teacher to grade the answer of a student given a question. Keep in mind that "
    "the student may use different phrasing or wording to answer the question. The goal "
    "is to evaluate whether the answer is semantically equivalent to the reference "
    "answer.\nquestion: {question}\nreference answer: {reference}\nall the string 'N/A' "
    "that you see is a special sequence that means 'not achievable'\nstudent answer: "
    "{answer}\nConclude the judgement by correct/incorrect/partially correct.")


# ----------------------------------------------------------------------------- tasks


def _package_file(module: str, relative: str, distribution: str) -> Path:
    """A data file shipped in ``module``'s folder, found without importing the module."""
    return runtime.require_package(module, distribution, f"{INSTALL_WEBARENA} (or give "
                                                         f"lite_file= and full_file=)") / relative


def read_configs(path: str | Path) -> list[dict[str, Any]]:
    """WebArena task configurations from a JSON list file; ValueError naming a bad file."""
    try:
        configs = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise ValueError(f"{path}: not a WebArena task file ({error})") from error
    if not isinstance(configs, list) or not all(
            isinstance(c, dict) and "task_id" in c and "eval" in c for c in configs):
        raise ValueError(f"{path}: expected a JSON list of task configurations with "
                         f"'task_id' and 'eval'")
    return configs


def paper_split(lite: list[dict[str, Any]], full: list[dict[str, Any]],
                validation_tasks: int = 0) -> tuple[list[WebTask], list[WebTask]]:
    """(training tasks, held-out tasks), in file order: Lite's tasks are held out, and the
    rest of WebArena trains, but for its last ``validation_tasks``, kept apart (the
    reference trains on 582 and keeps 65 for skill validation)."""
    held_out_ids = {int(c["old_task_id"]) for c in lite}
    rest = [WebTask(f"webarena-{c['task_id']}", "webarena", str(c["task_id"]))
            for c in full if int(c["task_id"]) not in held_out_ids]
    held_out = [WebTask(f"webarena_lite-{c['task_id']}", "webarena_lite", str(c["old_task_id"]))
                for c in lite]
    return rest[:len(rest) - validation_tasks], held_out


# ----------------------------------------------------------------------------- sites


def site_problems(environ: dict[str, str]) -> list[str]:
    """The ``WA_*`` site variables that are missing or not http(s) URLs."""
    problems = []
    for name in SITE_VARIABLES:
        value = environ.get(name, "")
        if not value:
            problems.append(f"{name} is not set (the URL of that WebArena site)")
        elif urllib.parse.urlparse(value).scheme not in ("http", "https"):
            problems.append(f"{name}={value!r} is not an http(s) URL")
    return problems


def unreachable_sites(environ: dict[str, str], timeout_s: float) -> list[str]:
    """``NAME (url): reason`` for every site that does not answer HTTP within the timeout."""
    down = []
    for name in SITE_VARIABLES:
        url = environ[name]
        try:
            with urllib.request.urlopen(url, timeout=timeout_s):  # nosec: the user's sites
                pass
        except urllib.error.HTTPError:
            continue  # the site answered (a login page may say 401/403)
        except (urllib.error.URLError, OSError, ValueError) as error:
            down.append(f"{name} ({url}): {getattr(error, 'reason', error)}")
    return down


# ----------------------------------------------------------------------------- scoring

Judge = Callable[[str, str, str], float]  # (answer, reference, question) -> 0 or 1


def clean_answer(answer: str) -> str:
    """WebArena's normalisation: stripped, one pair of outer quotes removed, lower case."""
    answer = str(answer).strip()
    for quote in ("'", '"'):
        if len(answer) >= 2 and answer[0] == quote and answer[-1] == quote:
            answer = answer[1:-1]
    return answer.lower()


def _tokens(text: str) -> list[str]:
    """NLTK's word tokens of one line (``preserve_line``: no Punkt model, no download)."""
    from nltk.tokenize import word_tokenize  # pylint: disable=import-outside-toplevel
    return word_tokenize(text, preserve_line=True)


def must_include(reference: str, answer: str, tokenize: bool) -> float:
    """1 if ``reference`` occurs in ``answer``; a one-character reference (when it is the
    only one) must be a whole token, so '1' is not found in '10'."""
    reference, answer = clean_answer(reference), clean_answer(answer)
    if tokenize and len(reference) == 1 and len(_tokens(reference)) == 1:
        return float(reference in _tokens(answer))
    return float(reference in answer)


def string_score(answer: str | None, references: dict[str, Any], question: str,
                 judge: Judge) -> float:
    """WebArena's string_match on a recorded answer: the product of every reference rule
    (exact_match, must_include, fuzzy_match by ``judge``; 'N/A' is matched exactly)."""
    if answer is None:
        return 0.0
    score = 1.0
    for rule, value in references.items():
        if rule == "exact_match":
            score *= float(clean_answer(answer) == clean_answer(value))
        elif rule == "must_include":
            score *= min((must_include(v, answer, tokenize=len(value) == 1) for v in value),
                         default=1.0)
        elif rule == "fuzzy_match":
            if value == "N/A":
                score *= float(clean_answer(answer) == "n/a")
            else:
                score *= min((judge(clean_answer(answer), r, question) for r in value),
                             default=1.0)
        else:
            raise ValueError(f"unknown string_match rule {rule!r}")
    return score


def _split_url(url: str) -> tuple[str, dict[str, list[str]]]:
    parsed = urllib.parse.urlparse(url.rstrip("/"))
    return parsed.netloc + parsed.path, urllib.parse.parse_qs(parsed.query)


def url_score(url: str, reference_url: str, rule: str = "GOLD in PRED") -> float:
    """WebArena's url_match: some reference's host+path occurs in the final URL's, and
    every reference query parameter has one of its reference values there."""
    if rule != "GOLD in PRED":
        raise ValueError(f"unknown url_match rule {rule!r}")
    predicted_path, predicted_query = _split_url(url)
    references = [_split_url(u) for u in reference_url.split(" |OR| ")]
    queries: dict[str, set[str]] = collections.defaultdict(set)
    for _, query in references:
        for key, values in query.items():
            queries[key].update(values)
    path_ok = any(path in predicted_path for path, _ in references)
    query_ok = all(values & set(predicted_query.get(key, [])) for key, values in queries.items())
    return float(path_ok and query_ok)


def verdict(text: str) -> float:
    """The judge's reply read as WebArena does: 'correct' and neither 'incorrect' nor
    'partially correct'."""
    text = text.lower()
    return float("correct" in text and "incorrect" not in text
                 and "partially correct" not in text)


def openai_judge(base_url: str, model: str, api_key: str | None,
                 timeout_s: float = 60.0) -> Judge:
    """A fuzzy-match judge on an OpenAI-compatible ``/chat/completions`` endpoint."""
    def judge(answer: str, reference: str, question: str) -> float:
        body = {"model": model, "temperature": 0, "max_tokens": 768, "messages": [
            {"role": "system", "content": "You are a helpful assistant"},
            {"role": "user", "content": FUZZY_PROMPT.format(
                question=question, reference=reference, answer=answer)}]}
        request = urllib.request.Request(
            base_url.rstrip("/") + "/chat/completions", data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json",
                     **({"Authorization": f"Bearer {api_key}"} if api_key else {})})
        with urllib.request.urlopen(request, timeout=timeout_s) as response:  # nosec
            reply = json.loads(response.read())
        return verdict(reply["choices"][0]["message"]["content"] or "")
    return judge


def judge_from_environment(environ: dict[str, str]) -> Judge:
    """The judge the options configured (passed to workers via ``JUDGE_VARIABLES``)."""
    url, model, key_variable = (environ.get(v, "") for v in JUDGE_VARIABLES)
    if not url:
        def no_judge(answer: str, reference: str, question: str) -> float:
            raise RuntimeError("this task needs the LLM judge: set env.judge_url")
        return no_judge
    return openai_judge(url, model, environ.get(key_variable) if key_variable else None)


# ----------------------------------------------------------------------------- source


@dataclasses.dataclass(frozen=True)
class Options:
    """``webarena_lite`` settings (``envs.make("webarena_lite", **options)``)."""

    lite_file: str | None = options_lib.field(None, "WebArena-Lite's task file (default: "
                                                     "the one browsergym-webarenalite "
                                                     "ships).")
    full_file: str | None = options_lib.field(None, "WebArena's 812-task file (default: "
                                                     "the one libwebarena ships).")
    validation_tasks: int = options_lib.field(0, "WebArena tasks outside Lite kept apart "
                                                 "from training, the last in file order "
                                                 "(the reference keeps 65).")
    max_turns: int = options_lib.field(30, "Replies per episode.")
    observation_tokens: int = options_lib.field(4000, "Budget of the page tree in each "
                                                      "observation (about 4 characters a "
                                                      "token).")
    action_format: str = options_lib.field("webrl", "'webrl' (the reference's do(...) / "
                                                     "exit(...)) or 'browsergym'.")
    browsers: int = options_lib.field(4, "Browser processes acting at once.")
    timeout_ms: int = options_lib.field(10000, "Playwright's timeout for page operations.")
    judge_url: str | None = options_lib.field(None, "Base URL of an OpenAI-compatible API "
                                                    "judging fuzzy matches (e.g. "
                                                    "http://localhost:8000/v1).")
    judge_model: str = options_lib.field("gpt-4-1106-preview", "The judge's model name.")
    judge_api_key_env: str = options_lib.field("OPENAI_API_KEY", "The variable holding "
                                                                 "the judge's API key.")
    check_sites: bool = options_lib.field(True, "Check every site answers before playing.")

    def problems(self) -> list[str]:
        problems = []
        check = options_lib.checker(problems)
        for name in ("lite_file", "full_file"):
            path = getattr(self, name)
            check(path is None or os.path.isfile(path), f"{name} {path!r} is not a file")
        check(self.validation_tasks >= 0,
              f"validation_tasks must be >= 0, got {self.validation_tasks}")
        problems.extend(episode_problems(self))
        check(self.judge_url is None or urllib.parse.urlparse(self.judge_url).scheme in
              ("http", "https"), f"judge_url must be an http(s) URL, got {self.judge_url!r}")
        return problems


def load_split(options: Options) -> tuple[list[WebTask], list[WebTask]]:
    """The paper's (train, held-out) tasks from the configured or packaged task files."""
    lite = options.lite_file or _package_file(
        "browsergym.webarenalite", "test_webarena_lite.raw.json", "browsergym-webarenalite")
    full = options.full_file or _package_file("webarena", "test.raw.json", "libwebarena")
    return paper_split(read_configs(lite), read_configs(full), options.validation_tasks)


def check_sites(environ: dict[str, str], timeout_s: float = 10.0) -> None:
    """RuntimeError naming every missing, malformed or unreachable site."""
    problems = site_problems(environ)
    if problems:
        raise RuntimeError("WebArena sites are not configured:\n  " + "\n  ".join(problems))
    down = unreachable_sites(environ, timeout_s)
    if down:
        raise RuntimeError("WebArena sites are not reachable (start them, or fix the WA_* "
                           "URLs):\n  " + "\n  ".join(down))


def make_source(options: Options, splits: base.Splits) -> base.TaskSource:
    """The WebArena-Lite task source; checks the sites first (``check_sites``); ``close``
    ends every browser."""
    train, held_out = load_split(options)
    if options.check_sites:
        check_sites(dict(os.environ))
    judge = dict(zip(JUDGE_VARIABLES, (options.judge_url or "", options.judge_model,
                                       options.judge_api_key_env)))
    pool = BrowserPool(options.browsers, miniwob=False, extra_environment=judge)
    return task_source(options, pool, train, held_out[:splits.eval_size], splits)
