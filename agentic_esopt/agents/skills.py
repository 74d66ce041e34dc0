"""Skills: short instructions distilled from an agent's failed trajectories by an LLM.

``distill`` takes a run's trajectories, keeps failed ones (at most one per task), asks an
LLM for a short failure analysis of each (at most ``MAX_LESSONS`` lessons), then merges
the lessons, a batch at a time, into one skill document of at most ``max_lines`` lines.
``render`` writes the document followed by the provenance of every lesson (task id,
generation, member) in an HTML comment, which ``skill_text`` strips again when the skill
is put into a system prompt. Works for every environment: all it reads is the
conversation of each trajectory.

The LLM is any callable ``llm(prompts) -> replies`` (one reply per prompt):
``model_llm`` wraps a loaded ``models.Model`` (optionally with other parameters, e.g. a
run's fine-tuned ones) and ``endpoint_llm`` an OpenAI-compatible chat-completions server
(standard library only).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import re
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from agentic_esopt.agents.rollout import Trajectory, read_trajectories

LLM = Callable[[list[str]], list[str]]

MAX_LESSONS = 3
MAX_LESSON_CHARS = 300
PROVENANCE_START = "<!-- provenance"
PROVENANCE_END = "-->"
ANALYST_SYSTEM_PROMPT = ("You are an expert at analysing the mistakes of AI agents and "
                         "turning them into short, general, actionable instructions.")

_BULLET = re.compile(r"^\s*(?:[-*•]|\d+[.)]|lesson\s*\d*\s*:)\s*", re.IGNORECASE)
_TAGS = re.compile(r"\s*[\[(]\s*(L\d+(?:\s*,\s*L\d+)*)\s*[\])]\s*$")


@dataclasses.dataclass(frozen=True)
class Lesson:
    """One lesson and the trajectory it was drawn from."""

    text: str
    task_id: str
    generation: int
    member: int


@dataclasses.dataclass(frozen=True)
class Skill:
    """A skill document: its lines, and for each line the lessons (indices) behind it."""

    lines: tuple[str, ...]
    sources: tuple[tuple[int, ...], ...]
    lessons: tuple[Lesson, ...]


# ----------------------------------------------------------------------------- selection


def trajectory_files(trajectory_dir: str | Path, include_eval: bool = False) -> list[Path]:
    """The JSONL files of a run's ``trajectories/`` folder, sorted.

    Held-out evaluation episodes (``eval_*.jsonl``) are left out unless ``include_eval``:
    lessons drawn from them would leak the held-out tasks into the skill.
    """
    files = sorted(Path(trajectory_dir).glob("*.jsonl"))
    return [f for f in files if include_eval or not f.name.startswith("eval_")]


def load_trajectories(paths: Iterable[str | Path]) -> list[Trajectory]:
    """Every trajectory of the given JSONL files, in file order."""
    return [t for path in paths for t in read_trajectories(path)]


def select_failures(trajectories: Sequence[Trajectory],
                    max_failures: int | None = None) -> list[Trajectory]:
    """Failed trajectories, at most one per task: each task's latest failure.

    A trajectory failed when it is not ``solved``. Among a task's failures the one of the
    latest generation (then the lowest member) is kept; the result is ordered by
    (generation, task id), and with ``max_failures`` only the latest ones are kept.
    """
    chosen: dict[str, Trajectory] = {}
    for trajectory in trajectories:
        if trajectory.solved:
            continue
        best = chosen.get(trajectory.task_id)
        if best is None or (trajectory.generation, -trajectory.member) > (
                best.generation, -best.member):
            chosen[trajectory.task_id] = trajectory
    failures = sorted(chosen.values(), key=lambda t: (t.generation, t.task_id))
    if max_failures is not None:
        failures = failures[len(failures) - max_failures:] if max_failures > 0 else []
    return failures


# ----------------------------------------------------------------------------- prompts


def _cut(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    half = max(0, (limit - 40) // 2)
    return f"{text[:half]}\n[... {len(text) - 2 * half} characters cut ...]\n{text[-half:]}"


def render_trajectory(trajectory: Trajectory, max_chars: int = 8000,
                      message_chars: int = 1500) -> str:
    """The episode as text (role-labelled turns), each message and the whole cut to fit."""
    parts = []
    for message in trajectory.messages:
        role = str(message.get("role", "?")).upper()
        parts.append(f"[{role}]\n{_cut(str(message.get('content', '')), message_chars)}")
    outcome = (f"[OUTCOME] reward {trajectory.total_reward:g} after {trajectory.num_turns} "
               f"turns; not solved; final info: {json.dumps(trajectory.info)[:300]}")
    return _cut("\n\n".join(parts), max_chars - len(outcome) - 2) + "\n\n" + outcome


def analysis_prompt(trajectory: Trajectory, max_chars: int = 8000) -> str:
    """The prompt asking for a failure analysis of one trajectory, as lessons."""
    return (
        "An AI agent failed the task below. Read its episode (the system message holds "
        "its instructions; the user messages are the environment).\n\n"
        f"{render_trajectory(trajectory, max_chars)}\n\n"
        "Why did it fail? Write at most 3 lessons that would help the agent succeed on "
        "similar tasks. Each lesson is one line starting with \"- \", a general and "
        "actionable instruction (not specific to this task's numbers). Write only the "
        "lessons.")


def parse_lessons(reply: str, max_lessons: int = MAX_LESSONS) -> list[str]:
    """Up to ``max_lessons`` lessons from a reply: its bullet lines, else its first lines."""
    lines = [line.strip() for line in str(reply).splitlines() if line.strip()]
    bullets = [_BULLET.sub("", line) for line in lines if _BULLET.match(line)]
    candidates = bullets or lines
    lessons = []
    for text in candidates:
        text = " ".join(text.split())[:MAX_LESSON_CHARS].strip()
        if re.search(r"[A-Za-z]", text) and text not in lessons:
            lessons.append(text)
        if len(lessons) == max_lessons:
            break
    return lessons


def merge_prompt(lines: Sequence[str], sources: Sequence[Sequence[int]],
                 lessons: Sequence[tuple[int, Lesson]], max_lines: int) -> str:
    """The prompt asking to merge new lessons into the current skill document."""
    current = "\n".join(f"- {line} [{', '.join(f'L{i}' for i in src)}]" if src else
                        f"- {line}" for line, src in zip(lines, sources)) or "(empty)"
    new = "\n".join(f"- {lesson.text} [L{i}]" for i, lesson in lessons)
    return (
        "You maintain a skill document: instructions that help an AI agent avoid its past "
        "mistakes. Each line is tagged with the lessons it comes from, like [L1, L4].\n\n"
        f"Current skill document:\n{current}\n\nNew lessons:\n{new}\n\n"
        f"Rewrite the document so that it includes the new lessons: merge duplicates, "
        f"keep it general and concrete, at most {max_lines} lines. Write one instruction "
        "per line starting with \"- \" and ending with the tags of the lessons it comes "
        "from. Write only the document.")


def _parse_merged(reply: str, max_lines: int, known: set[int]
                  ) -> tuple[list[str], list[tuple[int, ...]]]:
    lines, sources = [], []
    for raw in str(reply).splitlines():
        if not _BULLET.match(raw):
            continue
        text = _BULLET.sub("", raw).strip()
        tags = _TAGS.search(text)
        found: tuple[int, ...] = ()
        if tags:
            found = tuple(sorted({int(t.strip()[1:]) for t in tags.group(1).split(",")}
                                 & known))
            text = text[:tags.start()].strip()
        text = " ".join(text.split())[:MAX_LESSON_CHARS]
        if re.search(r"[A-Za-z]", text) and text not in lines:
            lines.append(text)
            sources.append(found)
        if len(lines) == max_lines:
            break
    return lines, sources


# ----------------------------------------------------------------------------- distillation


def _chunks(items: Sequence[Any], size: int) -> Iterable[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start:start + size]


def _call(llm: LLM, prompts: list[str]) -> list[str]:
    replies = llm(prompts)
    if len(replies) != len(prompts):
        raise ValueError(f"the LLM returned {len(replies)} replies for {len(prompts)} prompts")
    return [reply if isinstance(reply, str) else "" for reply in replies]


def distill(trajectories: Sequence[Trajectory], llm: LLM, *, max_lines: int = 80,
            batch_size: int = 8, max_failures: int | None = 64,
            max_prompt_chars: int = 8000) -> Skill:
    """A skill document distilled from the failed ``trajectories``.

    Args:
      trajectories: a run's trajectories (any environment).
      llm: ``llm(prompts) -> replies``.
      max_lines: line budget of the document.
      batch_size: prompts per LLM call, and lessons merged per merge step.
      max_failures: analyse at most this many failures (the latest; None for all).
      max_prompt_chars: longest rendering of one trajectory in an analysis prompt.

    Returns:
      The ``Skill``; empty when nothing failed. When the LLM's merged document has no
      usable line, the lessons are appended as they are (within the budget).
    """
    if max_lines < 1 or batch_size < 1:
        raise ValueError(f"max_lines and batch_size must be >= 1, got {max_lines}, "
                         f"{batch_size}")
    failures = select_failures(trajectories, max_failures)
    lessons: list[Lesson] = []
    for batch in _chunks(failures, batch_size):
        replies = _call(llm, [analysis_prompt(t, max_prompt_chars) for t in batch])
        for trajectory, reply in zip(batch, replies):
            lessons += [Lesson(text, trajectory.task_id, trajectory.generation,
                               trajectory.member) for text in parse_lessons(reply)]
    lines: list[str] = []
    sources: list[tuple[int, ...]] = []
    numbered = list(enumerate(lessons, start=1))
    for batch in _chunks(numbered, batch_size):
        reply = _call(llm, [merge_prompt(lines, sources, batch, max_lines)])[0]
        known = {i for i, _ in numbered[:batch[-1][0]]}
        merged, merged_sources = _parse_merged(reply, max_lines, known)
        if merged:
            lines, sources = merged, merged_sources
        else:
            for i, lesson in batch:
                if lesson.text not in lines and len(lines) < max_lines:
                    lines.append(lesson.text)
                    sources.append((i,))
    return Skill(tuple(lines), tuple(sources), tuple(lessons))


def render_provenance(skill: Skill) -> str:
    """Where each lesson (and each line, when the merge kept its tags) comes from."""
    provenance = [PROVENANCE_START]
    for n, src in enumerate(skill.sources, start=1):
        if src:
            provenance.append(f"line {n}: from {', '.join(f'L{i}' for i in src)}")
    for i, lesson in enumerate(skill.lessons, start=1):
        text = lesson.text.replace("--", "- -")  # never ends the comment
        provenance.append(f"L{i}: task {lesson.task_id}, generation {lesson.generation}, "
                          f"member {lesson.member}: {text}")
    provenance.append(PROVENANCE_END)
    return "\n".join(provenance) + "\n"


def render(skill: Skill, title: str = "Skill: lessons from failed episodes",
           provenance: bool = True) -> str:
    """The skill file: a title, one ``- `` line per instruction, then (with
    ``provenance``) the provenance comment of ``render_provenance``."""
    body = "\n".join([f"# {title}", ""] + [f"- {line}" for line in skill.lines]) + "\n"
    return body + ("\n" + render_provenance(skill) if provenance else "")


def skill_text(document: str) -> str:
    """The instructions of a skill file, without its provenance comment."""
    start = document.find(PROVENANCE_START)
    if start >= 0:
        end = document.find(PROVENANCE_END, start)
        document = document[:start] + ("" if end < 0 else document[end + len(PROVENANCE_END):])
    return document.strip()


def read_skill(path: str | Path) -> str:
    """A skill file's instructions (``skill_text`` of its contents)."""
    return skill_text(Path(path).read_text(encoding="utf-8"))


