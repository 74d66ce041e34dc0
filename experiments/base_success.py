r"""The untrained model's held-out success over a grid of settings: where a task has headroom.

  python -m experiments.base_success --config=experiments/configs/cpu_default.py \
      --config.env.partial_credit=false --config.eval.size=48 \
      --grid='env.mask_count=4,8;env.list_legal_moves=true,false' \
      --results=experiments/results/es_vs_grpo/headroom/base_success.jsonl

Each point of ``--grid`` (the sweep's syntax, ``experiments.grid.grid_points``) is the
shared config with that point's overrides; its held-out tasks are played once by the
loaded model's own parameters with the run's evaluation keys, as a training run's
first evaluation would. One JSON line per point (``point``, ``success_rate`` and its
s.e., ``mean_reward``, ``mean_turns``, ``wall_time_s``) is printed and appended to
``--results``; points already there are skipped, so the command resumes.
"""

import json
import os
import tempfile
import time

from absl import app, flags

from agentic_esopt import models, training
from agentic_esopt.training import config as config_lib
from agentic_esopt.training import trainer
from agentic_esopt.training.files import RunFiles
from experiments import grid, launch

_CONFIG = launch.define_config("experiments/configs/cpu_default.py",
                               "Config shared by every point.")
_GRID = flags.DEFINE_string("grid", "", "Axes 'section.option=v1,v2;...' (empty: the "
                                        "config alone); '|' joins grids.")
_RESULTS = flags.DEFINE_string("results", None, "JSON-lines file the points are appended "
                                                "to (and resumed from).", required=True)


def base_success(config: training.TrainConfig, model: models.Model) -> dict:
    """Held-out statistics of ``model`` as it is, on ``config``'s evaluation tasks."""
    with tempfile.TemporaryDirectory() as workdir:
        source = trainer.make_reward_source(config, RunFiles(workdir), models.generate)
        try:
            began = time.time()
            key = config_lib.sampling_key(config, config_lib.EVAL_SAMPLING_STREAM, 0)
            statistics = source.evaluate(model, key, 0, None)
        finally:
            source.close()
    return dict(success_rate=statistics["success_rate"],
                success_rate_se=statistics["success_rate_se"],
                mean_reward=statistics["mean_reward"], mean_turns=statistics["mean_turns"],
                num_episodes=statistics["num_episodes"],
                wall_time_s=round(time.time() - began, 1))


def finished_points(path: str) -> list[dict]:
    if not os.path.isfile(path):
        return []
    with open(path, encoding="utf-8") as f:
        return [json.loads(line)["point"] for line in f if line.strip()]


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    shared = launch.train_config(_CONFIG.value)
    try:
        points = grid.grid_points(_GRID.value)
        configs = [grid.configure(shared, point, shared.run.seed) for point in points]
    except ValueError as error:
        raise app.UsageError(str(error)) from error
    done = finished_points(_RESULTS.value)
    todo = [(p, c) for p, c in zip(points, configs) if p not in done]
    if not todo:
        return
    model = models.load(shared.model.name, dtype=shared.model.dtype)
    os.makedirs(os.path.dirname(os.path.abspath(_RESULTS.value)), exist_ok=True)
    for point, config in todo:
        line = json.dumps(dict(point=point, **base_success(config, model)))
        print(line, flush=True)
        with open(_RESULTS.value, "a", encoding="utf-8") as f:
            f.write(line + "\n")


if __name__ == "__main__":
    launch.run(main)
