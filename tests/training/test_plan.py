"""The planner's programs on abstract arrays: sane per-device figures on fake CPU devices."""

import dataclasses

import jax
import pytest

from agentic_esopt import targets
from agentic_esopt.models import published, tiny
from agentic_esopt.training import TrainConfig, plan
from experiments.configs import cpu_default

SHAPES = plan.Shapes(prompt_tokens=16, turns=2)


def config(**sections):
    values = cpu_default.get_config().to_dict()
    values["model"]["name"] = "tiny"
    values["mesh"]["shape"] = "data:2,model:2"
    values["rollout"].update(tasks_per_generation=2, max_new_tokens=4)
    values["eval"]["size"] = 2
    for name, changes in sections.items():
        values[name].update(changes)
    return TrainConfig.from_dict(values)


def cpu4():
    target = targets.target("cpu:8")
    return dataclasses.replace(target, name="cpu:4", devices=target.devices[:4])


@pytest.fixture(scope="module")
def es_and_grpo():
    return {rule: plan.plan(config(rule={"name": rule}, rollout={"temperature": 0.7}),
                            tiny.tiny_config(), cpu4(), SHAPES) for rule in ("es", "grpo")}


def by_name(result):
    return {p["name"]: p for p in result["programs"]}


def test_tell_holds_about_the_parameters_of_a_device(es_and_grpo):
    es = es_and_grpo["es"]
    tell = by_name(es)["es/tell"]
    assert es["param_bytes_per_device"] == pytest.approx(
        4 * es["num_params"] / 2, rel=0.05)  # float32, fsdp over model:2
    assert tell["argument_bytes"] == pytest.approx(es["param_bytes_per_device"], rel=0.05)


def test_grpo_needs_more_than_es(es_and_grpo):
    es, grpo = es_and_grpo["es"], es_and_grpo["grpo"]
    assert grpo["per_device_bytes"] > es["per_device_bytes"]
    step = by_name(grpo)["grpo/train_step"]
    assert step["argument_bytes"] > 3 * grpo["param_bytes_per_device"]  # + AdamW moments
    # The two float32 moments shard as the parameters do (model:2), not replicated.
    assert by_name(grpo)["grpo/init"]["output_bytes"] == pytest.approx(
        2 * grpo["param_bytes_per_device"], rel=0.05)


def test_generation_programs_read_weights_and_cache(es_and_grpo):
    decode = by_name(es_and_grpo["es"])["es/decode"]
    assert decode["calls"] == SHAPES.turns * 4  # max_new_tokens steps per turn
    assert 1 <= decode["held_over_ideal"] < 3
    assert decode["flops"] > 0 and es_and_grpo["es"]["fits"]


def test_full_rank_members_keep_theta_and_their_caches_resident():
    full = {"noise": "full", "antithetic": False}
    result = plan.plan(config(es=full), tiny.tiny_config(), cpu4(), SHAPES)
    programs = by_name(result)
    assert "es/perturb" in programs and "es/deltas" not in programs
    assert programs["es/decode"]["resident_bytes"] > result["param_bytes_per_device"]
    unkept = plan.plan(config(es=full, rollout={"keep_kv_cache": False}),
                       tiny.tiny_config(), cpu4(), SHAPES)
    assert by_name(unkept)["es/decode"]["resident_bytes"] == result["param_bytes_per_device"]


def test_tasks_in_batches_plan_smaller_calls_more_often():
    def programs(rule, batch_size):  # 3 batches: of 3, 3 and 2 tasks
        return by_name(plan.plan(config(rule={"name": rule}, rollout={
            "tasks_per_generation": 8, "batch_size": batch_size, "temperature": 0.7},
            eval={"size": 8, "batch_size": batch_size}), tiny.tiny_config(), cpu4(), SHAPES))
    for rule, rollout in (("es", "es"), ("grpo", "grpo")):
        whole, batched = programs(rule, 0), programs(rule, 3)
        for name in (f"{rollout}/decode", "eval/decode"):
            assert batched[name]["calls"] == 3 * whole[name]["calls"]
        for name in (f"{rollout}/prefill", "eval/prefill"):
            assert batched[name]["output_bytes"] < whole[name]["output_bytes"]
    assert batched["grpo/train_step"]["calls"] == whole["grpo/train_step"]["calls"]


def test_a_tiny_device_does_not_fit_and_says_what_would():
    target = dataclasses.replace(cpu4(), device_memory_bytes=1000)
    result = plan.plan(config(), tiny.tiny_config(), target, SHAPES)
    assert not result["fits"] and result["excess_bytes"] > 0
    assert any("model parallelism" in s for s in result["suggestions"])


def test_bad_meshes_and_targets_are_one_line_each():
    with pytest.raises(ValueError, match="has 8 devices; target cpu:4 has 4"):
        plan.plan(config(mesh={"shape": "data:4,model:2"}), tiny.tiny_config(), cpu4(), SHAPES)
    with pytest.raises(ValueError, match="unknown target 'gpu:8'.*tpu:GENERATION"):
        targets.target("gpu:8")
    with pytest.raises(ValueError, match=r"needs 64 CPU devices; JAX started with \d+"):
        targets.target("cpu:64")
    with pytest.raises(ValueError, match="unknown TPU generation 'v9'.*v5e"):
        targets.target("tpu:v9:2x2")
    with pytest.raises(ValueError, match="unknown model 'qwen9'.*qwen3.5-4b"):
        published.model_config("qwen9")


def test_published_models_have_their_parameter_counts():
    counts = {name: plan.rules.base.parameter_count(jax.eval_shape(
        lambda c=published.model_config(name)[0]: plan.abstract_params(
            c, "bfloat16", jax.sharding.Mesh(jax.devices()[:1], ("data",)), ((".*", ()),))))
        for name in ("qwen3.5-4b", "qwen2.5-7b", "llama-3.1-8b")}
    assert counts["qwen3.5-4b"] == pytest.approx(4.21e9, rel=0.01)
    assert counts["qwen2.5-7b"] == pytest.approx(7.62e9, rel=0.01)
    assert counts["llama-3.1-8b"] == pytest.approx(8.03e9, rel=0.01)


@pytest.mark.parametrize("device_peak, predicted, peak", [
    (None, 100 * 4 + 30, 520),  # CPU: the process's RSS against every device's total.
    (90, 100, 90),  # GPU, TPU: one device's peak against the per-device total.
])
def test_compare_peak_sets_the_measured_peak_against_the_plan(device_peak, predicted, peak):
    result = dict(per_device_bytes=100, devices=4)
    measured = dict(device_peak_bytes=device_peak, peak_rss_bytes=520, rss_before_bytes=30)
    compared = plan.compare_peak(result, measured)
    assert (compared["predicted_peak_bytes"], compared["measured_peak_bytes"]) == (predicted,
                                                                                   peak)
    assert compared["measured_over_predicted"] == peak / predicted