SKILL_HEADER = "Additional skill instructions:"


def with_skill(system_prompt: str | None, skill_path: str | Path | None) -> str | None:
    """``system_prompt`` followed by the skill file's instructions (``rollout.skill``, in
    training and evaluation); unchanged without a skill."""
    if skill_path is None:
        return system_prompt
    skill = f"{SKILL_HEADER}\n{read_skill(skill_path)}"
    return "\n\n".join(p for p in (system_prompt, skill) if p)


# ----------------------------------------------------------------------------- LLMs


def model_llm(model: Any, params: Any = None, *, max_new_tokens: int = 256,
              temperature: float = 0.0, seed: int = 0, batch_size: int = 8,
              system_prompt: str | None = ANALYST_SYSTEM_PROMPT) -> LLM:
    """An LLM callable that chat-templates each prompt and calls ``models.generate``.

    Args:
      model: a loaded ``models.Model`` with a chat-template tokenizer.
      params: parameters to use instead of ``model.params`` (e.g. a run's fine-tuned ones).
      max_new_tokens: reply length limit.
      temperature: 0 is greedy.
      seed: sampling seed (call k uses seed + k).
      batch_size: prompts per ``generate`` call.
      system_prompt: the system message (None for none).
    """
    # Imported here so that reading and rendering skills needs no model stack.
    from agentic_esopt import models  # pylint: disable=import-outside-toplevel

    if params is not None:
        model = dataclasses.replace(model, params=params)
    calls = [0]

    def llm(prompts: list[str]) -> list[str]:
        replies = []
        for batch in _chunks(list(prompts), batch_size):
            texts = []
            for prompt in batch:
                messages = ([{"role": "system", "content": system_prompt}]
                            if system_prompt else []) + [{"role": "user", "content": prompt}]
                texts.append(model.tokenizer.apply_chat_template(
                    messages, add_generation_prompt=True, tokenize=False))
            key = seed + calls[0] if temperature > 0 else None
            calls[0] += 1
            replies += models.generate(model, texts, max_new_tokens=max_new_tokens,
                                       temperature=temperature, key=key).texts
        return replies

    return llm


