"""Grids of runs: the sweep launcher and ES vs GRPO share ``experiments.grid``."""

import json
import os
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest

from agentic_esopt import es, models, training
from experiments import grid

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "tests", "training"))
import digits_env  # pylint: disable=wrong-import-position  # noqa: E402

CONFIG = training.TrainConfig.from_dict({"model": {"name": "tiny"}})


def fake_train(successes: dict[int, tuple[float, float]], failing_seeds=()):
    """A stand-in for ``training.train`` writing a finished run's result files."""
    calls = []

    def train(config, workdir, model=None, base_evaluation=None, machine=None):
        del model
        calls.append((workdir, base_evaluation))
        if config.run.seed in failing_seeds:
            raise RuntimeError(f"seed {config.run.seed} broke")
        before, after = successes[config.run.seed]
        os.makedirs(workdir, exist_ok=True)
        records = [dict(kind="eval", generation=0, success_rate=before, mean_reward=before,
                        episode_task_ids=["a", "b"], episode_solved=[before, before]),
                   dict(kind="train", generation=0, reward_std=0.0, wall_time_s=1.0,
                        **(machine or {})),
                   dict(kind="eval", generation=1, success_rate=after, mean_reward=after,
                        episode_task_ids=["a", "b"], episode_solved=[after, after])]
        with open(os.path.join(workdir, "metrics.jsonl"), "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in records)
        for name, value in (("config.json", config.to_dict()), ("summary.json",
                                                                  {"wall_time_s": 2.0})):
            with open(os.path.join(workdir, name), "w") as f:
                json.dump(value, f)
    return train, calls


def test_a_grid_reuses_finished_runs_records_failures_and_retries_them(tmp_path,
                                                                       monkeypatch):
    monkeypatch.setattr(grid.models, "load", lambda *args: "model")
    runs = [grid.Run("point", seed, CONFIG.replace(run={"seed": seed})) for seed in range(3)]
    workdir, results = str(tmp_path / "work"), str(tmp_path / "results")
    train, calls = fake_train({0: (0.0, 0.5), 1: (0.0, 1.0), 2: (0.5, 0.5)},
                              failing_seeds=(1,))
    outcomes = grid.run_all(runs, workdir, results, train)
    assert outcomes == {"point/seed0": "ok", "point/seed1": "RuntimeError: seed 1 broke",
                        "point/seed2": "ok"}
    assert "seed 1 broke" in (tmp_path / "results/point/seed1/failure.txt").read_text()
    assert sorted(os.listdir(tmp_path / "results/point/seed0")) == [
        "config.json", "metrics.jsonl", "summary.json"]
    # Each run records the machine it ran on and the machine's probe time.
    timed = grid.train_records(str(tmp_path / "results/point/seed0"))[0]
    assert timed["machine"] == training.machine.machine_id() and timed["probe_s"] > 0
    train, calls = fake_train({0: (0.0, 0.5), 1: (0.0, 1.0), 2: (0.5, 0.5)})
    assert grid.run_all(runs, workdir, results, train, run_missing=False) == {
        "point/seed0": "ok", "point/seed1": grid.NOT_RUN, "point/seed2": "ok"}
    assert not calls  # --table_only: nothing runs
    assert set(grid.run_all(runs, workdir, results, train).values()) == {"ok"}
    # Only the failed run again, with seed 1's untrained evaluation nowhere to reuse.
    assert calls == [(os.path.join(workdir, "point", "seed1"), None)]
    assert not (tmp_path / "results/point/seed1/failure.txt").exists()
    row = grid.cell_row([os.path.join(results, r.name) for r in runs])
    assert row["seed_finals"] == [0.5, 1.0, 0.5] and row["seeds"] == 3
    assert row["success_change_seeds"] == [0.5, 1.0, 0.0]
    assert row["success_change"] == pytest.approx(0.5)
    assert row["success_change_se"] == pytest.approx(np.std([0.5, 1.0, 0.0], ddof=1) / 3**0.5)


def test_runs_of_one_seed_reuse_the_first_finished_runs_untrained_evaluation(tmp_path,
                                                                            monkeypatch):
    """Also a finished run that a later grid does not list (ES and GRPO run apart)."""
    monkeypatch.setattr(grid.models, "load", lambda *args: "model")
    runs = [grid.Run(f"lr{rate}", seed, CONFIG.replace(run={"seed": seed},
                                                        es={"learning_rate": rate}))
            for rate in (1e-3, 2e-3) for seed in (0, 1)]
    results = str(tmp_path / "results")
    train, calls = fake_train({0: (0.0, 0.5), 1: (0.25, 1.0)})
    assert set(grid.run_all(runs[:1], str(tmp_path / "work"), results, train).values()) == {
        "ok"}
    train, calls = fake_train({0: (0.0, 0.5), 1: (0.25, 1.0)})
    grid.run_all(runs[1:], str(tmp_path / "work"), results, train)
    given = {os.path.relpath(workdir, tmp_path / "work"): base for workdir, base in calls}
    assert given["lr0.001/seed1"] is None  # the first run of seed 1
    for name, source in (("lr0.002/seed0", "lr0.001/seed0"), ("lr0.002/seed1",
                                                               "lr0.001/seed1")):
        assert given[name]["reused_from"] == source and given[name]["generation"] == 0
    assert given["lr0.002/seed1"]["success_rate"] == 0.25


def test_a_cell_averages_timed_rollouts_only_when_every_run_has_them(tmp_path):
    train, _ = fake_train({0: (0.0, 0.5), 1: (0.0, 1.0)})
    directories = [str(tmp_path / f"seed{seed}") for seed in (0, 1)]
    for seed, directory in enumerate(directories):
        train(CONFIG.replace(run={"seed": seed}), directory)
    assert "steps_per_s" not in grid.cell_row(directories)  # runs from before timings
    for directory, steps_per_s in zip(directories, (0.3, 0.5)):
        with open(os.path.join(directory, "summary.json"), "w") as f:
            json.dump(dict(wall_time_s=2.0, rollouts=dict(steps_per_s=steps_per_s,
                                                          policy_share=0.8)), f)
    row = grid.cell_row(directories)
    assert row["steps_per_s"] == pytest.approx(0.4) and row["steps_per_s_seeds"] == [0.3, 0.5]
    assert row["policy_share"] == pytest.approx(0.8) and row["policy_share_se"] == 0
    untimed = str(tmp_path / "untimed")
    train(CONFIG.replace(run={"seed": 1}), untimed)
    assert "steps_per_s" not in grid.cell_row([directories[0], untimed])


def test_a_cell_averages_es_runs_mean_update_norms(tmp_path):
    train, _ = fake_train({0: (0.0, 0.5), 1: (0.0, 1.0)})
    directories = [str(tmp_path / f"seed{seed}") for seed in (0, 1)]
    for seed, directory in enumerate(directories):
        train(CONFIG.replace(run={"seed": seed}), directory)
    assert "update_norm" not in grid.cell_row(directories)  # GRPO records no update norm
    for directory, norms in zip(directories, ((2.0, 4.0), (5.0, 5.0))):
        path = os.path.join(directory, "metrics.jsonl")
        records = [json.loads(line) for line in open(path)]
        records[1:2] = [dict(kind="train", generation=g, wall_time_s=1.0, update_norm=n)
                        for g, n in enumerate(norms)]
        with open(path, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in records)
    row = grid.cell_row(directories)
    assert row["update_norm_seeds"] == [3.0, 5.0] and row["update_norm"] == pytest.approx(4.0)


def test_a_parked_es_run_resumes_on_a_fresh_machine_and_ends_bitwise_equal(tmp_path):
    run = grid.Run("point", 0, digits_env.TINY)  # 3 generations
    reference = training.train(run.config, str(tmp_path / "reference"))
    # The run stopped after 2 of its 3 generations on a machine that is then lost, beside
    # a GRPO run (no history) and a finished run.
    old_machine, results = tmp_path / "old", tmp_path / "results"
    interrupted = old_machine / run.name
    shutil.copytree(tmp_path / "reference", interrupted,
                    ignore=shutil.ignore_patterns("checkpoints", "summary.*"))
    lines = (interrupted / grid.HISTORY).read_text().splitlines(keepends=True)
    (interrupted / grid.HISTORY).write_text("".join(lines[:-1]))
    grpo, finished = grid.Run("grpo", 0, CONFIG), grid.Run("finished", 0, CONFIG)
    (old_machine / grpo.name).mkdir(parents=True)
    (old_machine / grpo.name / "metrics.jsonl").write_text("")
    fake_train({0: (0.0, 1.0)})[0](CONFIG, str(results / finished.name))
    assert grid.park([run, grpo, finished], str(old_machine), str(results)) == [run.name]
    assert sorted(os.listdir(results / run.name)) == ["config.json", grid.HISTORY,
                                                      "metrics.jsonl"]
    assert not grid.is_finished(str(results / run.name))
    generations_at_start = []

    def train(config, workdir, **kwargs):
        _, records = es.history.read(os.path.join(workdir, grid.HISTORY))
        generations_at_start.append(len(records))
        return training.train(config, workdir, **kwargs)

    outcomes = grid.run_all([run], str(tmp_path / "new"), str(results), train)
    assert outcomes == {run.name: "ok"} and generations_at_start == [2]
    assert grid.is_finished(str(results / run.name))
    resumed = es.history.replay(models.load("tiny").params,
                                str(results / run.name / grid.HISTORY))
    for a, b in zip(jax.tree.leaves(resumed), jax.tree.leaves(reference.state.params),
                    strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    untimed = [[{k: v for k, v in record.items() if k != "wall_time_s"}
                for record in grid.evaluations(str(directory))]
               for directory in (results / run.name, tmp_path / "reference")]
    assert untimed[0] == untimed[1]


def test_grid_axes_parse_into_every_combination():
    axes = grid.parse_grid("es.noise=full,lowrank; es.population_size=8,16;es.antithetic=true")
    assert axes == [(("es.noise",), [("full",), ("lowrank",)]),
                    (("es.population_size",), [(8,), (16,)]), (("es.antithetic",), [(True,)])]
    grid_points = grid.points(axes)
    assert len(grid_points) == 4 and grid_points[1] == {
        "es.noise": "full", "es.population_size": 16, "es.antithetic": True}
    assert grid.cell_name(grid_points[1]) == (
        "es.noise=full+es.population_size=16+es.antithetic=True")
    config = grid.configure(CONFIG, grid_points[1], seed=3)
    assert (config.es.noise, config.es.population_size, config.run.seed) == ("full", 16, 3)
    linked = grid.points(grid.parse_grid(
        "es.population_size+rollout.tasks_per_generation=8+4,16+2;es.rank=1,4"))
    assert linked == [
        {"es.population_size": 8, "rollout.tasks_per_generation": 4, "es.rank": 1},
        {"es.population_size": 8, "rollout.tasks_per_generation": 4, "es.rank": 4},
        {"es.population_size": 16, "rollout.tasks_per_generation": 2, "es.rank": 1},
        {"es.population_size": 16, "rollout.tasks_per_generation": 2, "es.rank": 4}]
    for bad in ("es.noise", "noise=full", "es.noise=full;es.noise=lowrank", "run.seed=1,2",
                "es.rank+es.noise=1,2+full", "es.rank+es.rank=1+2"):
        with pytest.raises(ValueError):
            grid.parse_grid(bad)


def test_grids_joined_by_a_bar_are_one_list_of_points_each_once():
    assert grid.grid_points("") == [{}]
    ablation = grid.grid_points("|es.rank=4| es.noise=full ;es.rank=1|es.rank=4,1")
    assert ablation == [{}, {"es.rank": 4}, {"es.noise": "full", "es.rank": 1},
                        {"es.rank": 1}]
    assert [grid.cell_name(p) for p in ablation] == [
        "base", "es.rank=4", "es.noise=full+es.rank=1", "es.rank=1"]
    with pytest.raises(ValueError, match="is not 'section.option"):
        grid.grid_points("|es.rank")


def test_the_hierarchical_bootstrap_covers_the_difference_and_pairs_puzzles():
    rng = np.random.default_rng(1)
    second = [rng.integers(0, 2, 96).astype(float) for _ in range(3)]
    low, high = grid.bootstrap_difference(second, second)
    assert low == high == 0.0  # the same outcomes on the same puzzles: no difference
    first = [np.clip(s + (rng.random(96) < 0.3), 0, 1) for s in second]
    difference = np.mean(first) - np.mean(second)
    low, high = grid.bootstrap_difference(first, second)
    assert 0 < low < difference < high < 0.6


def test_a_paired_difference_pairs_seeds_and_refuses_different_puzzles(tmp_path, monkeypatch):
    monkeypatch.setattr(grid.models, "load", lambda *args: "model")
    results = str(tmp_path)
    train, _ = fake_train({0: (0.0, 1.0), 1: (0.0, 0.5), 2: (0.0, 0.0)})
    runs = [grid.Run(cell, seed, CONFIG.replace(run={"seed": seed}))
            for cell, seeds in (("point", (0, 1)), ("base", (1, 2))) for seed in seeds]
    grid.run_all(runs, str(tmp_path / "work"), results, train)
    cells = grid.finished_cells(runs, {r.name: "ok" for r in runs}, results)
    difference = grid.paired_difference(cells["point"], cells["base"])
    assert difference["mean"] == 0.0  # only seed 1 is shared: 0.5 - 0.5
    assert difference["ci95"] == [0.0, 0.0]
    assert grid.paired_difference(cells["point"][:1], cells["base"]) is None  # no shared seed
    metrics = tmp_path / "base/seed1/metrics.jsonl"
    metrics.write_text(metrics.read_text().replace('"b"', '"c"'))
    assert grid.paired_difference(cells["point"], cells["base"]) is None  # other puzzles


def run_module(module, *args):
    return subprocess.run([sys.executable, "-m", module, *args], cwd=REPO,
                          capture_output=True, text=True, timeout=900, check=False)


TINY = ["--config=experiments/configs/cpu_default.py", "--config.model.name=tiny",
        "--config.run.generations=1", "--config.eval.size=4"]


def test_contract_sweep_command_writes_its_table(tmp_path):
    command = [*TINY, "--grid=es.population_size=4,6", "--seeds=0,1", f"--workdir={tmp_path}"]
    first = run_module("experiments.sweep", *command)
    assert first.returncode == 0, first.stderr[-3000:]
    table = json.loads((tmp_path / "table.json").read_text())
    assert [row["point"] for row in table["rows"]] == [{"es.population_size": 4},
                                                       {"es.population_size": 6}]
    assert all(len(row["seed_finals"]) == 2 for row in table["rows"])
    assert all(row["step_time_s"] > 0 and row["flops"] > 0 for row in table["rows"])
    # Rewards may all tie on the random tiny model (a zero step): the norm is recorded.
    assert all(row["update_norm"] >= 0 for row in table["rows"])
    first, second = table["rows"]
    low, high = second["minus_first"]["ci95"]
    assert "minus_first" not in first and -1 <= low <= high <= 1
    assert second["minus_first"]["mean"] == pytest.approx(
        np.mean(second["seed_finals"]) - np.mean(first["seed_finals"]))
    for plot in ("success.png", "curves.png"):
        assert (tmp_path / plot).read_bytes()[:4] == b"\x89PNG"
    assert "| es.population_size=4 | 2 |" in (tmp_path / "table.md").read_text()


def test_contract_es_vs_grpo_command_gives_seed_finals_and_the_es_interval(tmp_path):
    result = run_module("experiments.es_vs_grpo", "--config.model.name=tiny",
                        "--config.run.generations=2", "--config.run.eval_every=1",
                        "--config.es.population_size=4", "--config.eval.size=8",
                        "--horizons=1", "--sigma_horizon=0", "--turns_per_blank=3",
                        "--es_generations=4", "--es_eval_every=2", "--seeds=0,1",
                        f"--workdir={tmp_path}")
    assert result.returncode == 0, result.stderr[-3000:]
    rows = json.loads((tmp_path / "table.json").read_text())["rows"]
    assert [(r["horizon"], r["method"]) for r in rows] == [(1, "es"), (1, "grpo")]
    assert all(len(r["seed_finals"]) == 2 for r in rows)
    low, high = rows[0]["minus_grpo_ci95"]
    assert -1 <= low <= high <= 1 and "minus_grpo_ci95" not in rows[1]
    assert 0 <= rows[0]["zero_spread_share"] <= 1
    es, grpo = rows
    # 4 members (GRPO: a group of 4) × 4 tasks a generation; ES: 4 generations evaluated
    # every 2; GRPO: 2 steps evaluated every step.
    assert [p["episodes"] for p in es["curve"]] == [0, 32, 64]
    assert [p["episodes"] for p in grpo["curve"]] == [0, 16, 32]
    assert all(p["flops"] > 0 and p["seconds"] > 0 for p in es["curve"][1:] + grpo["curve"][1:])
    low, high = es["minus_grpo_seed_t95"]
    assert low <= es["along_curves"]["flops"]["mean"] <= high
    assert sorted(es["along_curves"]) == ["episodes", "flops", "probe_units", "seconds"]
    # Both seeds' ES and GRPO runs ran here, recording this machine and its probe time.
    assert es["one_machine_seeds"] == 2 and es["along_curves"]["probe_units"]["seeds"] == 2
    config = json.loads((tmp_path / "blanks1/es/seed0/config.json").read_text())
    assert config["rollout"]["max_turns"] == 3 and config["run"]["generations"] == 4
    assert (tmp_path / "curves.png").read_bytes()[:4] == b"\x89PNG"


def test_es_vs_grpo_runs_the_methods_asked_for_in_their_order_and_refuses_others(tmp_path):
    tiny = ("--config.model.name=tiny", "--config.run.generations=1",
            "--config.run.eval_every=1", "--config.es.population_size=4",
            "--config.eval.size=4", "--horizons=1", "--sigma_horizon=0", "--seeds=0")
    for methods in ("es_compute", "grpo,grpo", ""):
        refused = run_module("experiments.es_vs_grpo", *tiny, f"--methods={methods}",
                             f"--workdir={tmp_path / 'refused'}")
        assert refused.returncode != 0 and "--methods must be" in refused.stderr
    assert not (tmp_path / "refused").exists()
    result = run_module("experiments.es_vs_grpo", *tiny, "--methods=grpo,es",
                        f"--workdir={tmp_path}")
    assert result.returncode == 0, result.stderr[-3000:]
    started = [line.split(": ")[-1] for line in result.stderr.splitlines() if "] run " in line]
    assert started == [str(tmp_path / "blanks1" / m / "seed0") for m in ("grpo", "es")]
    rows = json.loads((tmp_path / "table.json").read_text())["rows"]
    assert [r["method"] for r in rows] == ["es", "grpo"]  # The table keeps its order.


def test_compute_matching_buys_the_generations_the_undisturbed_step_times_give(tmp_path):
    directories = {}
    for method, step_times in (("grpo", [10.0, 10.0, 500.0]), ("es", [2.0, 2.5, 60.0])):
        for seed, slowdown in ((0, 3.0), (1, 1.0)):  # Seed 0 shared the machine throughout.
            directory = tmp_path / method / f"seed{seed}"
            directory.mkdir(parents=True)
            (directory / "metrics.jsonl").write_text("".join(
                json.dumps(dict(kind="train", generation=g, wall_time_s=slowdown * t)) + "\n"
                for g, t in enumerate(step_times)))
            directories.setdefault(method, []).append(str(directory))
    # 3 GRPO steps of 10 s (seed 1's median) buy 12 ES generations of 2.5 s; neither the
    # slow spells (500 s, 60 s) nor the run slowed throughout count.
    assert grid.compute_matched_generations(directories["grpo"], directories["es"], 3) == 12
    assert grid.compute_matched_generations(directories["es"], directories["grpo"], 40) == 10

