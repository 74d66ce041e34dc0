"""Benchmark of long-horizon rollouts: KV caches kept across turns versus re-prefilling.

    python -m experiments.bench_rollout --json [--rows=64 --turns=30]

A batch of ``--rows`` episodes runs ``--turns`` turns through the rollout engine's model
policy (chat template, tokenisation, greedy ``models.generate``): each turn appends the
agent's reply (up to ``--reply_tokens`` tokens) and a new observation of about
``--obs_tokens`` tokens (random words) to the conversation. With kept caches a turn feeds
only those new tokens; re-prefilling feeds the whole conversation every turn.

Every turn of the kept-cache episode is timed; a turn's time excludes the tracing and XLA
compilation it triggered (new shape buckets), as ``jax.monitoring`` reports them, and the
total compile time is reported apart. Re-prefilling the whole episode would take hours on
a CPU, so its turns are timed (the same way) at ``--reprefill_turns`` on the same
conversations, ``--reprefill_rows`` rows per call (a fresh cache per call: 16 rows of a
2000-token conversation hold 1.5 GB of float32 SmolLM2 keys and values), and its total is
interpolated linearly between them (a turn's cost grows smoothly with its context). Both
paths must produce the same replies at the timed turns (``replies_match``).
"""

import json
import time

from absl import app, flags
import jax
import numpy as np

from agentic_esopt import models
from agentic_esopt.agents import prompts, rollout

_MODEL = flags.DEFINE_string("model", "smollm2-135m", "Model name or path for models.load.")
_DTYPE = flags.DEFINE_string("dtype", "float32", "Parameter dtype.")
_ROWS = flags.DEFINE_integer("rows", 64, "Episodes in the batch.")
_TURNS = flags.DEFINE_integer("turns", 30, "Turns per episode.")
_OBS_TOKENS = flags.DEFINE_integer("obs_tokens", 40, "Approximate tokens per observation.")
_REPLY_TOKENS = flags.DEFINE_integer("reply_tokens", 16, "Tokens per reply (at most).")
_REPREFILL_TURNS = flags.DEFINE_list("reprefill_turns", ["1", "10", "30"],
                                     "Turns (1-based) at which re-prefilling is timed.")
_REPREFILL_ROWS = flags.DEFINE_integer(
    "reprefill_rows", 16, "Rows re-prefilled per call (each call's fresh cache holds "
    "their whole conversations).")
_JSON = flags.DEFINE_bool("json", False, "Print only the JSON result.")

SYSTEM_PROMPT = "You are an agent. Read each observation and answer with one action."


WORDS = ("page link button form field search result item list cell row column board value "
         "empty filled left right up down open close next back menu title price cart").split()


def observation(tokenizer, rng: np.random.RandomState, tokens: int) -> str:
    """About ``tokens`` tokens of random words."""
    words = []
    while len(tokenizer(" ".join(words), add_special_tokens=False)["input_ids"]) < tokens:
        words.append(WORDS[rng.randint(len(WORDS))])
    return " ".join(words)


COMPILE_EVENTS = ("/jax/core/compile/jaxpr_trace_duration",
                  "/jax/core/compile/jaxpr_to_mlir_module_duration",
                  "/jax/core/compile/backend_compile_duration")
compile_seconds = [0.0]  # Summed by the listener below.


def count_compilation(event: str, duration: float, **_) -> None:
    if event in COMPILE_EVENTS:
        compile_seconds[0] += duration


def timed_turn(policy, conversations) -> tuple[list, float, float]:
    """A turn's replies, its wall time less compilation, and that compilation time."""
    rows = list(range(len(conversations)))
    compiled_before, start = compile_seconds[0], time.perf_counter()
    replies = policy(conversations, rows, [0] * len(rows))
    compiling = compile_seconds[0] - compiled_before
    return replies, time.perf_counter() - start - compiling, compiling


