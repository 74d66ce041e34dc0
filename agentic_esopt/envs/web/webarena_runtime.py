"""The WebArena side of a browser worker (runs inside ``worker.py``'s process).

BrowserGym's WebArena packages download NLTK's ``punkt_tab`` when they are imported; here
a parameter-free ``punkt_tab`` under the project cache satisfies that check when NLTK has
none installed (nothing is downloaded). WebArena's scoring then only tokenises single
lines (``preserve_line``), which needs no Punkt parameters. Task classes reset the sites
before each episode when ``WA_FULL_RESET`` is set, score answers and URLs with
``webarena_lite.string_score`` / ``url_score``, and route the fuzzy matches of
``program_html`` checks to the configured judge.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from typing import Any

from agentic_esopt import fileio
from agentic_esopt.envs import webarena_lite

PUNKT_FILES = ("collocations.tab", "sent_starters.txt", "abbrev_types.txt", "ortho_context.tab")


def ensure_punkt_tab(cache_dir: str | os.PathLike | None = None) -> Path | None:
    """Makes ``nltk.data.find("tokenizers/punkt_tab")`` succeed without a download.

    Returns the provisioned NLTK data folder, or None when NLTK already has punkt_tab.
    """
    import nltk  # pylint: disable=import-outside-toplevel
    try:
        nltk.data.find("tokenizers/punkt_tab/english/")
        return None
    except LookupError:
        pass
    root = fileio.cache_root(cache_dir) / "nltk_data"
    english = root / "tokenizers" / "punkt_tab" / "english"
    english.mkdir(parents=True, exist_ok=True)
    for name in PUNKT_FILES:
        (english / name).touch()
    if str(root) not in nltk.data.path:
        nltk.data.path.insert(0, str(root))
    return root


def _route_judge(judge: webarena_lite.Judge) -> None:
    """Points the fuzzy matches of BrowserGym's and WebArena's evaluators at ``judge``."""
    for name in ("browsergym.webarenalite.evaluators", "webarena.evaluation_harness.evaluators"):
        module = importlib.import_module(name)
        module.llm_fuzzy_match = lambda pred, reference, question: judge(pred, reference,
                                                                         question)


def task_entrypoint(task: dict[str, Any]) -> tuple[type, dict[str, Any]]:
    """(task class, keyword arguments) of a ``webarena`` or ``webarena_lite`` task."""
    ensure_punkt_tab()
    judge = webarena_lite.judge_from_environment(dict(os.environ))
    if task["kind"] == "webarena_lite":
        from browsergym.webarenalite.task import WebArenaLiteTask as Base  # pylint: disable=import-outside-toplevel
    else:
        from browsergym.webarena.task import GenericWebArenaTask as Base  # pylint: disable=import-outside-toplevel
    _route_judge(judge)

    class ScoredTask(Base):
        def setup(self, page):
            if os.environ.get(webarena_lite.RESET_VARIABLE):
                self.webarena_instance.full_reset()
            return super().setup(page)

        def validate(self, page, chat_messages):
            checks = self.config["eval"]
            if "program_html" in checks["eval_types"]:
                return super().validate(page, chat_messages)
            if not chat_messages or chat_messages[-1]["role"] != "assistant":
                return 0.0, False, "", {}  # the agent has not answered yet
            score = 1.0
            if "string_match" in checks["eval_types"]:
                score *= webarena_lite.string_score(chat_messages[-1]["message"],
                                                    checks["reference_answers"],
                                                    self.config["intent"], judge)
            if "url_match" in checks["eval_types"]:
                score *= webarena_lite.url_score(page.url, checks["reference_url"],
                                                 checks.get("url_note") or "GOLD in PRED")
            return score, True, "", {}

    return ScoredTask, {"task_id": int(task["name"])}
