"""The trainer on the tiny model and the toy digits environment (rewards that vary)."""

import dataclasses
import json
import os
import shutil

import jax
import numpy as np
import pytest

from agentic_esopt import agents, es, models, training
from agentic_esopt.training import checkpoint, config as config_lib, metrics, trainer

import digits_env

CONFIG = digits_env.TINY  # 3 generations, checkpoint every 1, eval at 0, 2 and 3.


def assert_trees_equal(a, b):
    leaves_a, leaves_b = jax.tree.leaves(a), jax.tree.leaves(b)
    assert len(leaves_a) == len(leaves_b)
    for x, y in zip(leaves_a, leaves_b):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def restore_final(workdir, config):
    return checkpoint.restore_workdir_state(training.RunFiles(workdir), config,
                                            models.load("tiny").params)


MACHINE = {"machine": "boot-1", "probe_s": 0.25}


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    workdir = str(tmp_path_factory.mktemp("run"))
    return workdir, training.train(CONFIG, workdir, machine=MACHINE)


def test_run_moves_params_and_the_history_replays_them_bitwise(finished):
    workdir, result = finished
    initial = models.load("tiny").params
    assert int(result.state.generation) == 3
    assert any(not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(initial),
                                                        jax.tree.leaves(result.state.params)))
    replayed = es.history.replay(initial, os.path.join(workdir, "history.jsonl"))
    assert_trees_equal(replayed, result.state.params)
    assert_trees_equal(restore_final(workdir, CONFIG), result.state)


def test_run_writes_every_record(finished):
    workdir, result = finished
    files = training.RunFiles(workdir)
    header, records = es.history.read(files.history)
    assert header["config"] == CONFIG.to_dict() and len(records) == 3
    assert records[1]["task_ids"] == ["train-1-0", "train-1-1"]
    logged = metrics.read_metrics(files.metrics)
    assert [(r["kind"], r["generation"]) for r in logged] == [
        ("eval", 0), ("train", 0), ("train", 1), ("eval", 2), ("train", 2), ("eval", 3)]
    assert [r["reward_mean"] for r in logged if r["kind"] == "train"] == pytest.approx(
        [float(np.mean(r["rewards"])) for r in records])
    size = sum(leaf.size for leaf in jax.tree.leaves(result.state.params))
    for record in (r for r in logged if r["kind"] == "train"):
        # 4 members × 2 one-turn tasks, each feeding its prompt and up to 4 new tokens.
        assert 8 * 4 < record["forward_tokens"] and record["flops"] == pytest.approx(
            2 * size * record["forward_tokens"])
        # One-turn tasks: one environment step per episode; the model's calls are part of
        # the rollout's time.
        assert record["env_steps"] == 8
        assert 0 < record["policy_s"] <= record["rollout_s"] <= record["wall_time_s"]
        assert {k: record[k] for k in MACHINE} == MACHINE  # which machine timed it
    assert not any("machine" in r for r in logged if r["kind"] == "eval")
    for generation in range(3):
        episodes = agents.read_trajectories(files.train_trajectories(generation))
        assert len(episodes) == 4 * 2 and {e.generation for e in episodes} == {generation}
    assert sorted(os.listdir(files.trajectories)) == [
        "eval_00000.jsonl", "eval_00002.jsonl", "eval_00003.jsonl", "gen_00000.jsonl",
        "gen_00001.jsonl", "gen_00002.jsonl"]
    assert sorted(os.listdir(files.checkpoints)) == ["1", "2", "3"]
    assert os.listdir(files.tensorboard) and os.path.getsize(files.reward_curve) > 0
    assert json.load(open(files.summary_json)) == result.summary
    assert result.summary["final_generation"] == 3
    assert result.summary["mean_reward"]["paired_se"] is not None


