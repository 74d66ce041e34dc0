"""GRPO's mathematics: group advantages, turn batches, the clipped loss and AdamW steps
(the rule itself is ``training.rules.grpo``).

Each step samples ``group_size`` episodes of each of the generation's tasks with the
current parameters (the rollouts keep every turn's prompt ids, reply ids and sampling
log-probabilities), scores each episode with its total reward and turns the rewards into
group advantages per task,

    A = (r - mean_group) / (std_group + 1e-6),   0 when std_group < 1e-6,

(std with Bessel's correction, as torch's), the same A for every turn of an episode. Every
turn is a training example (prompt + reply); only generated tokens enter the loss:

    per token  max(-A ρ, -A clip(ρ, 1-ε, 1+ε)) + β (exp(ref - new) - (ref - new) - 1)

with ρ = exp(new - old), ``old`` the rollout's log-probabilities and ``ref`` those of the
frozen initial parameters; the mean over a sequence's generated tokens, then over
sequences. AdamW steps over shuffled mini-batches of turns, ``epochs`` times per step;
the layer scan is rematerialised (``jax.checkpoint``) when ``remat`` is set. Log-
probabilities are of ``log_softmax(logits / T)`` at the rollout temperature T, the
distribution the rollout sampled from before top-k / top-p truncation.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any, NamedTuple

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax

from agentic_esopt.agents import rollout
from agentic_esopt.models import decoder, sampling
from agentic_esopt.models.config import ModelConfig

PyTree = Any
ADVANTAGE_EPSILON = 1e-6
MIN_SEQUENCE_BUCKET = 16


@flax.struct.dataclass
class GRPOState:
    """What a GRPO run checkpoints: the policy, AdamW's state, the frozen reference
    parameters and the number of steps taken."""

    params: PyTree
    opt_state: PyTree
    reference: PyTree
    generation: jax.Array


class Hyper(NamedTuple):
    """The loss's static settings."""

    temperature: float
    clip_epsilon: float
    kl_beta: float
    remat: bool


class Batch(NamedTuple):
    """Left-padded turns, one row each; replies end every row, within the last W slots.

    Attributes:
      tokens: (N, T) int32 prompt + reply ids.
      attention_mask: (N, T) int32, 1 at real tokens.
      loss_mask: (N, W) float32 over the last W tokens, 1 at generated ones (the loss's
        only tokens).
      old_logprobs: (N, W) float32 rollout log-probabilities of the last W tokens (0 where
        not generated).
      advantages: (N,) float32.
    """

    tokens: Any
    attention_mask: Any
    loss_mask: Any
    old_logprobs: Any
    advantages: Any


def group_advantages(rewards: np.ndarray) -> np.ndarray:
    """Advantages of rewards (tasks, G): standardised within each task's group."""
    rewards = np.asarray(rewards, np.float64)
    if rewards.ndim != 2 or rewards.shape[1] < 2:
        raise ValueError(f"rewards must be (tasks, G) with G >= 2, got {rewards.shape}")
    std = rewards.std(axis=1, ddof=1, keepdims=True)
    centred = rewards - rewards.mean(axis=1, keepdims=True)
    return np.where(std < ADVANTAGE_EPSILON, 0.0, centred / (std + ADVANTAGE_EPSILON))


def trajectory_advantages(trajectories: Sequence[rollout.Trajectory], group_size: int
                          ) -> np.ndarray:
    """One advantage per trajectory of a sample-major batch (G samples × tasks)."""
    rewards = np.array([t.total_reward for t in trajectories]).reshape(group_size, -1)
    return group_advantages(rewards.T).T.reshape(-1)


def turn_examples(trajectories: Sequence[rollout.Trajectory], advantages: Sequence[float]
                  ) -> list[tuple[rollout.TurnTokens, float]]:
    """Every turn of every trajectory with its trajectory's advantage."""
    examples = []
    for trajectory, advantage in zip(trajectories, advantages):
        if trajectory.turns is None:
            raise ValueError(f"trajectory of task {trajectory.task_id} has no turn tokens; "
                             f"GRPO needs rollouts with keep_tokens=True")
        examples += [(turn, float(advantage)) for turn in trajectory.turns]
    return examples


def make_batch(examples: Sequence[tuple[rollout.TurnTokens, float]], rows: int,
               pad_id: int) -> Batch:
    """``examples`` left-padded into ``rows`` rows (filler rows have an empty loss mask)
    of bucketed lengths."""
    if len(examples) > rows:
        raise ValueError(f"{len(examples)} examples do not fit {rows} rows")
    length = sampling.bucket(max(len(t.prompt_ids) + len(t.reply_ids) for t, _ in examples),
                             MIN_SEQUENCE_BUCKET)
    window = min(sampling.bucket(max(len(t.reply_ids) for t, _ in examples),
                                 MIN_SEQUENCE_BUCKET), length - 1)
    tokens = np.full((rows, length), pad_id, np.int32)
    attention_mask = np.zeros((rows, length), np.int32)
    attention_mask[len(examples):, -1] = 1  # Filler rows hold one pad token.
    loss_mask = np.zeros((rows, window), np.float32)
    old_logprobs = np.zeros((rows, window), np.float32)
    advantages = np.zeros((rows,), np.float32)
    for row, (turn, advantage) in enumerate(examples):
        ids = [*turn.prompt_ids, *turn.reply_ids]
        tokens[row, length - len(ids):] = ids
        attention_mask[row, length - len(ids):] = 1
        reply = slice(window - len(turn.reply_ids), window)
        loss_mask[row, reply] = 1
        old_logprobs[row, reply] = turn.logprobs
        advantages[row] = advantage
    return Batch(tokens, attention_mask, loss_mask, old_logprobs, advantages)


