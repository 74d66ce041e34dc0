"""The Sudoku action parser: known strings parse right; nothing ever raises."""

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentic_esopt.envs.sudoku import ParseError, SetAction, parse_set_action


@pytest.mark.parametrize("text, expected", [
    ("set 3 4 5", (3, 4, 5)),
    ("SET 3 4 5", (3, 4, 5)),
    ("  Set   3\t4\n5  ", (3, 4, 5)),
    ("set 3, 4, 5", (3, 4, 5)),
    ("set(3,4,5)", (3, 4, 5)),
    ("set [3 4 5]", (3, 4, 5)),
    ("set: 3 4 5.", (3, 4, 5)),
    ("I'll play set 3 4 5 because it fits.", (3, 4, 5)),
    ("<answer>set 3 4 5</answer>", (3, 4, 5)),
    ("<answer><answer>set 1 2 3</answer></answer>", (1, 2, 3)),
    ("First set 1 1 1, no wait: set 2 2 2", (2, 2, 2)),
    ("set 1 1 1\nset 9 9 9", (9, 9, 9)),
    ("set 10 1 1", (10, 1, 1)),
    ("set -1 2 3", (-1, 2, 3)),
    ("set 007 1 1", (7, 1, 1)),
    ("set 1 2 3 then set 4 5 99999999999999999999", (1, 2, 3)),
])
def test_known_strings(text, expected):
    assert parse_set_action(text) == SetAction(*expected)


@pytest.mark.parametrize("text", [
    "", "set", "set 1 2", "set 1 2 x", "reset 1 2 3", "set 123", "place 1 2 3",
    "set ３ ４ ５",  # full-width digits are not ASCII digits
    "set 1 2 99999999999999999999",
    None, 42, b"set 1 2 3",
])
def test_rejections_are_parse_errors_with_a_reason(text):
    result = parse_set_action(text)
    assert isinstance(result, ParseError) and result.reason


def test_overlong_numbers_have_their_own_reason():
    assert "too large" in parse_set_action("set 1 1 " + "9" * 5000).reason
    assert "no command" in parse_set_action("nothing here").reason


HOSTILE = st.one_of(
    st.text(),
    st.binary().map(lambda b: b.decode("latin-1")),
    st.lists(st.sampled_from(["set", " ", "<answer>", "</answer>", "(", ",", "-", "\x00",
                              "9" * 50, "1", "\u0663", "\ud800", "ſet", "\n", "]"]),
             max_size=60).map("".join),
    st.integers().map(lambda n: f"set {n} {n} {n}"),
)


@settings(max_examples=300, deadline=None)
@given(HOSTILE)
def test_never_raises(text):
    result = parse_set_action(text)
    assert isinstance(result, (SetAction, ParseError))
    if isinstance(result, SetAction):
        assert all(abs(v) < 10 ** 9 for v in (result.row, result.col, result.value))


@settings(max_examples=100, deadline=None)
@given(st.text(), st.integers(1, 9), st.integers(1, 9), st.integers(1, 9))
def test_a_trailing_command_wins_over_any_prefix(prefix, row, col, value):
    assert parse_set_action(f"{prefix}\nset {row} {col} {value}") == SetAction(row, col, value)


def test_very_long_inputs_are_fast():
    start = time.perf_counter()
    near_misses = "set 1 " * 200_000 + "\x00" * 100_000 + "set 1 2 " + "9" * 100_000
    assert isinstance(parse_set_action(near_misses), ParseError)
    nested = "<a>" * 100_000 + "set 4 5 6" + "</a>" * 100_000
    assert parse_set_action(nested) == SetAction(4, 5, 6)
    assert time.perf_counter() - start < 2.0