def test_evaluations_at_any_generation_sample_alike(finished):
    workdir, _ = finished
    model = models.load("tiny")

    def evaluate(config, generation):
        source = trainer.make_reward_source(config, training.RunFiles(workdir),
                                            models.generate)
        key = config_lib.sampling_key(config, config_lib.EVAL_SAMPLING_STREAM, 0)
        return source.evaluate(model, key, generation, None)

    first, later = evaluate(CONFIG, 0), evaluate(CONFIG, 7)
    assert first["episode_task_ids"] == ["eval-0", "eval-1"]
    assert first == later
    shifted = evaluate(CONFIG.replace(run=dict(seed=CONFIG.run.seed + 1)), 0)
    assert shifted["episode_rewards"] != first["episode_rewards"]


def first_evaluation(workdir):
    return next(r for r in metrics.read_metrics(training.RunFiles(workdir).metrics)
                if r["kind"] == "eval")


def test_es_and_grpo_of_one_fingerprint_evaluate_the_untrained_model_alike(finished,
                                                                           tmp_path):
    workdir, _ = finished
    grpo = CONFIG.replace(rule=dict(name="grpo", group_size=4, learning_rate=1e-3,
                                    minibatch_size=4),
                          es=dict(learning_rate=0.5), run=dict(generations=1, eval_every=1))
    fingerprint = config_lib.base_evaluation_fingerprint
    assert fingerprint(grpo) == fingerprint(CONFIG)
    for changed in (dict(run=dict(seed=4)), dict(eval=dict(size=3)),
                    dict(es=dict(scope="lora")), dict(rollout=dict(max_new_tokens=5))):
        assert fingerprint(CONFIG.replace(**changed)) != fingerprint(CONFIG)
    training.train(grpo, str(tmp_path))
    es_record, grpo_record = first_evaluation(workdir), first_evaluation(str(tmp_path))
    for name in ("episode_task_ids", "episode_rewards", "episode_solved", "mean_reward"):
        assert grpo_record[name] == es_record[name]


def test_a_run_given_a_base_evaluation_logs_it_and_evaluates_later_ones(finished, tmp_path):
    workdir, _ = finished
    given = {**first_evaluation(workdir), "reused_from": "sibling/seed3"}
    config = CONFIG.replace(run=dict(generations=1, eval_every=1))
    training.train(config, str(tmp_path), base_evaluation=given)
    evals = [r for r in metrics.read_metrics(training.RunFiles(str(tmp_path)).metrics)
             if r["kind"] == "eval"]
    assert [r["generation"] for r in evals] == [0, 1]
    logged = evals[0]
    assert logged["reused_from"] == "sibling/seed3" and logged["wall_time_s"] == 0.0
    assert logged["reused_wall_time_s"] == given["wall_time_s"] > 0
    assert logged["episode_rewards"] == given["episode_rewards"]
    assert "reused_from" not in evals[1] and evals[1]["wall_time_s"] > 0
    assert not os.path.exists(training.RunFiles(str(tmp_path)).eval_trajectories(0))


def test_evaluation_in_batches_of_tasks_plays_the_same_episodes(finished):
    workdir, _ = finished
    model = models.load("tiny")
    sampled = CONFIG.replace(eval=dict(size=5, repeats=2, temperature=1.0))

    def evaluate(batch_size):
        config = sampled.replace(eval=dict(batch_size=batch_size))
        source = trainer.make_reward_source(config, training.RunFiles(workdir),
                                            models.generate)
        return source.evaluate(model, config_lib.sampling_key(
            config, config_lib.EVAL_SAMPLING_STREAM, 0), 0, None)

    whole, batched = evaluate(0), evaluate(2)  # batches of 2, 2 and 1 tasks
    assert whole["episode_task_ids"] == [f"eval-{i}" for i in range(5)] * 2
    assert len(set(whole["episode_rewards"])) > 1  # sampled episodes that differ
    assert batched == whole


def test_a_run_with_tasks_in_batches_ends_the_same(finished, tmp_path):
    workdir, result = finished
    batched = training.train(CONFIG.replace(rollout=dict(batch_size=1),
                                            eval=dict(batch_size=1)), str(tmp_path),
                             machine=MACHINE)
    assert_trees_equal(batched.state, result.state)
    strip = lambda rs: [{k: v for k, v in r.items() if not k.endswith("_s")} for r in rs]
    assert strip(metrics.read_metrics(tmp_path / "metrics.jsonl")) == strip(
        metrics.read_metrics(os.path.join(workdir, "metrics.jsonl")))


