"""Crash-safe files: atomic writes and JSON-lines that tolerate a torn last line."""

from __future__ import annotations

import json
import os
import pathlib
import tempfile
from typing import Any, Sequence

CACHE_ENV_VAR = "AGENTIC_ESOPT_CACHE"


def cache_root(cache_dir: str | os.PathLike | None = None) -> pathlib.Path:
    """The project's cache folder: ``cache_dir``, else ``$AGENTIC_ESOPT_CACHE``, else
    ``~/.cache/agentic_esopt`` (converted models, the browser runtime)."""
    if cache_dir is not None:
        return pathlib.Path(cache_dir)
    if os.environ.get(CACHE_ENV_VAR):
        return pathlib.Path(os.environ[CACHE_ENV_VAR])
    return pathlib.Path.home() / ".cache" / "agentic_esopt"


def atomic_write_text(path: str, text: str) -> None:
    """Writes ``text`` to ``path`` via a temporary file and ``os.replace``.

    A crash leaves either the old file or the new one, never a half-written file.
    """
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def read_jsonl(path: str) -> list[dict[str, Any]]:
    """The records of a JSON-lines file ([] if missing); a torn last line is dropped."""
    if not os.path.exists(path):
        return []
    records = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                break
    return records


def write_jsonl(path: str, records: Sequence[dict[str, Any]]) -> None:
    """Atomically replaces ``path`` with ``records`` as JSON lines."""
    atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in records))
