"""A run's configuration: sections owned and checked by the parts they configure.

A run is described by a nested mapping (a config file's ``ConfigDict`` as a dict, or a
workdir's ``config.json``) with the sections

  run      seed, generations, evaluation and checkpoint cadence   (``RunOptions``, here)
  model    which model to load                                    (``models.loading.Options``)
  es       the ES strategy                                        (``es.options.Options``)
  rollout  how agents play: turns, tokens, sampling, history, skill (``agents.rollout.Options``)
  eval     held-out evaluation                                    (``EvalOptions``, here)
  env      ``name`` plus that environment's own options           (the env's ``Options``)
  rule     ``name`` (es | grpo | none, ``training.rules``) plus that rule's own options
  mesh     the device mesh and parameter sharding rules           (``sharding.MeshOptions``)
  distributed  the processes of a multi-host run                  (``sharding.DistributedOptions``)

``TrainConfig.from_dict`` builds every section and raises one ValueError listing every
problem of every section, before anything is loaded. Every random key of a run (ES noise,
training and evaluation sampling) derives from ``run.seed``. ``mesh``, ``distributed``,
``model.cache_layout`` and the batch sizes ``rollout.batch_size`` and ``eval.batch_size``
say where and how a run runs, not what it computes (``LAYOUT_SECTIONS``,
``LAYOUT_FIELDS``): a workdir resumes under another layout.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

import jax

from agentic_esopt import envs, sharding
from agentic_esopt import options as options_lib
from agentic_esopt.agents import rollout
from agentic_esopt.es import options as es_options
from agentic_esopt.models import loading
from agentic_esopt.training import rules

# Independent key streams derived from the seed (ADAPTER_STREAM: es.scope=lora's A).
ES_STREAM, TRAIN_SAMPLING_STREAM, EVAL_SAMPLING_STREAM, GRPO_SHUFFLE_STREAM = 0, 1, 2, 3
ADAPTER_STREAM = 4


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
    repeats: int = options_lib.field(1, "Episodes per held-out task (independent samples; "
                                        "the reference's Sudoku evaluation uses 3).")
    batch_size: int = options_lib.field(0, "Held-out tasks played together, in turn "
                                           "(0: all of eval.size at once); smaller batches "
                                           "bound evaluation's memory and play the same "
                                           "episodes.")

    def problems(self) -> list[str]:
        problems: list[str] = []
        check = options_lib.checker(problems)
        check(self.size >= 1, f"size must be >= 1, got {self.size}")
        check(self.split in envs.base.EVAL_SPLITS,
              f"split must be one of {envs.base.EVAL_SPLITS} (never the training split), "
              f"got {self.split!r}")
        check(self.temperature >= 0, f"temperature must be >= 0, got {self.temperature}")
        check(self.repeats >= 1, f"repeats must be >= 1, got {self.repeats}")
        check(self.batch_size >= 0, f"batch_size must be >= 0 (0: all tasks at once), "
                                    f"got {self.batch_size}")
        check(self.repeats == 1 or self.temperature > 0,
              f"repeats={self.repeats} of greedy evaluation give the same episodes; set "
              "eval.temperature > 0")
        return problems


SECTIONS = {"run": RunOptions, "model": loading.Options, "es": es_options.Options,
            "rollout": rollout.Options, "eval": EvalOptions,
            "mesh": sharding.MeshOptions, "distributed": sharding.DistributedOptions}
NAMED_SECTIONS = ("env", "rule")  # ``name`` + that environment's / rule's own options
LAYOUT_SECTIONS = ("mesh", "distributed")
# How generation holds its KV cache, and how many tasks it plays at once.
LAYOUT_FIELDS = ("model.cache_layout", "rollout.batch_size", "eval.batch_size")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """A whole run, section by section (see the module docstring)."""

    run: RunOptions
    model: loading.Options
    es: es_options.Options
    rollout: rollout.Options
    eval: EvalOptions
    env_name: str
    env: Any
    rule_name: str
    rule: Any
    mesh: sharding.MeshOptions
    distributed: sharding.DistributedOptions

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> "TrainConfig":
        """Builds and checks every section; ValueError lists every problem found (on one
        line when there is one)."""
        problems = [_unknown_section(name)
                    for name in sorted(set(values) - set(SECTIONS) - set(NAMED_SECTIONS))]
        built = {}
        for name, section_cls in SECTIONS.items():
            built[name], found = options_lib.build(section_cls, values.get(name, {}), name)
            problems += found
        env_values = dict(values.get("env", {}))
        env_name = env_values.pop("name", "sudoku")
        built["env"], found = envs.build_options(env_name, env_values)
        problems += found
        rule_values = dict(values.get("rule", {}))
        rule_name = rule_values.pop("name", "es")
        built["rule"], found = rules.build_options(rule_name, rule_values)
        problems += found
        if not problems:
            problems += _cross_section_problems(built) + rules.config_problems(rule_name, built)
        if len(problems) == 1:
            raise ValueError(f"invalid configuration: {problems[0]}")
        if problems:
            raise ValueError("invalid configuration:\n  " + "\n  ".join(problems))
        return cls(env_name=env_name, rule_name=rule_name, **built)

    def to_dict(self) -> dict[str, Any]:
        """The nested, JSON-serialisable form ``from_dict`` reads back."""
        return {"run": options_lib.as_dict(self.run), "model": options_lib.as_dict(self.model),
                "es": options_lib.as_dict(self.es),
                "rollout": options_lib.as_dict(self.rollout),
                "eval": options_lib.as_dict(self.eval),
                "env": {"name": self.env_name, **options_lib.as_dict(self.env)},
                "rule": {"name": self.rule_name, **options_lib.as_dict(self.rule)},
                "mesh": options_lib.as_dict(self.mesh),
                "distributed": options_lib.as_dict(self.distributed)}

    def replace(self, **sections: Mapping[str, Any]) -> "TrainConfig":
        """A copy with some fields of some sections changed, checked again, e.g.
        ``config.replace(eval={"size": 64}, env={"mask_count": 4})``; naming another
        env or rule starts that section from its defaults."""
        values = self.to_dict()
        for name, changes in sections.items():
            current = values.get(name, {})
            renamed = (name in NAMED_SECTIONS  # another env or rule: its own defaults
                       and changes.get("name", current.get("name")) != current.get("name"))
            values[name] = dict(changes) if renamed else {**current, **changes}
        return TrainConfig.from_dict(values)

    @property
    def splits(self) -> envs.Splits:
        """What the run takes from its environment."""
        return envs.Splits(self.run.seed, self.rollout.tasks_per_generation, self.eval.size,
                           self.eval.split)


def _unknown_section(name: str) -> str:
    if name == "update":
        return ("the update section is called rule: use --config.rule.name=es|grpo|none "
                "and --config.rule.<option> (GRPO's options) in place of --config.update.*")
    return options_lib.unknown(name, [*SECTIONS, *NAMED_SECTIONS], "config section")


def _cross_section_problems(built: Mapping[str, Any]) -> list[str]:
    """Problems that involve more than one section (a rule's own: ``rules``)."""
    warmup, generations = built["es"].sigma_warmup, built["run"].generations
    if warmup >= generations:
        return [f"es.sigma_warmup ({warmup}) must be < run.generations ({generations})"]
    return []


def stream_key(config: TrainConfig, stream: int) -> jax.Array:
    """The key of one of the run's independent streams (``*_STREAM``)."""
    return jax.random.fold_in(jax.random.key(config.run.seed), stream)


def run_key(config: TrainConfig) -> jax.Array:
    """The ES run key (member noise derives from it)."""
    return stream_key(config, ES_STREAM)


def sampling_key(config: TrainConfig, stream: int, generation: int) -> jax.Array:
    """The sampling key of one generation's rollouts; the policy folds in the turn."""
    return jax.random.fold_in(stream_key(config, stream), generation)


def base_evaluation_fingerprint(config: TrainConfig) -> str:
    """What the untrained model's held-out evaluation (generation 0) depends on, as a
    string: every section but the update rule's (``rule``, and ``es`` unless
    ``es.scope=lora`` adds adapters to the evaluated parameters) and the run's length and
    cadence. Runs with one fingerprint evaluate the same parameters on the same tasks with
    the same keys at generation 0, so one of them can stand for the others
    (``training.train``'s ``base_evaluation``)."""
    sections = config.to_dict()
    del sections["rule"]
    if sections["es"]["scope"] != "lora":
        del sections["es"]
    sections["run"] = {"seed": sections["run"]["seed"]}
    return json.dumps(sections, sort_keys=True)
