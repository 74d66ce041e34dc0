"""Building blocks of config files: every section filled with its owner's defaults."""

import dataclasses

from ml_collections import config_dict

from agentic_esopt import envs, options
from agentic_esopt.training import config as config_lib
from agentic_esopt.training import rules


def section(record_cls: type, **overrides) -> config_dict.ConfigDict:
    """A ``ConfigDict`` of ``record_cls``'s fields: its defaults, then ``overrides``.

    Fields that may be None become typed placeholders, so a dotted flag can still set them
    (``--config.rollout.max_turns=2``).
    """
    types = options.field_types(record_cls)
    values = {}
    for field in dataclasses.fields(record_cls):
        value = overrides.pop(field.name, field.default)
        kind, optional = types[field.name]
        values[field.name] = (config_dict.placeholder(kind) if value is None and optional
                              else value)
    if overrides:
        raise ValueError(f"{record_cls.__name__} has no fields {sorted(overrides)}")
    return config_dict.ConfigDict(values)


def rule_section(name: str = "es", **overrides) -> config_dict.ConfigDict:
    """The ``rule`` section: ``name`` and that rule's options (defaults, then
    ``overrides``)."""
    rule = section(rules.module(name).Options, **overrides)
    rule.name = name
    return rule


def base_config(env_name: str, **sections) -> config_dict.ConfigDict:
    """Every section of a run on environment ``env_name`` with its defaults; ``sections`` maps
    a section name to the fields that differ (``es=dict(population_size=32)``,
    ``rule=dict(name="grpo", learning_rate=1e-6)``)."""
    env_options = {**envs.default_options(env_name), **sections.pop("env", {})}
    env_options = {name: config_dict.placeholder(options.field_types(
        envs.registry.module(env_name).Options)[name][0]) if value is None else value
        for name, value in env_options.items()}
    config = config_dict.ConfigDict({"env": {"name": env_name, **env_options}})
    config.rule = rule_section(**sections.pop("rule", {}))
    for name, record_cls in config_lib.SECTIONS.items():
        config[name] = section(record_cls, **sections.pop(name, {}))
    if sections:
        raise ValueError(f"unknown sections {sorted(sections)}")
    return config
