"""MiniWoB++ in a real browser, offline: ``envs.make("miniwob", tasks=[...])``.

A task is a MiniWoB page (from the installed ``miniwob`` package) and the seed of its
random instance. Instances are hash-partitioned into train / eval / test by (page, seed),
so held-out instances never occur in training; each generation samples its training
instances from the train split. ``tasks`` picks the pages: a curated multi-step set
solvable from the accessibility tree (the default), the short ``EASY`` set, or any list
(one page is the single-task mode). See ``envs.web.env`` for observations, actions and
rewards; the browsers come from one ``BrowserPool`` of ``browsers`` workers per source,
ended by ``source.close()`` (or by leaving ``with envs.make("miniwob", ...) as source:``).
"""

from __future__ import annotations

import dataclasses
import functools

from agentic_esopt import options as options_lib
from agentic_esopt.envs import base
from agentic_esopt.envs.web.env import WebTask, episode_problems, task_source
from agentic_esopt.envs.web.pool import BrowserPool

# Multi-step pages solvable from the accessibility tree.
CURATED = ("login-user", "enter-password", "use-autocomplete", "click-tab-2", "email-inbox",
           "search-engine", "book-flight", "choose-date", "click-checkboxes",
           "form-sequence-2", "navigate-tree", "social-media-all")
# One- or two-action pages with short trees, where a small model gets signal.
EASY = ("click-test", "click-test-2", "click-button", "click-link", "click-dialog",
        "click-tab", "focus-text", "enter-text", "login-user")
TASK_SETS = {"curated": CURATED, "easy": EASY}
SPLITS = ("train", "eval", "test")
# Instances per split: eval 1/5, test 1/5, train the rest (by a hash of page and seed).
_SPLIT_OF_BUCKET = ("eval", "test", "train", "train", "train")


def instance_split(name: str, seed: int) -> str:
    """The split of instance ``seed`` of page ``name``."""
    return _SPLIT_OF_BUCKET[base.stable_int(f"miniwob:{name}:{seed}") % len(_SPLIT_OF_BUCKET)]


def instances(names: tuple[str, ...], split: str, count: int) -> list[WebTask]:
    """The first ``count`` instances of ``split``, taking the pages in turn."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose one of {SPLITS}")
    per_page = -(-count // len(names))
    seeds = {name: [s for s in range(20 * per_page + 20) if instance_split(name, s) == split]
             [:per_page] for name in names}
    ordered = [WebTask(f"{name}-s{seeds[name][i]}", "miniwob", name, seeds[name][i])
               for i in range(per_page) for name in names]
    return ordered[:count]


@functools.lru_cache(maxsize=1)
def available_pages() -> frozenset[str]:
    """The MiniWoB pages the installed packages provide (empty without the web extra)."""
    try:
        from browsergym.miniwob import ALL_MINIWOB_TASKS  # pylint: disable=import-outside-toplevel
    except ImportError:
        return frozenset()
    return frozenset(cls.subdomain for cls in ALL_MINIWOB_TASKS)


@dataclasses.dataclass(frozen=True)
class Options:
    """``miniwob`` settings (``envs.make("miniwob", **options)``)."""

    tasks: tuple[str, ...] = options_lib.field(("curated",), "MiniWoB pages to play, or a "
                                                             "set name: 'curated' (multi-step) "
                                                             "or 'easy' (one or two actions).")
    train_instances: int = options_lib.field(200, "Training instances (page, seed) in the "
                                                  "pool generations sample from.")
    max_turns: int = options_lib.field(30, "Replies per episode.")
    observation_tokens: int = options_lib.field(2000, "Budget of the page tree in each "
                                                      "observation (about 4 characters a "
                                                      "token; whole lines are cut).")
    action_format: str = options_lib.field("browsergym", "'browsergym' (click('13')) or "
                                                         "'webrl' (do(action=\"Click\", "
                                                         "element=\"13\")).")
    browsers: int = options_lib.field(4, "Browser processes acting at once (each about "
                                         "0.6 GB); episodes share them, one context each.")
    timeout_ms: int = options_lib.field(3000, "Playwright's timeout for page operations.")

    @property
    def pages(self) -> tuple[str, ...]:
        """``tasks`` with set names expanded."""
        return tuple(p for name in self.tasks for p in TASK_SETS.get(name, (name,)))

    def problems(self) -> list[str]:
        problems = []
        check = options_lib.checker(problems)
        check(bool(self.tasks), "tasks must name at least one page or set")
        known = available_pages()
        unknown = sorted(set(self.pages) - known) if known else []
        check(not unknown, f"tasks {unknown} are not MiniWoB pages")
        check(self.train_instances >= 1,
              f"train_instances must be >= 1, got {self.train_instances}")
        problems.extend(episode_problems(self))
        return problems


def make_source(options: Options, splits: base.Splits) -> base.TaskSource:
    """The MiniWoB task source (starts no browser until the first episode; ``close``
    ends every browser)."""
    pages = tuple(dict.fromkeys(options.pages))
    return task_source(options, BrowserPool(options.browsers),
                       instances(pages, "train", options.train_instances),
                       instances(pages, splits.eval_split, splits.eval_size), splits)