def play(policy, observations) -> tuple[list[list[list[dict]]], list[float], list, float]:
    """Every turn's conversations (before the turn), time and replies; compile time."""
    conversations = [prompts.initial_messages(SYSTEM_PROMPT, obs) for obs in observations[0]]
    history, seconds, replies, compiling = [], [], [], 0.0
    for turn in range(_TURNS.value):
        history.append(conversations)
        turn_replies, elapsed, turn_compiling = timed_turn(policy, conversations)
        seconds.append(elapsed)
        compiling += turn_compiling
        replies.append(turn_replies)
        conversations = [prompts.add_turn(c, r, obs) for c, r, obs in
                         zip(conversations, turn_replies, observations[turn + 1])]
    return history, seconds, replies, compiling


def make_policy(model, keep_kv_cache: bool):
    options = rollout.Options(max_new_tokens=_REPLY_TOKENS.value, keep_kv_cache=keep_kv_cache)
    return rollout.make_model_policy(model, None, options, temperature=0.0, key=None,
                                     generate=models.generate)


def interpolated_total(turns: list[int], seconds: list[float], horizon: int) -> float:
    """Sum over turns 1..horizon of a per-turn time interpolated linearly between samples."""
    return float(np.sum(np.interp(np.arange(1, horizon + 1), turns, seconds)))


def main(argv):
    del argv
    model = models.load(_MODEL.value, _DTYPE.value)
    rng = np.random.RandomState(0)
    observations = [[observation(model.tokenizer, rng, _OBS_TOKENS.value)
                     for _ in range(_ROWS.value)] for _ in range(_TURNS.value + 1)]
    jax.monitoring.register_event_duration_secs_listener(count_compilation)
    history, kept_seconds, kept_replies, kept_compiling = play(make_policy(model, True),
                                                               observations)
    prompt_tokens = [len(model.tokenizer(model.tokenizer.apply_chat_template(
        c[0], add_generation_prompt=True, tokenize=False), add_special_tokens=False)[
            "input_ids"]) for c in history]
    turns = sorted({min(max(int(t), 1), _TURNS.value) for t in _REPREFILL_TURNS.value})
    reprefill, reprefill_compiling, match = {}, 0.0, True
    for turn in turns:
        replies, reprefill[turn] = [], 0.0
        conversations = history[turn - 1]
        for start in range(0, len(conversations), _REPREFILL_ROWS.value):
            part, elapsed, compiling = timed_turn(
                make_policy(model, False), conversations[start:start + _REPREFILL_ROWS.value])
            replies += part
            reprefill[turn] += elapsed
            reprefill_compiling += compiling
        match = match and replies == kept_replies[turn - 1]
    reprefill_total = interpolated_total(turns, [reprefill[t] for t in turns], _TURNS.value)
    kept_total = float(np.sum(kept_seconds))
    result = dict(
        model=_MODEL.value, dtype=_DTYPE.value, rows=_ROWS.value, turns=_TURNS.value,
        obs_tokens=_OBS_TOKENS.value, reply_tokens=_REPLY_TOKENS.value,
        reprefill_rows=_REPREFILL_ROWS.value,
        prompt_tokens_row0={str(t): prompt_tokens[t - 1] for t in turns},
        kept_turn_seconds={str(t): kept_seconds[t - 1] for t in turns},
        kept_turn_seconds_all=kept_seconds,
        reprefill_turn_seconds={str(t): reprefill[t] for t in turns},
        turn_last_over_first=kept_seconds[-1] / kept_seconds[0],
        kept_total_seconds=kept_total,
        kept_compile_seconds=kept_compiling,
        reprefill_compile_seconds=reprefill_compiling,
        reprefill_total_seconds_interpolated=reprefill_total,
        total_speedup=reprefill_total / kept_total,
        last_turn_speedup=reprefill[turns[-1]] / kept_seconds[turns[-1] - 1],
        replies_match=bool(match))
    print(json.dumps(result, indent=None if _JSON.value else 2))


if __name__ == "__main__":
    app.run(main)