def chat_completions_url(url: str) -> str:
    """``url`` ending in ``/chat/completions`` (a base such as ``http://h:8000/v1`` gets it)."""
    url = url.rstrip("/")
    return url if url.endswith("/chat/completions") else url + "/chat/completions"


def endpoint_llm(url: str, model: str, *, api_key: str | None = None,
                 max_tokens: int = 512, temperature: float = 0.0, timeout_s: float = 120.0,
                 concurrency: int = 4,
                 system_prompt: str | None = ANALYST_SYSTEM_PROMPT) -> LLM:
    """An LLM callable backed by an OpenAI-compatible chat-completions endpoint.

    Args:
      url: the server's base URL (``http://host:8000/v1``) or its chat-completions URL.
      model: the ``model`` field of each request.
      api_key: sent as ``Authorization: Bearer`` when given.
      max_tokens, temperature: request fields.
      timeout_s: per-request timeout.
      concurrency: requests in flight at once.
      system_prompt: the system message of every request (None for none).

    The callable raises ``RuntimeError`` naming the URL on an HTTP or network error or a
    reply without ``choices[0].message.content``.
    """
    endpoint = chat_completions_url(url)
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"

    def ask(prompt: str) -> str:
        messages = ([{"role": "system", "content": system_prompt}] if system_prompt else []
                    ) + [{"role": "user", "content": prompt}]
        body = json.dumps({"model": model, "messages": messages, "max_tokens": max_tokens,
                           "temperature": temperature}).encode("utf-8")
        request = urllib.request.Request(endpoint, data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as response:
                reply = json.loads(response.read().decode("utf-8"))
        except urllib.error.HTTPError as error:
            detail = error.read()[:500].decode("utf-8", errors="replace")
            raise RuntimeError(f"{endpoint}: HTTP {error.code}: {detail}") from error
        except (urllib.error.URLError, OSError, ValueError) as error:
            raise RuntimeError(f"{endpoint}: {error}") from error
        try:
            content = reply["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError) as error:
            raise RuntimeError(f"{endpoint}: no choices[0].message.content in "
                               f"{str(reply)[:300]}") from error
        return content if isinstance(content, str) else ""

    def llm(prompts: list[str]) -> list[str]:
        if not prompts:
            return []
        with concurrent.futures.ThreadPoolExecutor(max(1, concurrency)) as pool:
            return list(pool.map(ask, prompts))

    return llm
