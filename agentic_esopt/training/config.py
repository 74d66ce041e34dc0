"""A run's configuration: sections owned and checked by the parts they configure.

A run is described by a nested mapping (a config file's ``ConfigDict`` as a dict, or a
workdir's ``config.json``) with the sections

  run      seed, generations, evaluation and checkpoint cadence   (``RunOptions``, here)
  model    which model to load                                    (``models.loading.Options``)
  es       the ES strategy                                        (``es.strategy.Options``)
  rollout  how agents play: turns, tokens, sampling, history, skill (``agents.rollout.Options``)
  eval     held-out evaluation                                    (``EvalOptions``, here)
  env      ``name`` plus that environment's own options           (the env's ``Options``)
  update   the update rule: ``name`` = es | grpo | none, GRPO's settings (``UpdateOptions``)
  mesh     the device mesh and parameter sharding rules           (``sharding.MeshOptions``)
  distributed  the processes of a multi-host run                  (``sharding.DistributedOptions``)

``TrainConfig.from_dict`` builds every section and raises one ValueError listing every
problem of every section, before anything is loaded. Every random key of a run (ES noise,
training and evaluation sampling) derives from ``run.seed``. ``mesh`` and ``distributed``
say where a run runs, not what it computes (``LAYOUT_SECTIONS``): a workdir resumes under
another layout.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax

from agentic_esopt import envs, sharding
from agentic_esopt import options as options_lib
from agentic_esopt.agents import rollout
from agentic_esopt.es import strategy as es_strategy
from agentic_esopt.models import loading

# Independent key streams derived from the seed.
ES_STREAM, TRAIN_SAMPLING_STREAM, EVAL_SAMPLING_STREAM, GRPO_SHUFFLE_STREAM = 0, 1, 2, 3
UPDATE_RULES = ("es", "grpo", "none")


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """The run's length, seed and bookkeeping cadence."""

    seed: int = options_lib.field(0, "Seed of the run: noise, tasks and sampling derive "
                                     "from it.")
    generations: int = options_lib.field(100, "Number of generations T.")
    eval_every: int = options_lib.field(10, "Evaluate the unperturbed parameters every E "
                                            "generations (and at the start and the end).")
    checkpoint_every: int = options_lib.field(5, "Checkpoint every K generations (and at "
                                                 "the end).")

    def problems(self) -> list[str]:
        problems: list[str] = []
        check = options_lib.checker(problems)
        check(self.seed >= 0, f"seed must be >= 0, got {self.seed}")
        check(self.generations >= 1, f"generations must be >= 1, got {self.generations}")
        check(self.eval_every >= 1, f"eval_every must be >= 1, got {self.eval_every}")
        check(self.checkpoint_every >= 1,
              f"checkpoint_every must be >= 1, got {self.checkpoint_every}")
        return problems


@dataclasses.dataclass(frozen=True)
class EvalOptions:
    """Held-out evaluation."""

    size: int = options_lib.field(32, "Held-out tasks (or instances) per evaluation.")
    split: str = options_lib.field("eval", "Held-out split: eval or test.")
    temperature: float = options_lib.field(0.0, "Sampling temperature of evaluation "
                                                "rollouts (0 = greedy).")

    def problems(self) -> list[str]:
        problems: list[str] = []
        check = options_lib.checker(problems)
        check(self.size >= 1, f"size must be >= 1, got {self.size}")
        check(self.split in envs.base.EVAL_SPLITS,
              f"split must be one of {envs.base.EVAL_SPLITS} (never the training split), "
              f"got {self.split!r}")
        check(self.temperature >= 0, f"temperature must be >= 0, got {self.temperature}")
        return problems


@dataclasses.dataclass(frozen=True)
class UpdateOptions:
    """Which update rule turns rewards into new parameters, and GRPO's settings (the
    ``es`` section configures ES)."""

    name: str = options_lib.field("es", "es (the population update), grpo (the policy-"
                                        "gradient baseline) or none (the unperturbed "
                                        "policy acts, nothing is learned).")
    group_size: int = options_lib.field(8, "GRPO: sampled episodes per task (G); tasks per "
                                           "step are rollout.tasks_per_generation.")
    learning_rate: float = options_lib.field(1e-6, "GRPO: AdamW learning rate.")
    weight_decay: float = options_lib.field(0.0, "GRPO: AdamW decoupled weight decay.")
    clip_epsilon: float = options_lib.field(0.2, "GRPO: ratio clip ε, ρ ∈ [1-ε, 1+ε].")
    kl_beta: float = options_lib.field(1e-3, "GRPO: weight β of the k3 KL estimate against "
                                             "the frozen initial parameters.")
    minibatch_size: int = options_lib.field(8, "GRPO: turns (prompt + reply sequences) per "
                                               "optimiser step.")
    epochs: int = options_lib.field(1, "GRPO: passes over a step's turns.")
    max_grad_norm: float = options_lib.field(1.0, "GRPO: clip the gradient's global norm "
                                                  "(0 = off).")
    remat: bool = options_lib.field(True, "GRPO: recompute layer activations in the "
                                          "backward pass (gradient checkpointing).")

    def problems(self) -> list[str]:
        problems: list[str] = []
        check = options_lib.checker(problems)
        check(self.name in UPDATE_RULES,
              f"name: unknown update rule {self.name!r}; choose one of {UPDATE_RULES}")
        check(self.group_size >= 2, f"group_size must be >= 2 (advantages compare samples "
                                    f"of a task), got {self.group_size}")
        check(self.learning_rate > 0, f"learning_rate must be > 0, got {self.learning_rate}")
        check(self.weight_decay >= 0, f"weight_decay must be >= 0, got {self.weight_decay}")
        check(self.clip_epsilon > 0, f"clip_epsilon must be > 0, got {self.clip_epsilon}")
        check(self.kl_beta >= 0, f"kl_beta must be >= 0, got {self.kl_beta}")
        check(self.minibatch_size >= 1,
              f"minibatch_size must be >= 1, got {self.minibatch_size}")
        check(self.epochs >= 1, f"epochs must be >= 1, got {self.epochs}")
        check(self.max_grad_norm >= 0,
              f"max_grad_norm must be >= 0, got {self.max_grad_norm}")
        return problems


