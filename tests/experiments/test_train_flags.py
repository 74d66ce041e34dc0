"""The training launcher: config files, dotted overrides, errors before compute (the
contract smoke run: test_smoke_contract.py).

``launcher.main`` checks the config (``launch.train_config``) before it loads anything;
these tests parse the launcher's config files with fresh flags and run the launcher itself
in subprocesses.
"""

import os
import subprocess
import sys

import pytest
from absl import app, flags

from ml_collections import config_flags

from agentic_esopt import envs, training
from experiments import launch
from experiments import train as launcher
from experiments.configs import ahd, cpu_default, sudoku_mask5, sudoku_mask10, sudoku_mask15

FLAGS = flags.FLAGS
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def parsed(*args, config_file="experiments/configs/cpu_default.py"):
    """The ConfigDict the launcher's --config flag gives for ``args`` (config_flags
    defines one override flag per field when it parses, so each parse gets fresh flags)."""
    argv = ["train", *args]
    flag_values = flags.FlagValues()
    config_flags.DEFINE_config_file("config", os.path.join(REPO, config_file),
                                    flag_values=flag_values, sys_argv=argv, lock_config=True)
    flag_values(argv)
    return flag_values.config


def run_launcher(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "experiments.train", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout, check=False)


def config_of(module):
    return training.TrainConfig.from_dict(module.get_config().to_dict())


def test_the_launcher_defaults_to_the_cpu_default_config():
    assert FLAGS["config"].default_as_str.endswith("experiments/configs/cpu_default.py'")
    config = launch.train_config(parsed())
    assert config == config_of(cpu_default)
    assert config.model.name == "smollm2-135m" and config.env_name == "sudoku"


def test_dotted_flags_override_the_config_file():
    config = launch.train_config(parsed(
        "--config.es.population_size=16", "--config.es.antithetic=False",
        "--config.rollout.temperature=0.5", "--config.env.mask_count=10",
        "--config.rule.name=none", "--config.rollout.max_turns=7",
        config_file="experiments/configs/sudoku_mask15.py"))
    assert config == config_of(sudoku_mask15).replace(
        es=dict(population_size=16), rollout=dict(temperature=0.5, max_turns=7),
        env=dict(mask_count=10), rule=dict(name="none"))
    assert (config.es.sigma_start, config.es.sigma_end) == (7e-4, 5e-4)


@pytest.mark.parametrize("module, mask_count, sigma", [
    (sudoku_mask5, 5, (1e-3, 2.5e-4)), (sudoku_mask10, 10, (1e-3, 2.5e-4)),
    (sudoku_mask15, 15, (7e-4, 5e-4))])
def test_paper_configs(module, mask_count, sigma):
    config = config_of(module)
    assert (config.env.board_size, config.env.mask_count) == (9, mask_count)
    assert config.es.population_size == 32 and config.rollout.tasks_per_generation == 32
    assert (config.es.learning_rate, config.run.generations, config.es.sigma_schedule) == (
        5e-4, 100, "cosine")
    assert (config.es.sigma_start, config.es.sigma_end) == sigma


CONFIG_FILES = sorted(name for name in os.listdir(os.path.join(REPO, "experiments", "configs"))
                      if name.endswith(".py") and name not in ("__init__.py", "common.py",
                                                               "sudoku_paper.py"))


@pytest.mark.parametrize("name", CONFIG_FILES)
def test_every_config_file_is_valid(name):
    # Presets for local checkpoints name a placeholder folder the user replaces.
    config = launch.train_config(parsed("--config.model.name=tiny",
                                        config_file=f"experiments/configs/{name}"))
    assert config.env_name in envs.names()


@pytest.mark.parametrize("profile, sampling", [("", (0.7, 0.8, 20)), (":t1", (1.0, 1.0, 0))])
def test_sudoku_grpo_config_mirrors_the_reference(profile, sampling):
    config = launch.train_config(parsed(
        config_file=f"experiments/configs/sudoku_grpo.py{profile}"))
    assert (config.rule_name, config.rule.group_size, config.rule.learning_rate) == (
        "grpo", 8, 1e-6)
    assert config.rollout.tasks_per_generation == 32 and config.env.board_size == 9
    assert (config.rollout.temperature, config.rollout.top_p, config.rollout.top_k) == sampling


def test_math_react_config_mirrors_the_reference():
    config = launch.train_config(parsed(config_file="experiments/configs/math_react.py"))
    assert (config.es.population_size, config.es.learning_rate, config.run.generations) == (
        16, 5e-4, 25)
    assert (config.es.sigma_start, config.es.sigma_end) == (1e-3, 5e-4)
    assert (config.rollout.temperature, config.rollout.top_k,
            config.rollout.tasks_per_generation, config.rollout.presence_penalty) == (
                1.0, 40, 16, 2.0)


