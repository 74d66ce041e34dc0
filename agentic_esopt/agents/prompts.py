"""Chat-message construction for multi-turn agents (lists of {"role", "content"} dicts).

A conversation is ``[system?] + [user: first observation] + turns``, where a turn is the
agent's reply (assistant) followed by the environment's answer (user). Functions here are
pure: they return new lists and never modify their inputs.
"""

from __future__ import annotations

Message = dict[str, str]

def initial_messages(system_prompt: str | None, observation: str) -> list[Message]:
    """The opening conversation: an optional system message and the first observation."""
    system = [{"role": "system", "content": system_prompt}] if system_prompt else []
    return system + [{"role": "user", "content": observation}]


def add_turn(messages: list[Message], action: str, observation: str) -> list[Message]:
    """``messages`` followed by the agent's ``action`` and the environment's answer."""
    return messages + [{"role": "assistant", "content": action},
                       {"role": "user", "content": observation}]


def trim_history(messages: list[Message], keep_turns: int | None) -> list[Message]:
    """Keeps the system message, the first observation and the last ``keep_turns`` turns.

    Bounds the prompt for long horizons; observations must therefore restate the state
    (Sudoku's show the whole board). ``0`` keeps only the system message and the latest
    observation (a Markov agent); ``None`` keeps everything.
    """
    if keep_turns is None:
        return list(messages)
    if keep_turns < 0:
        raise ValueError(f"keep_turns must be >= 0 or None, got {keep_turns}")
    opening = 2 if messages and messages[0]["role"] == "system" else 1
    head, turns = messages[:opening], messages[opening:]
    if keep_turns == 0:
        return head[:-1] + [turns[-1]] if turns else list(head)
    return head + turns[max(0, len(turns) - 2 * keep_turns):]


def plain_prompt(messages: list[Message]) -> str:
    """The messages' texts joined as they are, with no chat template (a base model's
    prompt: system text, then the observation, then each reply and answer)."""
    return "".join(message["content"] for message in messages)
