"""Action parsers: free model text in, a typed action or a reason out. They never raise."""

from __future__ import annotations

import dataclasses
import re

MAX_NUMBER_DIGITS = 9

_SEPARATORS = r"[\s,;:()\[\]{}]"
_NUMBER = r"([+-]?[0-9]+)"
# "set" not preceded by a letter (so "reset" is no command), then three integers separated
# by whitespace, commas, semicolons, colons or brackets: "set 3 4 5", "SET(3, 4, 5)",
# "set: [3,4,5]". ASCII-only so that unicode look-alikes of digits and letters never match.
_SET_COMMAND = re.compile(
    rf"(?<![a-z])set{_SEPARATORS}*{_NUMBER}{_SEPARATORS}+{_NUMBER}{_SEPARATORS}+{_NUMBER}"
    r"(?![0-9])",
    re.IGNORECASE | re.ASCII,
)


@dataclasses.dataclass(frozen=True)
class SetAction:
    """``set row col value``, 1-based as the model writes it (range is the env's check)."""

    row: int
    col: int
    value: int


@dataclasses.dataclass(frozen=True)
class ParseError:
    """Why no action could be read from the text; meant to be shown to the model."""

    reason: str


def parse_set_action(text: str) -> SetAction | ParseError:
    """Reads the LAST well-formed ``set r c v`` command anywhere in ``text``.

    Lenient about case, separators and surrounding text ("I'll play set 3 4 5",
    "<answer>set(3, 4, 5)</answer>"). A command with a number longer than
    ``MAX_NUMBER_DIGITS`` digits is malformed and skipped.

    Args:
      text: the model's reply; any string (non-strings are a ParseError too).

    Returns:
      The parsed ``SetAction`` or a ``ParseError`` with a human-readable reason.
    """
    if not isinstance(text, str):
        return ParseError(f"expected text, got {type(text).__name__}")
    found_overlong = False
    for match in reversed(list(_SET_COMMAND.finditer(text))):
        numbers = match.groups()
        if any(len(number.lstrip("+-")) > MAX_NUMBER_DIGITS for number in numbers):
            found_overlong = True
            continue
        row, col, value = (int(number) for number in numbers)
        return SetAction(row=row, col=col, value=value)
    if found_overlong:
        return ParseError("the numbers in your command are far too large")
    return ParseError("no command of the form 'set <row> <col> <value>' was found")
