"""A text environment over a BrowserGym browser episode.

Observation: the goal, the page's flattened accessibility tree (every element with its
``[bid]``, generic ones included, cut to a token budget) and the last action's error.
Action: one BrowserGym high-level action (or WebRL's ``do(...)``/``exit(...)``) in the
reply, parsed tolerantly; a reply without a readable action, or naming an element that is
not on the page, is feedback and costs a turn without touching the browser. Reward: the
task's own (MiniWoB: 1 on success, else 0), on the step that ends the episode. The episode
ends when the task does or after ``max_turns`` replies. ``info`` records the URL, the
action, its error and the answer sent to the user, if any. The browser side runs in a
``pool.BrowserPool`` worker; ``reset`` and ``step`` of different episodes may run in
parallel threads (``concurrent = True`` tells the rollout engine so).
"""

from __future__ import annotations

import dataclasses
import itertools
import re
from typing import Any

from agentic_esopt import options as options_lib
from agentic_esopt.envs import base
from agentic_esopt.envs.base import StepResult
from agentic_esopt.envs.web import actions
from agentic_esopt.envs.web.pool import BrowserPool, BrowserWorker, WorkerError, WorkerGone

CHARS_PER_TOKEN = 4  # the tree budget is in tokens; cut by characters at this rate
MAX_ERROR_CHARS = 500  # Playwright's errors carry long call logs
_BID = re.compile(r"\[([^\[\]\s]+)\]")
_EPISODE_IDS = itertools.count()

BROWSERGYM_HELP = """\
Reply with exactly one action, written as a function call on an element's id:
click('12')                 click element [12]
fill('15', 'some text')     type text into field [15] (replaces its content)
select_option('7', 'Red')   choose an option of drop-down list [7]
press('15', 'Enter')        press a key (or a combination like 'Control+a') in element [15]
hover('12'), dblclick('12'), focus('12'), clear('15'), check('9'), uncheck('9')
scroll(0, 300)              scroll the page down (negative: up)
send_msg_to_user('answer')  give the answer when the task asks a question
go_back(), go_forward(), goto('url'), noop()"""
WEBRL_HELP = """\
Reply with exactly one action on an element's id:
do(action="Click", element="12")
do(action="Type", argument="some text", element="15")
do(action="Search", argument="some text", element="15")     type, then press Enter
do(action="Select Dropdown Option", argument="Red", element="7")
do(action="Press Enter", element="15"), do(action="Hover", element="12")
do(action="Scroll Down"), do(action="Scroll Up"), do(action="Go Backward"),
do(action="Go Forward"), do(action="Wait")
exit(message="answer")      finish, with the answer when the task asks a question"""


def system_prompt(action_format: str) -> str:
    """The web agent's instructions for ``action_format`` ("browsergym" or "webrl")."""
    return ("You are a web agent. Each turn you see your goal and the current web page as "
            "an accessibility tree in which every element you can act on has an id in "
            "square brackets, like [13]. Act on elements by their id.\n"
            + (BROWSERGYM_HELP if action_format == "browsergym" else WEBRL_HELP))


@dataclasses.dataclass(frozen=True)
class WebTask:
    """One browser task: ``kind`` ("miniwob", "webarena", "webarena_lite"), the task's
    ``name`` within it and the seed of its random instance."""

    id: str
    kind: str
    name: str
    seed: int = 0


def cut_tree(tree: str, max_chars: int) -> str:
    """``tree`` cut to whole lines within ``max_chars``, saying how many lines were cut."""
    if len(tree) <= max_chars:
        return tree
    lines, kept, size = tree.splitlines(), [], 0
    for line in lines:
        if size + len(line) + 1 > max_chars:
            break
        kept.append(line)
        size += len(line) + 1
    return "\n".join(kept) + f"\n[... {len(lines) - len(kept)} more lines not shown]"


def render(page: dict[str, Any], max_tokens: int, error: str | None,
           last_action: str | None) -> str:
    """The observation text of a page reply (see the module docstring)."""
    parts = [f"Goal: {page['goal']}", "Page (accessibility tree; the first line has the URL):",
             cut_tree(page["tree"], max_tokens * CHARS_PER_TOKEN)]
    if last_action is not None:
        parts.append(f"Last action: {last_action}")
    if error:
        parts.append(f"Error: {error}")
    return "\n".join(parts)


