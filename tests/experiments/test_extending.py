"""docs/extending.md as a tested contract: the example of examples/ trains from a folder
outside the repository exactly as the page shows, and plugins that break the contract
stop with one line naming the problem (no traceback)."""

import os
import re
import subprocess
import sys
import textwrap

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PAGE = os.path.join(REPO, "docs", "extending.md")


def page() -> str:
    with open(PAGE, encoding="utf-8") as f:
        return f.read()


def launch(args: list[str], folder) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "experiments.train", *args], cwd=folder,
                          capture_output=True, text=True, timeout=300, check=False)


def test_the_page_shows_the_example_files_as_they_are():
    shown = re.findall(r"```python\n# (examples/\S+)\n(.*?)```", page(), re.DOTALL)
    assert sorted(name for name, _ in shown) == [
        "examples/config.py", "examples/guess_env.py", "examples/hill_climb.py"]
    for name, text in shown:
        with open(os.path.join(REPO, name), encoding="utf-8") as f:
            assert text == f.read(), name


def test_the_documented_command_trains_from_a_folder_outside_the_repo(tmp_path):
    command = re.search(r"```bash\n(.*?)```", page(), re.DOTALL).group(1)
    assert "examples/config.py" in command
    completed = subprocess.run(["bash", "-ec", command], cwd=tmp_path,
                               env={**os.environ, "REPO": REPO}, capture_output=True,
                               text=True, timeout=300, check=False)
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert "| success rate |" in completed.stdout
    assert "train 1: reward_mean=" in completed.stderr and "best=" in completed.stderr
    assert os.path.isfile(tmp_path / "run" / "summary.json")


STRING_TASKS = """
    import dataclasses, types
    from agentic_esopt import envs
    from experiments.configs import common

    @dataclasses.dataclass(frozen=True)
    class Options:
        def problems(self):
            return []

    def make_source(options, splits):
        return envs.TaskSource(env_factory=object, system_prompt=None,
                               train_tasks=lambda generation: ["2 + 2", "3 + 3"],
                               eval_tasks=["4 + 4"])

    envs.registry.register("strings", types.SimpleNamespace(Options=Options,
                                                            make_source=make_source))

    def get_config():
        return common.base_config("strings")
"""
DICT_STATE = """
    import dataclasses, types
    from agentic_esopt.training import rules
    from experiments.configs import common

    @dataclasses.dataclass(frozen=True)
    class Options:
        def problems(self):
            return []

    class DictRule(rules.Rule):
        def init(self, params):
            return {"params": params, "generation": 0}

    rules.register("dict_state", types.SimpleNamespace(Options=Options,
                                                       make=lambda config: DictRule()))

    def get_config():
        return common.base_config("sudoku", rule=dict(name="dict_state"))
"""


@pytest.mark.parametrize("config_text, config, line", [
    (None, "no_such_config.py",
     "FATAL Flags parsing error: config file 'no_such_config.py' does not exist"),
    (None, "experiments/configs/cpu_default.py",
     "FATAL Flags parsing error: config file 'experiments/configs/cpu_default.py' does not "
     "exist in the current directory"),
    ("x = 1\n", "plugin_config.py",
     "FATAL Flags parsing error: config file 'plugin_config.py' has no get_config()"),
    (STRING_TASKS, "plugin_config.py",
     "FATAL: environment 'strings': eval_tasks[0] is a str ('4 + 4') without an `id`; "
     "every task needs a stable string `id` attribute"),
    (DICT_STATE, "plugin_config.py",
     "FATAL: update rule 'dict_state': init(params) returned a dict without `params` and "
     "`generation`; a rule's state must be a pytree with `params` and `generation` "
     "attributes"),
], ids=["missing config file", "config path relative to the repo", "no get_config",
        "tasks without id", "rule state without generation"])
def test_a_broken_plugin_stops_with_one_line_naming_it(tmp_path, config_text, config, line):
    if config_text is not None:
        (tmp_path / config).write_text(textwrap.dedent(config_text))
    completed = launch([f"--config={config}", "--config.model.name=tiny",
                        "--workdir=run"], tmp_path)
    assert completed.returncode != 0
    assert "Traceback" not in completed.stderr
    assert completed.stderr.strip().splitlines()[-1].startswith(line), completed.stderr[-2000:]


def test_a_config_folder_does_not_shadow_installed_packages():
    """experiments/configs/miniwob.py beside the miniwob package: the launcher's config
    folder goes after installed packages, so ``import miniwob`` still finds the package."""
    probe = ("import importlib.util, sys\n"
             "sys.argv = ['train', '--config=experiments/configs/miniwob.py']\n"
             "import experiments.train\n"
             "spec = importlib.util.find_spec('miniwob')\n"
             "print(spec and spec.origin)\n")
    completed = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True,
                               text=True, timeout=300, check=True)
    assert os.path.join("experiments", "configs") not in completed.stdout, completed.stdout
