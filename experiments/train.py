r"""Trains an LLM agent with evolution strategies.

  python -m experiments.train                         # the cpu_default preset
  python -m experiments.train --preset=sudoku_mask5   # the paper's 9×9, 5 blanks
  python -m experiments.train --model=tiny --generations=2 --workdir=/tmp/smoke

Every TrainConfig field is a flag; flags given explicitly override the preset. Bad values
and bad combinations are reported before the model is loaded. Rerunning the same command
resumes the run in its workdir.
"""

import dataclasses
import logging as std_logging
from collections.abc import Mapping, Sequence

from absl import app, flags, logging

from agentic_esopt import training
from agentic_esopt.training import config as config_lib
from experiments import configs

FLAGS = flags.FLAGS
NONE_WORDS = ("none", "None")


class OptionalIntParser(flags.IntegerParser):
    """An integer flag that also accepts 'none' (for Optional[int] fields)."""

    def parse(self, argument):
        if argument is None or argument in NONE_WORDS:
            return None
        return super().parse(argument)

    def flag_type(self):
        return "int or none"


class OptionalStringParser(flags.ArgumentParser):
    """A string flag where 'none' means None (for Optional[str] fields)."""

    def parse(self, argument):
        return None if argument in NONE_WORDS else argument

    def flag_type(self):
        return "string or none"


def define_config_flags(flag_values: flags.FlagValues = FLAGS) -> None:
    """One flag per TrainConfig field, unset by default (the preset's value applies)."""
    types = config_lib.field_types()
    optional = config_lib.optional_fields()
    for field in dataclasses.fields(training.TrainConfig):
        kind, help_text = types[field.name], field.metadata["help"]
        if field.name in optional:
            parser = OptionalIntParser() if kind is int else OptionalStringParser()
            flags.DEFINE(parser, field.name, None, f"{help_text} ('none' to unset)",
                         flag_values=flag_values)
            continue
        define = {int: flags.DEFINE_integer, float: flags.DEFINE_float,
                  bool: flags.DEFINE_bool, str: flags.DEFINE_string}[kind]
        define(field.name, None, help_text, flag_values=flag_values)


flags.DEFINE_string("preset", "cpu_default", f"Preset config, one of {configs.PRESETS}; "
                    "explicit flags override its values.")
define_config_flags()


def build_config(flag_values: flags.FlagValues = FLAGS,
                 envs: Mapping[str, training.EnvSpec] | None = None) -> training.TrainConfig:
    """The preset with explicitly given flags applied, validated (ValueError if bad)."""
    config = configs.get_config(flag_values.preset)
    overrides = {field.name: flag_values[field.name].value
                 for field in dataclasses.fields(training.TrainConfig)
                 if flag_values[field.name].present}
    return dataclasses.replace(config, **overrides).validate(envs)


class _QuietOrbax:
    """Drops orbax's INFO chatter (one record per file written) from the log."""

    def filter(self, record) -> bool:
        return record.levelno > std_logging.INFO or "orbax" not in record.pathname


def main(argv: Sequence[str], envs: Mapping[str, training.EnvSpec] | None = None) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    try:
        config = build_config(envs=envs)
    except ValueError as error:
        raise app.UsageError(str(error)) from error
    logging.get_absl_handler().addFilter(_QuietOrbax())
    result = training.train(config, envs)
    print(training.report.summary_markdown(result.summary))


if __name__ == "__main__":
    app.run(main)
