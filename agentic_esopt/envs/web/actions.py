"""Reading one browser action from a model's reply, tolerantly.

Two formats. BrowserGym's high-level actions: ``click('13')``, ``fill('16', 'cierra')``,
``select_option('7', 'Red')``, ``press('16', 'Enter')``, ``scroll(0, 200)``,
``send_msg_to_user('42')``... WebRL's (the reference's): ``do(action="Click",
element="13")``, ``do(action="Type", argument="cierra", element="16")``,
``exit(message="42")``. Both become the same canonical BrowserGym call string, rebuilt
from the parsed literal arguments only (nothing of the reply is executed). The last
well-formed call in the reply counts; anything unreadable is a ``ParseError`` whose reason
is shown to the agent.
"""

from __future__ import annotations

import ast
import dataclasses
import re
import warnings
from typing import Any

FORMATS = ("browsergym", "webrl")
MAX_REPLY_CHARS = 20_000
MAX_ARGUMENT_CHARS = 2_000
SCROLL_PIXELS = 300

# name -> (parameters, how many are required); bid parameters are element ids.
BROWSERGYM_ACTIONS = {
    "click": (("bid",), 1), "dblclick": (("bid",), 1), "hover": (("bid",), 1),
    "focus": (("bid",), 1), "clear": (("bid",), 1), "check": (("bid",), 1),
    "uncheck": (("bid",), 1), "fill": (("bid", "value"), 2),
    "select_option": (("bid", "options"), 2), "press": (("bid", "key_comb"), 2),
    "scroll": (("delta_x", "delta_y"), 2), "noop": (("wait_ms",), 0),
    "send_msg_to_user": (("text",), 1), "report_infeasible": (("reason",), 1),
    "go_back": ((), 0), "go_forward": ((), 0), "goto": (("url",), 1),
}
WEBRL_ACTIONS = {"do": (("action", "argument", "element"), 1), "exit": (("message",), 0)}
# WebRL's do(action=...) -> (BrowserGym action, takes the element, takes the argument).
WEBRL_OPERATIONS = {
    "click": ("click", True, False), "hover": ("hover", True, False),
    "type": ("fill", True, True), "select dropdown option": ("select_option", True, True),
    "press enter": ("press", True, False), "search": ("fill", True, True),
    "scroll down": ("scroll", False, False), "scroll up": ("scroll", False, False),
    "go backward": ("go_back", False, False), "go forward": ("go_forward", False, False),
    "wait": ("noop", False, False),
}


@dataclasses.dataclass(frozen=True)
class Action:
    """A parsed action: canonical BrowserGym ``code`` and the element ids it refers to."""

    code: str
    bids: tuple[str, ...]
    answer: str | None = None  # the message of send_msg_to_user / exit


@dataclasses.dataclass(frozen=True)
class ParseError:
    """Why no action could be read; shown to the agent."""

    reason: str


def _call_spans(text: str, names: dict[str, Any]) -> list[tuple[str, str]]:
    """(name, argument text) of every ``name(...)`` in ``text`` with balanced parentheses
    outside string literals, in order."""
    pattern = re.compile(r"(?<![\w.])(" + "|".join(map(re.escape, names)) + r")\s*\(")
    spans = []
    for match in pattern.finditer(text):
        depth, quote, escaped = 1, None, False
        for i in range(match.end(), len(text)):
            char = text[i]
            if quote:
                if escaped:
                    escaped = False
                elif char == "\\":
                    escaped = True
                elif char == quote:
                    quote = None
            elif char in "'\"":
                quote = char
            elif char == "(":
                depth += 1
            elif char == ")":
                depth -= 1
                if depth == 0:
                    spans.append((match.group(1), text[match.end():i]))
                    break
    return spans


def _literal(node: ast.AST) -> Any:
    """A string, number or list of strings from a literal node; ValueError otherwise."""
    value = ast.literal_eval(node)
    if isinstance(value, bool) or not isinstance(value, (str, int, float, list, tuple)):
        raise ValueError("arguments must be strings or numbers")
    if isinstance(value, (list, tuple)) and not all(isinstance(v, str) for v in value):
        raise ValueError("a list argument must hold strings")
    if len(repr(value)) > MAX_ARGUMENT_CHARS:
        raise ValueError(f"an argument is longer than {MAX_ARGUMENT_CHARS} characters")
    return list(value) if isinstance(value, tuple) else value