def test_rerunning_a_finished_run_changes_nothing(finished, tmp_path):
    workdir, result = finished
    copy = shutil.copytree(workdir, tmp_path / "copy")
    again = training.train(CONFIG, str(copy))
    assert_trees_equal(again.state, result.state)
    strip = lambda rs: [{k: v for k, v in r.items() if k != "wall_time_s"} for r in rs]
    assert strip(metrics.read_metrics(copy / "metrics.jsonl")) == strip(
        metrics.read_metrics(os.path.join(workdir, "metrics.jsonl")))


def test_changed_settings_are_refused_before_the_model_loads(finished, monkeypatch):
    workdir, _ = finished

    def no_load(*args, **kwargs):
        raise AssertionError("the model must not be loaded")

    monkeypatch.setattr(models, "load", no_load)
    changed = CONFIG.replace(es=dict(population_size=6), run=dict(seed=4))
    with pytest.raises(ValueError, match="different configuration") as error:
        training.train(changed, workdir)
    assert "es.population_size: 4 in the workdir, 6 now" in str(error.value)
    assert "run.seed: 3 in the workdir, 4 now" in str(error.value)


def test_a_finished_run_resumes_under_another_mesh_and_rules(finished, tmp_path):
    workdir, result = finished
    shutil.copytree(workdir, tmp_path / "copy")
    resumed = training.train(CONFIG.replace(mesh=dict(shape="data:2,model:4", rules="tp")),
                             str(tmp_path / "copy"))
    assert_trees_equal(resumed.state, result.state)
    gate = resumed.state.params["layers"]["mlp"]["gate_proj"]["kernel"]  # (L, 64, 128)
    assert {shard.data.shape for shard in gate.addressable_shards} == {(2, 64, 32)}


def test_scope_that_selects_nothing_is_an_error(tmp_path):
    config = CONFIG.replace(es=dict(scope="no_such_layer"))
    with pytest.raises(ValueError, match="scope 'no_such_layer' matches no parameter"):
        training.train(config, str(tmp_path))


def test_lora_run_moves_only_adapters_replays_and_resumes_bitwise(tmp_path):
    config = CONFIG.replace(es=dict(scope="lora", lora_rank=2, lora_targets="q_proj,down_proj"))
    # The tiny model's head (embeddings ~ N(0, 0.02²)) gives near-uniform logits that
    # adapters barely move; a 10x sharper one lets members' replies (and rewards) differ.
    tiny = models.load("tiny")
    initial = {**tiny.params, "embed": {"embedding": 10 * tiny.params["embed"]["embedding"]}}
    model = dataclasses.replace(tiny, params=initial)
    workdir = str(tmp_path / "run")
    result = training.train(config, workdir, model=model)
    assert_trees_equal(models.lora.base(result.state.params), initial)
    adapters = models.lora.adapted(result.state.params)
    assert sorted(adapters) == [("layers", "attn", "q_proj"), ("layers", "mlp", "down_proj")]
    assert all(np.any(np.asarray(leaves["lora_b"])) for leaves in adapters.values())
    start = training.rules.make(config).init(initial).params
    replayed = es.history.replay(start, os.path.join(workdir, "history.jsonl"))
    assert_trees_equal(replayed, result.state.params)
    assert_trees_equal(restore_final(workdir, config), result.state)
    shutil.rmtree(os.path.join(workdir, "checkpoints", "3"))  # Resume redoes generation 2.
    assert_trees_equal(training.train(config, workdir, model=model).state, result.state)
    on_mesh = training.train(config.replace(mesh=dict(shape="data:2,model:4", rules="tp")),
                             workdir, model=model)  # Restores the adapters onto a mesh.
    assert_trees_equal(on_mesh.state, result.state)


