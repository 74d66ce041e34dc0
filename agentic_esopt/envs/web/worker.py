"""A browser worker process: one Chromium, any number of episodes, JSON lines on stdio.

Run as ``python -m agentic_esopt.envs.web.worker`` by ``pool.BrowserWorker``, with the
environment of ``runtime.worker_environment``. Playwright's sync API is bound to the
thread that started it, so each worker process owns one Playwright and one Chromium, and
the pool runs several workers to act in parallel. Every episode is a BrowserGym
``BrowserEnv`` with its own task instance and its own browser context; every launch
BrowserGym makes (the task page's and its chat window's) borrows the worker's one
Chromium, so a reset opens contexts instead of relaunching a browser.

Requests (one JSON object per line on stdin), each answered by one line on stdout:
``{"op": "reset", "episode": E, "task": {...}, "timeout_ms": T}``,
``{"op": "step", "episode": E, "action": "click('13')"}``, ``{"op": "close",
"episode": E}``, ``{"op": "ping"}``. A reply is an observation, ``{"ok": true}`` or
``{"failure": "..."}``. End of input (also when the parent dies) closes everything and exits.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import urllib.parse
from typing import Any

# The task-page actions an agent may use (BrowserGym's high-level action subsets).
ACTION_SUBSETS = ("chat", "infeas", "bid", "nav")


class _BorrowedBrowser:
    """What a BrowserGym ``launch`` gets: the shared browser; ``close`` closes only the
    contexts opened through it."""

    def __init__(self, browser: Any):
        self._browser = browser
        self._contexts: list[Any] = []

    def new_context(self, **kwargs: Any) -> Any:
        context = self._browser.new_context(**kwargs)
        self._contexts.append(context)
        return context

    def close(self) -> None:
        for context in self._contexts:
            try:
                context.close()
            except Exception:  # pylint: disable=broad-except  # already closed is fine
                pass
        self._contexts.clear()


class _SharedChromium:
    """Stands in for Playwright's ``chromium``: every launch borrows one browser, launched
    once with the project's flags (BrowserGym's own launch arguments are not used)."""

    def __init__(self, chromium: Any, flags: list[str]):
        self._chromium = chromium
        self._flags = flags
        self._browser = None

    def launch(self, **_ignored: Any) -> _BorrowedBrowser:
        if self._browser is None or not self._browser.is_connected():
            self._browser = self._chromium.launch(headless=True, args=self._flags)
        return _BorrowedBrowser(self._browser)

    def close(self) -> None:
        if self._browser is not None:
            self._browser.close()
            self._browser = None


class _PlaywrightView:
    """The parts of a Playwright object BrowserGym uses, with the shared Chromium."""

    def __init__(self, playwright: Any, chromium: _SharedChromium):
        self.selectors = playwright.selectors
        self.chromium = chromium


@functools.lru_cache(maxsize=None)
def _miniwob_task_class(name: str) -> type:
    """The BrowserGym MiniWoB task ``name``, its URL check tolerant of a '#' fragment
    (search-engine's result links are ``href='#'``; the stock check ends such episodes
    with reward 0)."""
    import playwright.sync_api  # pylint: disable=import-outside-toplevel
    from browsergym.miniwob import ALL_MINIWOB_TASKS  # pylint: disable=import-outside-toplevel
    classes = {cls.subdomain: cls for cls in ALL_MINIWOB_TASKS}
    if name not in classes:
        raise ValueError(f"unknown MiniWoB task {name!r}")

    class FragmentTolerantTask(classes[name]):
        def validate(self, page, chat_messages):
            left = {"error": "the agent left the task page"}
            if page != self.page or urllib.parse.urldefrag(page.url).url != self.url:
                return 0.0, True, "", left
            try:
                info = self._get_info()
            except playwright.sync_api.Error:  # navigating away or reloading loses the task
                return 0.0, True, "", left
            return float(info["RAW_REWARD_GLOBAL"] > 0), bool(info["DONE_GLOBAL"]), "", info

    return FragmentTolerantTask


def _task_entrypoint(task: dict[str, Any]) -> tuple[type, dict[str, Any]]:
    """(task class, its keyword arguments) of a task spec sent by the parent."""
    if task["kind"] == "miniwob":
        return _miniwob_task_class(task["name"]), {}
    if task["kind"] in ("webarena", "webarena_lite"):
        from agentic_esopt.envs.web import webarena_runtime  # pylint: disable=import-outside-toplevel
        return webarena_runtime.task_entrypoint(task)
    raise ValueError(f"unknown task kind {task['kind']!r}")


def _observation(obs: dict[str, Any], reward: float = 0.0, done: bool = False) -> dict[str, Any]:
    """The JSON reply of a reset or step: goal, flattened tree (generic nodes kept), url,
    the last action's error, reward and whether the task ended."""
    from browsergym.utils.obs import (  # pylint: disable=import-outside-toplevel
        IGNORED_AXTREE_ROLES, flatten_axtree_to_str)
    tree = flatten_axtree_to_str(obs["axtree_object"],
                                 extra_properties=obs["extra_element_properties"],
                                 skip_generic=False,  # clickable spans are generic nodes
                                 ignored_roles=[*IGNORED_AXTREE_ROLES, "InlineTextBox"])
    return {"goal": obs["goal"], "tree": tree, "url": obs["url"],
            "error": obs["last_action_error"], "reward": float(reward), "done": bool(done)}