def token_logprobs(config: ModelConfig, params: PyTree, tokens: jax.Array,
                   attention_mask: jax.Array, temperature: float, window: int,
                   remat: bool = False) -> jax.Array:
    """(N, W) float32 log p(token | the tokens before it) under ``log_softmax(logits / T)``
    of the last W = ``window`` tokens of each row (the head runs on those positions only)."""
    h = decoder.hidden_states(config, params, decoder.no_deltas(params), tokens,
                              attention_mask, remat)[:, -window - 1:-1]
    logits = decoder.lm_head(config, params, decoder.no_deltas(params), h)
    return sampling.logprobs_at(logits, tokens[:, -window:], temperature)


def grpo_loss(params: PyTree, config: ModelConfig, hyper: Hyper, batch: Batch,
              reference: jax.Array) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The clipped-ratio loss plus β·KL (module docstring), and its parts."""
    new = token_logprobs(config, params, batch.tokens, batch.attention_mask,
                         hyper.temperature, batch.loss_mask.shape[1], hyper.remat)
    ratio = jnp.exp(new - batch.old_logprobs)
    advantages = batch.advantages[:, None]
    clipped = jnp.clip(ratio, 1 - hyper.clip_epsilon, 1 + hyper.clip_epsilon)
    policy = jnp.maximum(-advantages * ratio, -advantages * clipped)
    log_ref_ratio = reference - new
    kl = jnp.exp(log_ref_ratio) - log_ref_ratio - 1

    def sequence_mean(per_token):
        mask = batch.loss_mask
        tokens = mask.sum(axis=1)
        means = (per_token * mask).sum(axis=1) / jnp.maximum(tokens, 1)
        has_tokens = (tokens > 0).astype(jnp.float32)
        return (means * has_tokens).sum() / jnp.maximum(has_tokens.sum(), 1)

    loss = sequence_mean(policy + hyper.kl_beta * kl)
    clipped_out = (jnp.abs(ratio - 1) > hyper.clip_epsilon).astype(jnp.float32)
    return loss, dict(policy_loss=sequence_mean(policy), kl=sequence_mean(kl),
                      clip_fraction=sequence_mean(clipped_out), ratio_mean=sequence_mean(ratio))


@functools.partial(jax.jit, static_argnames=("config", "temperature"))
def reference_logprobs(config: ModelConfig, temperature: float, params: PyTree,
                       batch: Batch) -> jax.Array:
    """``token_logprobs`` of a batch under frozen parameters (no gradient)."""
    return token_logprobs(config, params, batch.tokens, batch.attention_mask, temperature,
                          batch.loss_mask.shape[1])


@functools.partial(jax.jit, static_argnames=("config", "hyper", "optimizer"),
                   donate_argnames=("params", "opt_state"))
def train_step(config: ModelConfig, hyper: Hyper, optimizer: optax.GradientTransformation,
               params: PyTree, opt_state: PyTree, batch: Batch, reference: jax.Array
               ) -> tuple[PyTree, PyTree, dict[str, jax.Array]]:
    """One AdamW step on ``grpo_loss`` (params and optimizer state donated); ``reference``
    holds the frozen parameters' log-probabilities of the batch."""
    (loss, parts), grads = jax.value_and_grad(grpo_loss, has_aux=True)(
        params, config, hyper, batch, reference)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    params = optax.apply_updates(params, updates)
    return params, opt_state, dict(loss=loss, grad_norm=optax.tree.norm(grads), **parts)


def make_optimizer(learning_rate: float, weight_decay: float, max_grad_norm: float
                   ) -> optax.GradientTransformation:
    """AdamW (a float32 first moment whatever the params' dtype), after global-norm
    clipping."""
    adamw = optax.adamw(learning_rate, weight_decay=weight_decay, mu_dtype=jnp.float32)
    if max_grad_norm == 0:
        return adamw
    return optax.chain(optax.clip_by_global_norm(max_grad_norm), adamw)


def learn(config: ModelConfig, hyper: Hyper, optimizer: optax.GradientTransformation,
          params: PyTree, opt_state: PyTree, reference_params: PyTree,
          examples: Sequence[tuple[rollout.TurnTokens, float]], rows: int, epochs: int,
          pad_id: int, key: jax.Array) -> tuple[PyTree, PyTree, dict[str, float]]:
    """``epochs`` passes of AdamW steps over mini-batches of ``rows`` turns, in an order
    drawn from ``key`` (per epoch); returns the new params, optimizer state and the mean of
    the steps' metrics."""
    records = []
    for epoch in range(epochs):
        order = np.asarray(jax.random.permutation(jax.random.fold_in(key, epoch),
                                                  len(examples)))
        for start in range(0, len(examples), rows):
            batch = make_batch([examples[i] for i in order[start:start + rows]], rows, pad_id)
            reference = reference_logprobs(config, hyper.temperature, reference_params, batch)
            params, opt_state, metrics = train_step(config, hyper, optimizer, params,
                                                    opt_state, batch, reference)
            records.append(jax.device_get(metrics))
    return params, opt_state, {name: float(np.mean([r[name] for r in records]))
                               for name in records[0]}