def test_another_es_strategy_trains_replays_and_resumes_through_the_es_rule(tmp_path):
    config = CONFIG.replace(es=dict(strategy="random_search", learning_rate=1.0))
    workdir = str(tmp_path / "run")
    result = training.train(config, workdir)
    header, records = es.history.read(os.path.join(workdir, "history.jsonl"))
    assert header["strategy"]["strategy"] == "random_search"
    assert all(record["signs"][0] == 0 for record in records)  # θ itself is member 0.
    assert records[-1]["update_norm"] > 0  # It moved onto a better member.
    initial = models.load("tiny").params
    replayed = es.history.replay(initial, os.path.join(workdir, "history.jsonl"))
    assert_trees_equal(replayed, result.state.params)
    shutil.rmtree(os.path.join(workdir, "checkpoints", "3"))  # Resume redoes generation 2.
    assert_trees_equal(training.train(config, workdir).state, result.state)


def test_lora_targets_the_model_lacks_are_an_error(tmp_path):
    config = CONFIG.replace(es=dict(scope="lora", lora_targets="q_proj,in_proj_qkv"))
    with pytest.raises(ValueError, match=r"es.lora_targets: LoRA targets \['in_proj_qkv'\] "
                                         r"name no projection of this model; choose from"):
        training.train(config, str(tmp_path))


def test_is_due():
    assert [g for g in range(8) if trainer.is_due(g, 3, 7)] == [0, 3, 6, 7]


def test_the_run_generates_in_its_cache_layout_whether_loaded_or_given():
    config = CONFIG.replace(model=dict(cache_layout="stacked"))
    given = models.load("tiny")
    assert trainer.placed_model(config, given, None).config.cache_layout == "stacked"
    assert trainer.placed_model(config, None, None).config.cache_layout == "stacked"
    assert trainer.placed_model(CONFIG, given, None).config == given.config  # auto.


def test_task_normalised_es_tells_per_task_fitness_and_replays_bitwise(finished, tmp_path):
    plain_dir, _ = finished
    config = CONFIG.replace(es=dict(task_normalised=True))
    result = training.train(config, str(tmp_path))
    _, records = es.history.read(training.RunFiles(str(tmp_path)).history)
    _, plain = es.history.read(training.RunFiles(plain_dir).history)
    for record in records:
        by_task = np.asarray(record["rewards_by_task"])
        assert by_task.shape == (4, 2)
        np.testing.assert_allclose(record["rewards"], es.fitness.task_normalised(by_task),
                                   rtol=1e-6, atol=1e-6)
    # Up to the first generation whose rewards vary (the first update), both runs play
    # alike; only what ES is told differs.
    first = next(g for g, record in enumerate(plain) if np.ptp(record["rewards"]) > 0)
    for generation in range(first + 1):
        np.testing.assert_allclose(np.mean(records[generation]["rewards_by_task"], axis=1),
                                   plain[generation]["rewards"], rtol=1e-6)
    assert not np.allclose(records[first]["rewards"], plain[first]["rewards"])
    logged = [r for r in metrics.read_metrics(training.RunFiles(str(tmp_path)).metrics)
              if r["kind"] == "train"]
    assert [r["reward_mean"] for r in logged] == pytest.approx(
        [float(np.mean(r["rewards_by_task"])) for r in records])
    replayed = es.history.replay(models.load("tiny").params,
                                 training.RunFiles(str(tmp_path)).history)
    assert_trees_equal(replayed, result.state.params)


def test_task_normalised_es_refuses_a_heuristic_search_before_loading(tmp_path, monkeypatch):
    config = training.TrainConfig.from_dict(
        {"env": {"name": "ahd"}, "model": {"name": "tiny"}, "es": {"task_normalised": True}})
    monkeypatch.setattr(models, "load", lambda *a, **k: pytest.fail("loaded the model"))
    with pytest.raises(ValueError, match="rule.name=es, es.task_normalised needs multi-turn "
                                         "episodes; environment 'ahd' is a heuristic search"):
        training.train(config, str(tmp_path))