class Worker:
    """The episodes of one worker process."""

    def __init__(self):
        from browsergym.core.action.highlevel import HighLevelActionSet  # pylint: disable=import-outside-toplevel
        self._actions = HighLevelActionSet(subsets=list(ACTION_SUBSETS), multiaction=True)
        self._episodes: dict[str, Any] = {}

    def handle(self, request: dict[str, Any]) -> dict[str, Any]:
        op = request.get("op")
        if op == "ping":
            return {"ok": True, "episodes": len(self._episodes)}
        if op == "reset":
            return self._reset(request)
        if op == "step":
            env = self._episodes[request["episode"]]
            obs, reward, terminated, truncated, _ = env.step(request["action"])
            return _observation(obs, reward, terminated or truncated)
        if op == "close":
            self._close(request["episode"])
            return {"ok": True}
        raise ValueError(f"unknown op {op!r}")

    def _reset(self, request: dict[str, Any]) -> dict[str, Any]:
        from browsergym.core.env import BrowserEnv  # pylint: disable=import-outside-toplevel
        self._close(request["episode"])
        entrypoint, kwargs = _task_entrypoint(request["task"])
        env = BrowserEnv(task_entrypoint=entrypoint, task_kwargs=kwargs, headless=True,
                         timeout=request.get("timeout_ms"), pre_observation_delay=0.0,
                         action_mapping=self._actions.to_python_code)
        self._episodes[request["episode"]] = env
        obs, _ = env.reset(seed=int(request["task"].get("seed", 0)))
        return _observation(obs)

    def _close(self, episode: str) -> None:
        env = self._episodes.pop(episode, None)
        if env is not None:
            env.close()

    def close(self) -> None:
        for episode in list(self._episodes):
            try:
                self._close(episode)
            except Exception:  # pylint: disable=broad-except  # shutting down regardless
                pass


def main() -> None:
    """Serves requests until end of input, then closes every episode and the browser."""
    protocol = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)  # anything a library prints goes to stderr, never into the protocol
    import browsergym.core  # pylint: disable=import-outside-toplevel
    from playwright.sync_api import sync_playwright  # pylint: disable=import-outside-toplevel

    from agentic_esopt.envs.web import runtime  # pylint: disable=import-outside-toplevel
    playwright = sync_playwright().start()
    chromium = _SharedChromium(playwright.chromium, runtime.chromium_flags())
    browsergym.core._set_global_playwright(  # pylint: disable=protected-access
        _PlaywrightView(playwright, chromium))
    worker = Worker()
    try:
        for line in sys.stdin:
            try:
                reply = worker.handle(json.loads(line))
            except Exception as error:  # pylint: disable=broad-except  # reported to the parent
                reply = {"failure": f"{type(error).__name__}: {error}"}
            protocol.write(json.dumps(reply) + "\n")
            protocol.flush()
    finally:
        worker.close()
        chromium.close()
        playwright.stop()


if __name__ == "__main__":
    main()