SECTIONS = {"run": RunOptions, "model": loading.Options, "es": es_strategy.Options,
            "rollout": rollout.Options, "eval": EvalOptions, "update": UpdateOptions,
            "mesh": sharding.MeshOptions, "distributed": sharding.DistributedOptions}
LAYOUT_SECTIONS = ("mesh", "distributed")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """A whole run, section by section (see the module docstring)."""

    run: RunOptions
    model: loading.Options
    es: es_strategy.Options
    rollout: rollout.Options
    eval: EvalOptions
    env_name: str
    env: Any
    update: UpdateOptions
    mesh: sharding.MeshOptions
    distributed: sharding.DistributedOptions

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> "TrainConfig":
        """Builds and checks every section; ValueError lists every problem found."""
        problems = [f"unknown config section {name!r}; sections are "
                    f"{sorted([*SECTIONS, 'env'])}"
                    for name in sorted(set(values) - set(SECTIONS) - {"env"})]
        built = {}
        for name, section_cls in SECTIONS.items():
            built[name], found = options_lib.build(section_cls, values.get(name, {}), name)
            problems += found
        env_values = dict(values.get("env", {}))
        env_name = env_values.pop("name", "sudoku")
        built["env"], found = envs.build_options(env_name, env_values)
        problems += found
        if not problems:
            problems += _cross_section_problems(built)
        if problems:
            raise ValueError("invalid configuration:\n  " + "\n  ".join(problems))
        return cls(env_name=env_name, **built)

    def to_dict(self) -> dict[str, Any]:
        """The nested, JSON-serialisable form ``from_dict`` reads back."""
        return {"run": options_lib.as_dict(self.run), "model": options_lib.as_dict(self.model),
                "es": options_lib.as_dict(self.es),
                "rollout": options_lib.as_dict(self.rollout),
                "eval": options_lib.as_dict(self.eval),
                "env": {"name": self.env_name, **options_lib.as_dict(self.env)},
                "update": options_lib.as_dict(self.update),
                "mesh": options_lib.as_dict(self.mesh),
                "distributed": options_lib.as_dict(self.distributed)}

    def replace(self, **sections: Mapping[str, Any]) -> "TrainConfig":
        """A copy with some fields of some sections changed, checked again, e.g.
        ``config.replace(eval={"size": 64}, env={"mask_count": 4})``."""
        values = self.to_dict()
        for name, changes in sections.items():
            values[name] = {**values.get(name, {}), **changes}
        return TrainConfig.from_dict(values)

    @property
    def splits(self) -> envs.Splits:
        """What the run takes from its environment."""
        return envs.Splits(self.run.seed, self.rollout.tasks_per_generation, self.eval.size,
                           self.eval.split)


def _cross_section_problems(built: Mapping[str, Any]) -> list[str]:
    """Problems that involve more than one section."""
    problems: list[str] = []
    warmup, generations = built["es"].sigma_warmup, built["run"].generations
    check = options_lib.checker(problems)
    check(warmup < generations,
          f"es.sigma_warmup ({warmup}) must be < run.generations ({generations})")
    check(built["update"].name != "grpo" or built["rollout"].temperature > 0,
          "update.name=grpo samples a group per task: rollout.temperature must be > 0")
    distributed = built["distributed"]
    processes = distributed.num_processes or 1
    check(built["update"].name != "grpo" or (processes == 1 and not distributed.auto),
          "update.name=grpo runs on one process (its turns are not gathered across hosts)")
    check(built["update"].name != "es" or built["es"].population_size >= processes,
          f"es.population_size ({built['es'].population_size}) must be >= "
          f"distributed.num_processes ({processes}): each process plays its own members")
    return problems


def make_strategy(config: TrainConfig) -> es_strategy.Strategy:
    """The ES strategy of a config (σ schedule over ``run.generations``)."""
    return es_strategy.from_options(config.es, config.run.generations)


def stream_key(config: TrainConfig, stream: int) -> jax.Array:
    """The key of one of the run's independent streams (``*_STREAM``)."""
    return jax.random.fold_in(jax.random.key(config.run.seed), stream)


def run_key(config: TrainConfig) -> jax.Array:
    """The ES run key (member noise derives from it)."""
    return stream_key(config, ES_STREAM)


def sampling_key(config: TrainConfig, stream: int, generation: int) -> jax.Array:
    """The sampling key of one generation's rollouts; the policy folds in the turn."""
    return jax.random.fold_in(stream_key(config, stream), generation)