def _arguments(name: str, argument_text: str, table: dict) -> dict[str, Any]:
    """The call's arguments by parameter name; ValueError with the reason otherwise."""
    parameters, required = table[name]
    try:
        with warnings.catch_warnings():  # "\," in a model's string is not our warning
            warnings.simplefilter("ignore", (DeprecationWarning, SyntaxWarning))
            call = ast.parse(f"f({argument_text})", mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError) as error:
        raise ValueError(f"the arguments of {name}(...) are not valid literals") from error
    if len(call.args) > len(parameters):
        raise ValueError(f"{name} takes at most {len(parameters)} arguments")
    values = dict(zip(parameters, map(_literal, call.args)))
    for keyword in call.keywords:
        if keyword.arg not in parameters:
            raise ValueError(f"{name} has no argument {keyword.arg!r}")
        values[keyword.arg] = _literal(keyword.value)
    missing = [p for p in parameters[:required] if p not in values]
    if missing:
        raise ValueError(f"{name} needs {', '.join(missing)}")
    return values


def _element(value: Any) -> str:
    """An element id (bids are strings; a bare number is accepted)."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, (str, int)) or not str(value).strip():
        raise ValueError("an element id must be a string such as '13'")
    return str(value).strip()


def _browsergym_action(name: str, values: dict[str, Any]) -> Action:
    """The canonical call; bids and texts checked and normalised."""
    if "bid" in values:
        values["bid"] = _element(values["bid"])
    bids = (values["bid"],) if "bid" in values else ()
    for key in ("value", "key_comb", "text", "reason", "url"):
        if key in values and not isinstance(values[key], str):
            values[key] = str(values[key])
    for key in ("delta_x", "delta_y", "wait_ms"):
        if key in values and not isinstance(values[key], (int, float)):
            raise ValueError(f"{name}'s {key} must be a number")
    if name == "select_option" and not isinstance(values["options"], (str, list)):
        values["options"] = str(values["options"])
    code = f"{name}({', '.join(repr(v) for v in values.values())})"
    answer = values.get("text") if name == "send_msg_to_user" else None
    return Action(code, bids, answer)


def _webrl_action(name: str, values: dict[str, Any]) -> Action:
    """A WebRL ``do``/``exit`` call mapped onto BrowserGym actions."""
    if name == "exit":
        message = str(values.get("message", ""))
        return _browsergym_action("send_msg_to_user", {"text": message})
    operation = str(values["action"]).strip().lower()
    if operation not in WEBRL_OPERATIONS:
        choices = ", ".join(o.title() for o in WEBRL_OPERATIONS)
        raise ValueError(f"unknown do(action={values['action']!r}); use one of {choices}")
    target, takes_element, takes_argument = WEBRL_OPERATIONS[operation]
    arguments: dict[str, Any] = {}
    if takes_element:
        if "element" not in values:
            raise ValueError(f'do(action="{values["action"]}") needs element="<id>"')
        arguments["bid"] = values["element"]
    if takes_argument:
        if "argument" not in values:
            raise ValueError(f'do(action="{values["action"]}") needs argument="..."')
        arguments["value" if target == "fill" else "options"] = values["argument"]
    if operation == "press enter":
        arguments["key_comb"] = "Enter"
    if operation.startswith("scroll"):
        arguments = {"delta_x": 0, "delta_y": SCROLL_PIXELS * (1 if "down" in operation else -1)}
    action = _browsergym_action(target, arguments)
    if operation == "search":  # type, then submit
        action = Action(f"{action.code}\npress({action.bids[0]!r}, 'Enter')", action.bids)
    return action


def parse_action(text: Any, action_format: str = "browsergym") -> Action | ParseError:
    """The last well-formed action in ``text`` (any value; never raises)."""
    if not isinstance(text, str):
        return ParseError(f"expected text, got {type(text).__name__}")
    table, build = ((BROWSERGYM_ACTIONS, _browsergym_action) if action_format == "browsergym"
                    else (WEBRL_ACTIONS, _webrl_action))
    reason = None
    for name, argument_text in reversed(_call_spans(text[:MAX_REPLY_CHARS], table)):
        try:
            return build(name, _arguments(name, argument_text, table))
        except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError) as error:
            reason = reason or str(error) or "the action's arguments could not be read"
    if reason:
        return ParseError(reason)
    examples = ("click('13') or fill('16', 'text')" if action_format == "browsergym"
                else 'do(action="Click", element="13") or exit(message="...")')
    return ParseError(f"no action was found; write one action such as {examples}")
