"""The training configuration: one frozen dataclass, checked field by field before any compute.

Every field carries its help text in ``metadata["help"]``, so launchers can define one flag
per field without repeating the documentation. The run's strategy and every random key
(ES noise, training and evaluation sampling) derive from the config alone.
"""

import dataclasses
import os
import typing
from typing import Any

import jax

from agentic_esopt import es
from agentic_esopt.es import fitness, noise, schedules, strategy
from agentic_esopt.models import loading
from agentic_esopt.training import tasks

EVAL_SPLITS = ("eval", "test")
# Independent key streams derived from the seed.
ES_STREAM, TRAIN_SAMPLING_STREAM, EVAL_SAMPLING_STREAM = 0, 1, 2


def _field(default: Any, help_text: str) -> Any:
    return dataclasses.field(default=default, metadata={"help": help_text})


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Everything that defines an ES training run (see each field's help)."""

    # Environment and tasks.
    env: str = _field("sudoku", "Environment the agent plays.")
    board_size: int = _field(4, "Sudoku board size: 4, 6 or 9.")
    mask_count: int = _field(2, "Blank cells per puzzle (H*, the horizon).")
    partial_credit: bool = _field(False, "Reward the fraction of blanks filled correctly "
                                         "instead of 1/0 for solved/unsolved.")
    list_legal_moves: bool = _field(False, "Sudoku observations list every move that breaks "
                                           "no rule (admissible commands).")
    anchor_path: str | None = _field(None, "Optional folder with train.jsonl and "
                                           "<eval_split>.jsonl puzzles to use instead of "
                                           "generated ones.")
    # Model.
    model: str = _field("tiny", "'tiny', 'smollm2-135m', a .gguf file or a HF checkpoint "
                                "folder.")
    dtype: str = _field("float32", "Parameter dtype: float32, bfloat16 or float16.")
    # Evolution strategy.
    population_size: int = _field(8, "G, perturbed members per generation.")
    noise: str = _field("full", "Perturbation noise: 'full' or 'lowrank'.")
    rank: int = _field(1, "Rank r of low-rank noise.")
    antithetic: bool = _field(False, "Antithetic pairs (+ε, −ε); needs an even population.")
    sigma_schedule: str = _field("cosine", "σ schedule: constant, linear or cosine.")
    sigma_start: float = _field(1e-3, "σ at the start (after warmup).")
    sigma_end: float = _field(2.5e-4, "σ at the last generation (== sigma_start for "
                                      "constant).")
    sigma_warmup: int = _field(0, "Generations of linear σ warmup from 0.")
    learning_rate: float = _field(5e-4, "α, the ES learning rate.")
    optimizer: str = _field("sgd", "Optimizer applied to the ES estimate: sgd (the "
                                   "paper's), adam or adamw.")
    weight_decay: float = _field(0.0, "Decoupled weight decay (adamw only).")
    scale_by_sigma: bool = _field(False, "Divide the ES estimate by σ (the paper does not).")
    fitness: str = _field("zscore", "Reward shaping: zscore, centered_rank or identity.")
    scope: str = _field("full", "Perturbed parameters: 'full', 'all_linear' or a regex "
                                "over parameter paths.")
    # Rollouts.
    generations: int = _field(100, "Number of ES generations T.")
    tasks_per_generation: int = _field(4, "Tasks every member plays each generation.")
    max_turns: int | None = _field(None, "Optional cap on turns per episode (default: the "
                                         "environment's own limit, 3·H* for Sudoku).")
    max_new_tokens: int = _field(32, "Tokens the agent may generate per turn.")
    temperature: float = _field(0.0, "Sampling temperature of training rollouts "
                                     "(0 = greedy).")
    history_turns: int | None = _field(None, "Keep only the last k turns in each prompt "
                                             "(0: only the latest observation; default: "
                                             "all).")
    reply_prefix: str = _field("", "Text that opens every reply (e.g. 'set '); steers small "
                                   "models into the action format.")
    stop_at_newline: bool = _field(False, "End each reply at its first newline.")
    # Held-out evaluation.
    eval_split: str = _field("eval", "Held-out split for evaluation: eval or test.")
    eval_size: int = _field(32, "Held-out tasks per evaluation.")
    eval_every: int = _field(10, "Evaluate the unperturbed parameters every E generations "
                                 "(and at the start and the end).")
    eval_temperature: float = _field(0.0, "Sampling temperature of evaluation rollouts "
                                          "(0 = greedy).")
    # Bookkeeping.
    checkpoint_every: int = _field(5, "Checkpoint every K generations (and at the end).")
    workdir: str = _field("workdirs/run", "Folder for checkpoints, history, metrics and "
                                          "reports; rerunning resumes there.")
    seed: int = _field(0, "Seed of the run: noise, tasks and sampling derive from it.")

    def validate(self, envs: typing.Mapping[str, tasks.EnvSpec] | None = None
                 ) -> "TrainConfig":
        """Checks every field and combination; raises ValueError naming the problem.

        Args:
          envs: the environments available to the trainer (default ``tasks.ENVS``).

        Returns:
          self, so calls can chain.
        """
        problems = _problems(self, tasks.ENVS if envs is None else envs)
        if problems:
            raise ValueError("invalid training configuration:\n  " + "\n  ".join(problems))
        return self

    def to_dict(self) -> dict[str, Any]:
        """The fields as a JSON-serialisable dict."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "TrainConfig":
        """Rebuilds a config from ``to_dict`` output; unknown keys are an error."""
        unknown = sorted(set(values) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise ValueError(f"unknown TrainConfig fields: {unknown}")
        return cls(**values)


def field_types() -> dict[str, type]:
    """Each field's base type (int, float, bool or str), Optional unwrapped."""
    hints = typing.get_type_hints(TrainConfig)
    types = {}
    for name, hint in hints.items():
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        types[name] = args[0] if args else hint
    return types


def optional_fields() -> tuple[str, ...]:
    """Fields that accept None."""
    hints = typing.get_type_hints(TrainConfig)
    return tuple(name for name, hint in hints.items() if type(None) in typing.get_args(hint))


def _has_type(value: Any, expected: type) -> bool:
    """isinstance, except that bools are not numbers and ints are floats."""
    if isinstance(value, bool):
        return expected is bool
    if expected is float:
        return isinstance(value, (int, float))
    return isinstance(value, expected)


def _type_problems(config: TrainConfig) -> list[str]:
    optional = optional_fields()
    return [f"{name} must be {expected.__name__}, got {getattr(config, name)!r}"
            for name, expected in field_types().items()
            if not (getattr(config, name) is None and name in optional)
            and not _has_type(getattr(config, name), expected)]


def _problems(c: TrainConfig, envs: typing.Mapping[str, tasks.EnvSpec]) -> list[str]:
    """Every problem with ``c`` (empty if valid)."""
    problems = _type_problems(c)
    if problems:  # Range checks below assume the types are right.
        return problems

    def check(condition: bool, message: str) -> None:
        if not condition:
            problems.append(message)

    check(c.env in envs, f"unknown env {c.env!r}; choose one of {sorted(envs)}")
    if c.env in envs:
        problems.extend(envs[c.env].problems(c))
    check(bool(c.model), "model must name a model")
    if c.model and c.model != "tiny" and c.model not in loading.GGUF_NAMES:
        check(os.path.exists(c.model),
              f"model {c.model!r} is not 'tiny', one of {loading.GGUF_NAMES}, or an "
              "existing .gguf file / checkpoint folder")
    check(c.dtype in loading.DTYPES,
          f"unknown dtype {c.dtype!r}; choose one of {tuple(loading.DTYPES)}")
    check(c.population_size >= 2, f"population_size must be >= 2, got {c.population_size}")
    check(not (c.antithetic and c.population_size % 2),
          f"antithetic sampling needs an even population_size, got {c.population_size}")
    check(c.noise in noise.NOISE_MODES,
          f"unknown noise {c.noise!r}; choose one of {noise.NOISE_MODES}")
    check(c.rank >= 1, f"rank must be >= 1, got {c.rank}")
    check(not (c.rank > 1 and c.noise == "full"),
          f"rank={c.rank} only applies to noise='lowrank'; use rank=1 with full noise")
    check(c.sigma_schedule in schedules.KINDS,
          f"unknown sigma_schedule {c.sigma_schedule!r}; choose one of {schedules.KINDS}")
    check(c.sigma_start > 0, f"sigma_start must be > 0, got {c.sigma_start}")
    check(c.sigma_end >= 0, f"sigma_end must be >= 0, got {c.sigma_end}")
    check(not (c.sigma_schedule == "constant" and c.sigma_end != c.sigma_start),
          f"a constant σ schedule has no end value: set sigma_end = sigma_start "
          f"({c.sigma_start}), got {c.sigma_end}")
    check(c.sigma_warmup >= 0, f"sigma_warmup must be >= 0, got {c.sigma_warmup}")
    check(c.generations < 1 or c.sigma_warmup < c.generations,
          f"sigma_warmup ({c.sigma_warmup}) must be < generations ({c.generations})")
    check(c.learning_rate > 0, f"learning_rate must be > 0, got {c.learning_rate}")
    check(c.optimizer in strategy.OPTIMIZERS,
          f"unknown optimizer {c.optimizer!r}; choose one of {strategy.OPTIMIZERS}")
    check(c.weight_decay >= 0, f"weight_decay must be >= 0, got {c.weight_decay}")
    check(not (c.weight_decay > 0 and c.optimizer != "adamw"),
          f"weight_decay only applies to optimizer='adamw', got optimizer={c.optimizer!r}")
    check(c.fitness in fitness.SHAPERS,
          f"unknown fitness {c.fitness!r}; choose one of {tuple(fitness.SHAPERS)}")
    try:
        noise.validate_scope(c.scope)
    except ValueError as e:
        problems.append(str(e))
    check(c.generations >= 1, f"generations must be >= 1, got {c.generations}")
    check(c.tasks_per_generation >= 1,
          f"tasks_per_generation must be >= 1, got {c.tasks_per_generation}")
    check(c.max_turns is None or c.max_turns >= 1, f"max_turns must be >= 1, got {c.max_turns}")
    check(c.max_new_tokens >= 1, f"max_new_tokens must be >= 1, got {c.max_new_tokens}")
    check(c.temperature >= 0, f"temperature must be >= 0, got {c.temperature}")
    check(c.history_turns is None or c.history_turns >= 0,
          f"history_turns must be >= 0, got {c.history_turns}")
    check(c.eval_split in EVAL_SPLITS,
          f"eval_split must be one of {EVAL_SPLITS} (never the training split), got "
          f"{c.eval_split!r}")
    check(c.eval_size >= 1, f"eval_size must be >= 1, got {c.eval_size}")
    check(c.eval_every >= 1, f"eval_every must be >= 1, got {c.eval_every}")
    check(c.eval_temperature >= 0, f"eval_temperature must be >= 0, got {c.eval_temperature}")
    check(c.checkpoint_every >= 1, f"checkpoint_every must be >= 1, got {c.checkpoint_every}")
    check(bool(c.workdir), "workdir must be a folder path")
    check(c.seed >= 0, f"seed must be >= 0, got {c.seed}")
    return problems


def make_strategy(config: TrainConfig) -> es.Strategy:
    """The ES strategy a config describes (σ schedule over ``generations``)."""
    sigma = schedules.Schedule(config.sigma_schedule, config.sigma_start, config.sigma_end,
                               config.generations, config.sigma_warmup)
    return es.agentic_esopt(population_size=config.population_size, sigma=sigma,
                            learning_rate=config.learning_rate, noise=config.noise,
                            rank=config.rank, antithetic=config.antithetic,
                            fitness=config.fitness, scope=config.scope,
                            optimizer=config.optimizer, weight_decay=config.weight_decay,
                            scale_by_sigma=config.scale_by_sigma)


def run_key(config: TrainConfig) -> jax.Array:
    """The ES run key (member noise derives from it)."""
    return jax.random.fold_in(jax.random.key(config.seed), ES_STREAM)


def sampling_key(config: TrainConfig, stream: int, generation: int) -> jax.Array:
    """The sampling key of one generation's rollouts; the policy folds in the turn."""
    return jax.random.fold_in(jax.random.fold_in(jax.random.key(config.seed), stream),
                              generation)


def policy_options(config: TrainConfig) -> dict[str, Any]:
    """The rollout options ``agents.make_model_policy`` takes from a config."""
    return dict(max_new_tokens=config.max_new_tokens, history_turns=config.history_turns,
                reply_prefix=config.reply_prefix,
                stop=("\n",) if config.stop_at_newline else ())
