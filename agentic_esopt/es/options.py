"""The settings of ES: the keyword set every strategy factory takes, and the es section.

``Settings`` is the one keyword set of every strategy factory
(``factory(population_size, sigma, learning_rate, **keywords)``); ``Options`` is a
config file's ``es`` section, which adds the strategy's name and the LoRA options and
gives σ's schedule as fields. ``keywords(options, generations)`` and
``spec_keywords(spec)`` turn the section and a recorded ``Strategy.spec`` into that
keyword set, and ``settings_problems`` checks it for the factories and the config alike.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import optax

from agentic_esopt import options as options_lib
from agentic_esopt.es import fitness as fitness_lib
from agentic_esopt.es import noise as noise_lib
from agentic_esopt.es import schedules
from agentic_esopt.es import update as update_lib

OPTIMIZERS = ("sgd", "adam", "adamw")
DEFAULT_STRATEGY = "agentic_esopt"
_LORA_FIELDS = ("lora_rank", "lora_alpha", "lora_targets")
_RULE_FIELDS = ("task_normalised",)  # Read by the training rule, not the strategy.


def named_optimizer(name: str, learning_rate: schedules.Schedule,
                    weight_decay: float) -> optax.GradientTransformation:
    """The optax transformation called ``name`` (one of ``OPTIMIZERS``)."""
    if name == "adamw":
        return optax.adamw(learning_rate, weight_decay=weight_decay)
    return {"sgd": optax.sgd, "adam": optax.adam}[name](learning_rate)


def settings_problems(*, population_size: int, noise: str, rank: int, antithetic: bool,
                      scope: str, sigma_schedule: str, sigma_start: float, sigma_end: float,
                      sigma_warmup: int, learning_rate: float | None,
                      optimizer: str | optax.GradientTransformation, weight_decay: float,
                      fitness: str, rounding: str = "nearest",
                      master_weights: bool = False,
                      update_block_bytes: int = update_lib.UPDATE_BLOCK_BYTES) -> list[str]:
    """Every problem of a set of ES settings (the trainer checks σ warmup < generations).

    Args:
      population_size, noise, rank, antithetic, scope: as in ``Settings``.
      sigma_schedule, sigma_start, sigma_end, sigma_warmup: σ's schedule kind and fields.
      learning_rate: α at the start, or None (only with an optax transformation).
      optimizer: one of ``OPTIMIZERS`` or an optax transformation.
      weight_decay: decoupled weight decay (adamw only).
      fitness: one of ``fitness.SHAPERS``.
      rounding: one of ``update.ROUNDINGS``, how updated low-precision leaves round.
      master_weights: keep float32 copies of low-precision leaves.
      update_block_bytes: ``update.Mode.block_bytes``, an int >= 0.
    """
    problems: list[str] = []
    check = options_lib.checker(problems)
    check(population_size >= 2, f"population_size must be >= 2 (z-scores of one member are "
                                f"meaningless), got {population_size}")
    check(not (antithetic and population_size % 2),
          f"antithetic sampling needs an even population_size, got {population_size}")
    check(noise in noise_lib.NOISE_MODES,
          f"noise: unknown {noise!r}; choose one of {noise_lib.NOISE_MODES}")
    check(rank >= 1, f"rank must be >= 1, got {rank}")
    check(not (rank > 1 and noise == "full"),
          f"rank={rank} only applies to noise='lowrank'; use rank=1 with full noise")
    try:
        noise_lib.validate_scope(scope)
    except ValueError as error:
        problems.append(f"scope: {error}")
    check(sigma_schedule in schedules.KINDS,
          f"sigma_schedule: unknown {sigma_schedule!r}; choose one of {schedules.KINDS}")
    check(sigma_start > 0, f"sigma_start must be > 0, got {sigma_start}")
    check(sigma_end >= 0, f"sigma_end must be >= 0, got {sigma_end}")
    check(not (sigma_schedule == "constant" and sigma_end != sigma_start),
          f"sigma_end: a constant σ schedule has no end value; set sigma_end = "
          f"sigma_start ({sigma_start}), got {sigma_end}")
    check(sigma_warmup >= 0, f"sigma_warmup must be >= 0, got {sigma_warmup}")
    custom = isinstance(optimizer, optax.GradientTransformation)
    check(custom or optimizer in OPTIMIZERS,
          f"optimizer: unknown {optimizer!r}; choose one of {OPTIMIZERS} or pass an "
          "optax.GradientTransformation")
    check(custom or learning_rate is not None,
          "learning_rate is required unless optimizer is an optax transformation")
    check(custom or learning_rate is None or learning_rate > 0,
          f"learning_rate must be > 0, got {learning_rate}")
    check(weight_decay >= 0, f"weight_decay must be >= 0, got {weight_decay}")
    check(not (weight_decay > 0 and optimizer != "adamw"),
          f"weight_decay only applies to optimizer='adamw', got "
          f"{'an optax transformation' if custom else repr(optimizer)}")
    check(fitness in fitness_lib.SHAPERS,
          f"fitness: unknown {fitness!r}; choose one of {tuple(fitness_lib.SHAPERS)}")
    check(rounding in update_lib.ROUNDINGS,
          f"rounding: unknown {rounding!r}; choose one of {update_lib.ROUNDINGS}")
    check(not (master_weights and rounding == "stochastic"),
          "rounding='stochastic' and master_weights are alternatives: float32 master "
          "weights are exact, so choose one")
    check(isinstance(update_block_bytes, int) and not isinstance(update_block_bytes, bool)
          and update_block_bytes >= 0,
          f"update_block_bytes must be an int >= 0 (0: whole leaves), got "
          f"{update_block_bytes!r}")
    return problems


@dataclasses.dataclass(frozen=True)
class Settings:
    """The keyword set of every strategy factory, checked (``Settings.of``).

    Attributes:
      population_size: G >= 2, the number of perturbed members per generation.
      sigma: the perturbation scale's schedule over generations.
      learning_rate: α's schedule; None only with a custom optax optimizer.
      noise: "full" (Gaussian ε per leaf) or "lowrank" (E = A Bᵀ/√r for matrices).
      rank: r for low-rank noise.
      antithetic: members 2k and 2k+1 share ε with opposite signs (G must be even).
      fitness: reward shaping, one of ``fitness.SHAPERS``.
      scope: "full", "all_linear", "lora" or a regex over leaf paths: the leaves
        perturbed and updated.
      optimizer: "sgd" (the paper's), "adam", "adamw", or an optax transformation that
        already includes its learning rate. It receives −ĝ as the gradient.
      weight_decay: for "adamw".
      scale_by_sigma: divide the estimate by σ (the reference does not).
      rounding: "nearest" or "stochastic" (unbiased), how updated low-precision leaves
        round (``update.ROUNDINGS``).
      master_weights: keep float32 copies of low-precision leaves in the optimizer state.
      update_block_bytes: SGD updates leaves in place in blocks of rows of at most this
        many float32 bytes (0: whole leaves); bitwise the same, so not in the spec.
    """

    population_size: int
    sigma: schedules.Schedule
    learning_rate: schedules.Schedule | None
    noise: str = "full"
    rank: int = 1
    antithetic: bool = False
    fitness: str = "zscore"
    scope: str = "full"
    optimizer: str | optax.GradientTransformation = "sgd"
    weight_decay: float = 0.0
    scale_by_sigma: bool = False
    rounding: str = "nearest"
    master_weights: bool = False
    update_block_bytes: int = update_lib.UPDATE_BLOCK_BYTES

    @classmethod
    def of(cls, population_size: int, sigma: float | schedules.Schedule,
           learning_rate: float | schedules.Schedule | None,
           optimizer: str | optax.GradientTransformation | None = None,
           **keywords: Any) -> Settings:
        """Checked settings from a factory's arguments (``optimizer=None``: sgd).

        Raises:
          ValueError: listing every problem (``settings_problems``).
        """
        settings = cls(population_size, schedules.as_schedule(sigma),
                       None if learning_rate is None else schedules.as_schedule(learning_rate),
                       optimizer=optimizer or "sgd", **keywords)
        flat = {name: value for name, value in dataclasses.asdict(settings).items()
                if name not in ("sigma", "learning_rate", "scale_by_sigma")}
        problems = settings_problems(
            **flat, sigma_schedule=settings.sigma.kind, sigma_start=settings.sigma.start,
            sigma_end=settings.sigma.end, sigma_warmup=settings.sigma.warmup,
            learning_rate=None if learning_rate is None else settings.learning_rate.start)
        if problems:
            raise ValueError("invalid ES settings:\n  " + "\n  ".join(problems))
        return settings

    @property
    def custom(self) -> bool:
        """Whether ``optimizer`` is an optax transformation given by the caller."""
        return isinstance(self.optimizer, optax.GradientTransformation)

    @property
    def reported_learning_rate(self) -> schedules.Schedule:
        """α's schedule as the metrics report it (0 for a custom optimizer without one)."""
        return schedules.as_schedule(self.learning_rate or 0.0)

    def transformation(self) -> optax.GradientTransformation:
        """The optax transformation applied to −ĝ."""
        if self.custom:
            return self.optimizer
        return named_optimizer(self.optimizer, self.reported_learning_rate, self.weight_decay)

    @property
    def mode(self) -> update_lib.Mode:
        """How the engine applies steps: plain SGD leaf by leaf, others whole (see
        ``es.update``)."""
        return update_lib.Mode(self.optimizer == "sgd", self.rounding, self.master_weights,
                               self.update_block_bytes)

    def spec(self, strategy: str) -> dict:
        """The JSON record of these settings for ``strategy`` (``spec_keywords`` reads it
        back; custom optimizers are recorded as "custom")."""
        return dict(strategy=strategy, population_size=self.population_size,
                    sigma=self.sigma.spec, noise=self.noise, rank=self.rank,
                    antithetic=self.antithetic, scope=self.scope,
                    learning_rate=self.reported_learning_rate.spec, fitness=self.fitness,
                    optimizer="custom" if self.custom else self.optimizer,
                    weight_decay=self.weight_decay, scale_by_sigma=self.scale_by_sigma,
                    rounding=self.rounding, master_weights=self.master_weights)


def keywords(options: Options, generations: int) -> dict[str, Any]:
    """The factory keywords of an ``es`` section, its σ schedule spanning ``generations``."""
    values = {name: value for name, value in dataclasses.asdict(options).items()
              if name not in ("strategy", "sigma_schedule", "sigma_start", "sigma_end",
                              "sigma_warmup", *_LORA_FIELDS, *_RULE_FIELDS)}
    sigma = schedules.Schedule(options.sigma_schedule, options.sigma_start, options.sigma_end,
                               generations, options.sigma_warmup)
    return dict(values, sigma=sigma)


def spec_keywords(spec: dict, optimizer: optax.GradientTransformation | None = None
                  ) -> dict[str, Any]:
    """The factory keywords of a recorded ``Settings.spec`` (custom optimizers must be
    passed again)."""
    values = {name: value for name, value in spec.items() if name != "strategy"}
    values["sigma"] = schedules.Schedule.from_spec(spec["sigma"])
    values["learning_rate"] = schedules.Schedule.from_spec(spec["learning_rate"])
    if spec["optimizer"] == "custom":
        if optimizer is None:
            raise ValueError("this strategy used a custom optax optimizer: pass it again")
        values["optimizer"] = optimizer
    return values


@dataclasses.dataclass(frozen=True)
class Options:
    """The ES settings of a run (a config file's ``es`` section)."""

    strategy: str = options_lib.field(DEFAULT_STRATEGY, "The ES strategy (es.strategies."
                                                        "names(): agentic_esopt, "
                                                        "random_search, or one registered).")
    population_size: int = options_lib.field(8, "G, perturbed members per generation.")
    noise: str = options_lib.field("full", "Perturbation noise: 'full' or 'lowrank'.")
    rank: int = options_lib.field(1, "Rank r of low-rank noise.")
    antithetic: bool = options_lib.field(False, "Antithetic pairs (+ε, −ε); needs an even "
                                                "population.")
    sigma_schedule: str = options_lib.field("cosine", "σ schedule: constant, linear or "
                                                      "cosine.")
    sigma_start: float = options_lib.field(1e-3, "σ at the start (after warmup).")
    sigma_end: float = options_lib.field(2.5e-4, "σ at the last generation (== sigma_start "
                                                 "for constant).")
    sigma_warmup: int = options_lib.field(0, "Generations of linear σ warmup from 0.")
    learning_rate: float = options_lib.field(5e-4, "α, the ES learning rate.")
    optimizer: str = options_lib.field("sgd", "Optimizer on the ES estimate: sgd (the "
                                              "paper's), adam or adamw.")
    weight_decay: float = options_lib.field(0.0, "Decoupled weight decay (adamw only).")
    scale_by_sigma: bool = options_lib.field(False, "Divide the estimate by σ (the paper "
                                                    "does not).")
    fitness: str = options_lib.field("zscore", "Reward shaping: zscore, centered_rank or "
                                               "identity.")
    task_normalised: bool = options_lib.field(
        False, "A member's reward is its mean over the generation's tasks of its reward "
               "z-scored among the members on that task (EGGROLL's group-normalised "
               "fitness), shaped then by `fitness`; false: its mean reward. Episodes only.")
    scope: str = options_lib.field("full", "Perturbed parameters: 'full', 'all_linear', "
                                           "'lora' (LoRA adapters only) or a regex over "
                                           "parameter paths.")
    lora_rank: int = options_lib.field(8, "Rank r of the LoRA adapters (scope 'lora').")
    lora_alpha: float = options_lib.field(8.0, "LoRA alpha: adapters add (alpha / r)·x A B "
                                               "(scope 'lora').")
    lora_targets: str = options_lib.field("q_proj,v_proj", "Comma-separated projections "
                                                           "that get adapters (scope "
                                                           "'lora').")
    rounding: str = options_lib.field("nearest", "How updated bfloat16/float16 parameters "
                                                 "round: nearest or stochastic (unbiased).")
    master_weights: bool = options_lib.field(False, "Keep float32 copies of bfloat16/"
                                                    "float16 parameters in the optimizer "
                                                    "state (exact; +4 bytes per entry).")
    update_block_bytes: int = options_lib.field(
        update_lib.UPDATE_BLOCK_BYTES, "SGD updates low-rank matrices in place a block of "
                                       "rows of at most this many float32 bytes at a time "
                                       "(0: whole leaves); the result is the same bit for "
                                       "bit.")

    @property
    def lora_target_names(self) -> tuple[str, ...]:
        """``lora_targets`` as a tuple of projection names."""
        return tuple(name.strip() for name in self.lora_targets.split(","))

    def problems(self) -> list[str]:
        """Every problem with these settings (``settings_problems``, and the LoRA options';
        whether the targets exist is checked against the model, ``models.lora``)."""
        settings = {name: value for name, value in dataclasses.asdict(self).items()
                    if name not in ("strategy", "scale_by_sigma", *_LORA_FIELDS,
                                    *_RULE_FIELDS)}
        problems = settings_problems(**settings)  # The strategy's name: es.strategies.
        check = options_lib.checker(problems)
        if self.scope != "lora":
            changed = [name for name in _LORA_FIELDS
                       if getattr(self, name) != getattr(Options, name)]
            check(not changed, f"{', '.join(changed)}: LoRA options need scope='lora', got "
                               f"scope={self.scope!r}")
            return problems
        names = self.lora_target_names
        check(self.lora_rank >= 1, f"lora_rank must be >= 1, got {self.lora_rank}")
        check(self.lora_alpha > 0, f"lora_alpha must be > 0, got {self.lora_alpha}")
        check(all(name.isidentifier() for name in names) and len(set(names)) == len(names),
              f"lora_targets must be distinct comma-separated projection names like "
              f"'q_proj,v_proj', got {self.lora_targets!r}")
        return problems