def test_ahd_config():
    config = config_of(ahd)
    assert config.env_name == "ahd" and config.env.search == "eoh"
    assert (config.es.sigma_start, config.es.sigma_end, config.es.learning_rate) == (
        1e-3, 0.0, 5e-4)


BAD_FLAGS = [
    (["--config.es.population_size=3", "--config.es.antithetic=True"],
     "antithetic sampling needs an even"),
    (["--config.es.noise=full", "--config.es.rank=2"], "rank=2 only applies to noise='lowrank'"),
    (["--config.es.sigma_warmup=30", "--config.run.generations=30"],
     "es.sigma_warmup (30) must be < run.generations (30)"),
    (["--config.run.eval_every=0"], "run.eval_every must be >= 1"),
    (["--config.env.mask_count=13"], "env.mask_count must be in [1, 12]"),
    (["--config.env.anchor_path=/no/such/folder"], "has no train.jsonl"),
    (["--config.es.sigma_schedule=constant"], "a constant σ schedule has no end value"),
    (["--config.es.weight_decay=0.1"], "weight_decay only applies to optimizer='adamw'"),
    (["--config.model.name=/no/such/model.gguf"], "is not 'tiny'"),
    (["--config.rule.name=ppo"], "unknown update rule 'ppo'"),
    (["--config.env.name=math_react"], "env: environment 'math_react' has no options "
                                       "anchor_path, board_size, list_legal_moves, mask_count, "
                                       "partial_credit (the section was written for another "
                                       "environment); 'math_react' takes: data, difficulty"),
    (["--config.es.strategy=cma"], "es.strategy: unknown ES strategy 'cma'; choose one of"),
    (["--config.mesh.shape=data:4,pipe:2"], "mesh axis 'pipe' is unknown"),
    (["--config.distributed.num_processes=2", "--config.distributed.process_id=5"],
     "distributed.process_id must be in [0, num_processes=2), got 5"),
]


@pytest.mark.parametrize("args, message", BAD_FLAGS, ids=[m for _, m in BAD_FLAGS])
def test_bad_flags_are_usage_errors_naming_the_problem(args, message):
    with pytest.raises(app.UsageError) as error:
        launch.train_config(parsed(*args))
    assert message in str(error.value)


@pytest.mark.parametrize("arg", ["--config.es.population_size=abc",
                                 "--config.rollout.max_turns=two",
                                 "--config.es.sigma_start=fast"])
def test_unparsable_flags_fail_at_parse_time(arg):
    with pytest.raises(flags.IllegalFlagValueError):
        parsed(arg)


def test_stray_arguments_are_rejected():
    with pytest.raises(app.UsageError, match="unexpected arguments: extra"):
        launcher.main(["train", "extra"])


def test_command_line_errors_end_before_any_work(tmp_path):
    workdir = tmp_path / "run"
    completed = run_launcher("--config.model.name=tiny", "--config.es.population_size=3",
                             "--config.run.eval_every=0", "--config.rule.name=grpo",
                             "--config.rule.clip_epsilon=0", "--config.rule.group_size=1",
                             "--config.rule.learning_rate=-1", f"--workdir={workdir}")
    assert completed.returncode != 0
    for message in ("antithetic sampling needs an even population_size, got 3",
                    "run.eval_every must be >= 1", "clip_epsilon must be > 0",
                    "group_size must be >= 2", "learning_rate must be > 0"):
        assert message in completed.stderr  # Every problem at once.
    assert not workdir.exists()
    assert "PyTorch was not found" not in completed.stderr
    assert "libtpu" not in completed.stderr.lower()


@pytest.mark.parametrize("args, line", [
    (["--config.es.populaton_size=4"],
     "FATAL: invalid configuration: es: unknown option 'populaton_size'; did you mean "
     "'population_size'?"),
    (["--config.update.name=grpo", "--config.update.group_size=4"],
     "FATAL Flags parsing error: the update section is called rule: use "
     "--config.rule.name=es|grpo|none and --config.rule.<option> in place of "
     "--config.update.name, --config.update.group_size"),
    (["--config.ess.population_size=4"],
     'FATAL Flags parsing error: unknown config section in an override: ess; Did you mean '
     '"es" instead of "ess"?'),
])
def test_a_wrong_key_ends_in_one_line_naming_the_fix(args, line):
    result = run_launcher("--config.model.name=tiny", *args, "--workdir=/nonexistent/x")
    assert result.returncode != 0
    assert result.stderr.strip().splitlines() == [line]