class WebEnv:
    """One browser episode at a time, on a worker of a shared ``BrowserPool``."""

    concurrent = True

    def __init__(self, pool: BrowserPool, *, max_turns: int = 30,
                 observation_tokens: int = 2000, action_format: str = "browsergym",
                 timeout_ms: int = 3000):
        self.pool = pool
        self.turn_limit_default = max_turns
        self.observation_tokens = observation_tokens
        self.action_format = action_format
        self.timeout_ms = timeout_ms
        self._worker: BrowserWorker | None = None
        self._episode = ""
        self._page: dict[str, Any] = {}
        self._turn = 0
        self._turn_limit = max_turns
        self._done = True

    def reset(self, task: WebTask, *, max_turns: int | None = None) -> str:
        """Opens ``task`` in a fresh browser context; returns the first observation."""
        if not isinstance(task, WebTask):
            raise TypeError(f"WebEnv needs a WebTask, got {type(task).__name__}")
        if max_turns is not None and max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        self.close()
        self._turn = 0
        self._turn_limit = min(self.turn_limit_default, max_turns or self.turn_limit_default)
        self._worker = self.pool.acquire()
        self._episode = f"{task.id}#{next(_EPISODE_IDS)}"
        self._page = self._worker.request(op="reset", episode=self._episode,
                                          task=dataclasses.asdict(task),
                                          timeout_ms=self.timeout_ms)
        self._done = False
        return render(self._page, self.observation_tokens, None, None)

    @property
    def bids(self) -> set[str]:
        """The element ids of the current page (its whole tree, also the part not shown)."""
        return set(_BID.findall(self._page.get("tree", "")))

    def step(self, action_text: str) -> StepResult:
        """Plays one reply (see the module docstring)."""
        if self._done:
            raise RuntimeError("step() called on an episode that was not reset or has ended")
        self._turn += 1
        action = actions.parse_action(action_text, self.action_format)
        reward, task_done = 0.0, False
        if isinstance(action, actions.ParseError):
            code, error = None, f"no valid action: {action.reason}"
        elif unknown := [b for b in action.bids if b not in self.bids]:
            code, error = action.code, f"no element with id {unknown[0]!r} on this page"
        else:
            code = action.code
            try:
                self._page = self._worker.request(op="step", episode=self._episode,
                                                  action=code)
                reward, task_done, error = self._page["reward"], self._page["done"], \
                    self._page["error"]
            except WorkerError as failure:  # the action broke the page: the episode ends
                task_done, error = True, f"the browser could not go on: {failure}"
        error = (error or "")[:MAX_ERROR_CHARS]
        self._done = task_done or self._turn >= self._turn_limit
        info = {"url": self._page["url"], "action": code, "error": error or None,
                "answer": getattr(action, "answer", None), "turn": self._turn,
                "solved": self._done and reward > 0}
        observation = render(self._page, self.observation_tokens, error, code)
        if self._done:
            observation += "\nThe task is over." if task_done else "\nNo turns left."
            self.close()
        return StepResult(observation, float(reward) if self._done else 0.0, self._done, info)

    def close(self) -> None:
        """Closes the episode's browser context and frees its worker slot."""
        worker, self._worker = self._worker, None
        if worker is not None:
            try:
                worker.request(op="close", episode=self._episode)
            except WorkerGone:  # a dead worker holds nothing
                pass
            finally:
                self.pool.release(worker)



def episode_problems(options: Any) -> list[str]:
    """Problems with the episode settings a web env's ``options`` share (max_turns,
    observation_tokens, action_format, browsers, timeout_ms)."""
    problems = []
    check = options_lib.checker(problems)
    check(options.max_turns >= 1, f"max_turns must be >= 1, got {options.max_turns}")
    check(options.observation_tokens >= 50,
          f"observation_tokens must be >= 50, got {options.observation_tokens}")
    check(options.action_format in actions.FORMATS,
          f"action_format must be one of {actions.FORMATS}, got {options.action_format!r}")
    check(options.browsers >= 1, f"browsers must be >= 1, got {options.browsers}")
    check(options.timeout_ms >= 100, f"timeout_ms must be >= 100, got {options.timeout_ms}")
    return problems


def task_source(options: Any, pool: BrowserPool, train: list[WebTask],
                held_out: list[WebTask], splits: base.Splits) -> base.TaskSource:
    """A web task source: episodes on ``pool``; each generation samples
    ``splits.tasks_per_generation`` of ``train``; ``held_out`` is evaluated; ``close``
    closes the pool."""
    if splits.tasks_per_generation > len(train):
        raise ValueError(f"tasks_per_generation={splits.tasks_per_generation} exceeds the "
                         f"{len(train)} training tasks")

    def make_env() -> WebEnv:
        return WebEnv(pool, max_turns=options.max_turns,
                      observation_tokens=options.observation_tokens,
                      action_format=options.action_format, timeout_ms=options.timeout_ms)

    return base.TaskSource(
        env_factory=make_env, system_prompt=system_prompt(options.action_format),
        train_tasks=lambda g: base.sample_generation_tasks(train, splits.tasks_per_generation,
                                                           splits.seed, g),
        eval_tasks=held_out, on_close=pool.close)
