"""Typed option records: frozen dataclasses built from plain mappings, checked in full.

Every configurable part of the library (an environment, the ES strategy, the rollout
engine, the trainer) describes its settings as a frozen dataclass whose fields carry
their help text, and whose ``problems()`` method lists range and combination errors.
``build`` turns a mapping (a config-file section) into such a record and reports unknown
keys and wrong types instead of raising, so a caller can collect every problem of every
section before any compute.
"""

from __future__ import annotations

import dataclasses
import difflib
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

T = TypeVar("T")


def field(default: Any, help_text: str) -> Any:
    """A dataclass field with a default and its help text (``metadata["help"]``)."""
    if isinstance(default, (list, dict, set)):
        raise TypeError("mutable defaults are not allowed; use a tuple")
    return dataclasses.field(default=default, metadata={"help": help_text})


def field_types(cls: type) -> dict[str, tuple[type, bool]]:
    """Each field's (base type, accepts None); ``X | None`` is unwrapped."""
    types = {}
    for name, hint in typing.get_type_hints(cls).items():
        args = typing.get_args(hint)
        optional = type(None) in args
        base = [a for a in args if a is not type(None)]
        origin = typing.get_origin(hint)
        if origin in (tuple, list) or (base and typing.get_origin(base[0]) in (tuple, list)):
            types[name] = (tuple, optional)
        else:
            types[name] = (base[0] if base else hint, optional)
    return types


def _has_type(value: Any, expected: type) -> bool:
    """isinstance, except that bools are not numbers and ints are floats."""
    if isinstance(value, bool):
        return expected is bool
    if expected is float:
        return isinstance(value, (int, float))
    if expected is tuple:
        return isinstance(value, (tuple, list))
    return isinstance(value, expected)


def _coerce(value: Any, expected: type) -> Any:
    if expected is float and isinstance(value, int):
        return float(value)
    if expected is tuple and isinstance(value, list):
        return tuple(value)
    return value


def build(cls: type[T], values: Mapping[str, Any], section: str) -> tuple[T | None, list[str]]:
    """A ``cls`` record from ``values`` and every problem found (record None if any).

    Missing keys take the field defaults. Problems are prefixed with ``section`` (e.g.
    "es.population_size must be int, got 'x'"); range problems come from the record's
    own ``problems()`` method, when it has one.
    """
    types = field_types(cls)
    problems = [f"{section}: {unknown(key, types, 'option')}"
                for key in sorted(set(values) - set(types))]
    kwargs = {}
    for name, value in values.items():
        if name not in types:
            continue
        expected, optional = types[name]
        if value is None and optional:
            kwargs[name] = None
        elif _has_type(value, expected):
            kwargs[name] = _coerce(value, expected)
        else:
            problems.append(f"{section}.{name} must be {expected.__name__}"
                            f"{' or None' if optional else ''}, got {value!r}")
    if problems:
        return None, problems
    record = cls(**kwargs)
    own = record.problems() if hasattr(record, "problems") else []
    problems = [f"{section}.{p}" for p in own]
    return (None, problems) if problems else (record, [])


def unknown(name: str, choices: Any, what: str) -> str:
    """"unknown <what> 'name'", naming the closest of ``choices`` (or all of them)."""
    if not choices:
        return f"unknown {what} {name!r}; there are none here"
    close = difflib.get_close_matches(name, list(choices), n=1)
    if close:
        return f"unknown {what} {name!r}; did you mean {close[0]!r}?"
    return f"unknown {what} {name!r}; choose one of {sorted(choices)}"


def build_or_raise(cls: type[T], values: Mapping[str, Any], section: str) -> T:
    """``build``, raising ValueError that lists every problem."""
    record, problems = build(cls, values, section)
    if problems:
        raise ValueError(f"invalid {section} options:\n  " + "\n  ".join(problems))
    return record


def as_dict(record: Any) -> dict[str, Any]:
    """A record's fields as a JSON-friendly dict (tuples become lists)."""
    return {k: list(v) if isinstance(v, tuple) else v
            for k, v in dataclasses.asdict(record).items()}


def checker(problems: list[str]):
    """``check(condition, message)`` appending ``message`` to ``problems`` when false."""
    def check(condition: bool, message: str) -> None:
        if not condition:
            problems.append(message)
    return check
