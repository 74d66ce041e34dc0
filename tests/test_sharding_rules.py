"""Sharding rules, meshes and sharded loading (8 fake CPU devices, see conftest)."""

import functools

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from agentic_esopt import models, sharding
from agentic_esopt.models import loading
from agentic_esopt.models.config import ModelConfig

M = sharding.MODEL
STACKED = ("layers/attn/q_proj/kernel", "layers/attn/k_proj/kernel",
           "layers/attn/v_proj/kernel", "layers/attn/o_proj/kernel",
           "layers/mlp/gate_proj/kernel", "layers/mlp/up_proj/kernel",
           "layers/mlp/down_proj/kernel")
NORMS = {"final_norm/scale": P(None), "layers/input_norm/scale": P(None, None),
         "layers/post_attn_norm/scale": P(None, None)}
# The intended spec of every leaf of a Llama tree, per preset.
LLAMA = {
    "replicated": {**NORMS, "embed/embedding": P(None, None), "lm_head/kernel": P(None, None),
                   **{name: P(None, None, None) for name in STACKED}},
    "fsdp": {**NORMS, "embed/embedding": P(None, M), "lm_head/kernel": P(M, None),
             **{name: P(None, M, None) for name in STACKED}},
    "tp": {**NORMS, "embed/embedding": P(None, M), "lm_head/kernel": P(None, M),
           **{name: P(None, M, None) if ("o_proj" in name or "down_proj" in name)
              else P(None, None, M) for name in STACKED}},
}
# What Qwen2 (q/k/v biases) and Qwen3 (q/k norms) add.
EXTRA = {
    "qwen2": {preset: {f"layers/attn/{p}_proj/bias": P(None, M if preset == "tp" else None)
                       for p in "qkv"} for preset in LLAMA},
    "qwen3": {preset: {f"layers/attn/{p}_norm/scale": P(None, None) for p in "qk"}
              for preset in LLAMA},
    "llama": {preset: {} for preset in LLAMA},
}


def config(model_type, vocab_size=256):
    return ModelConfig(model_type=model_type, vocab_size=vocab_size, hidden_size=64,
                       intermediate_size=128, num_layers=2, num_heads=4, num_kv_heads=2,
                       head_dim=16, qkv_bias=model_type == "qwen2",
                       qk_norm=model_type == "qwen3")


def shapes(model_config):
    return jax.eval_shape(functools.partial(models.init_params, model_config),
                          jax.random.key(0))


def named(tree):
    """{path name: leaf} of a tree of arrays, shardings or PartitionSpecs."""
    leaves = jax.tree_util.tree_flatten_with_path(tree, is_leaf=lambda x: isinstance(x, P))[0]
    return {sharding.path_name(path): leaf for path, leaf in leaves}


@pytest.mark.parametrize("preset", sorted(LLAMA))
@pytest.mark.parametrize("model_type", ["llama", "qwen2", "qwen3"])
def test_presets_give_the_intended_spec_of_every_leaf(model_type, preset):
    specs = sharding.tree_specs(sharding.parse_rules(preset), shapes(config(model_type)),
                                {"data": 4, "model": 2})
    assert named(specs) == {**LLAMA[preset], **EXTRA[model_type][preset]}


def test_rules_that_do_not_divide_name_every_leaf_and_the_axis():
    tree = shapes(config("llama", vocab_size=259))
    with pytest.raises(ValueError) as error:
        sharding.tree_specs(sharding.parse_rules("tp"), tree, {"data": 1, "model": 2})
    assert str(error.value) == (
        "sharding rules do not fit the parameters:\n  parameter 'lm_head/kernel': dimension "
        "1 (size 259) is not divisible by mesh axis 'model' (size 2), rule 'lm_head/kernel'")
    with pytest.raises(ValueError) as error:
        sharding.tree_specs(sharding.parse_rules("fsdp"), tree, {"data": 1, "model": 3})
    text = str(error.value)
    assert "'embed/embedding': dimension 1 (size 64) is not divisible by mesh axis 'model' " \
           "(size 3)" in text
    assert all(f"'{name}'" in text for name in STACKED if "down_proj" not in name)


def test_explicit_rules_apply_to_trailing_dimensions_and_must_match_every_leaf():
    rules = sharding.parse_rules(r".*/kernel=None,model; embed/.*=model,None")
    specs = named(sharding.tree_specs(rules, {"lm_head": {"kernel": np.zeros((4, 6))},
                                              "layers": {"kernel": np.zeros((2, 4, 6))}},
                                      {"data": 1, "model": 2}))
    assert specs == {"lm_head/kernel": P(None, M), "layers/kernel": P(None, None, M)}
    with pytest.raises(ValueError, match="no sharding rule matches parameter 'final/scale'"):
        sharding.tree_specs(rules, {"final": {"scale": np.zeros(4)}}, {"data": 1, "model": 2})
    with pytest.raises(ValueError, match="gives 2 dimensions to parameter 'embed/x'"):
        sharding.tree_specs(rules, {"embed": {"x": np.zeros(4)}}, {"data": 1, "model": 2})


@pytest.mark.parametrize("text, message", [
    ("data:4,data:2", "unknown or repeated"), ("model:two", "needs a positive size"),
    ("rows:2", "unknown or repeated")])
def test_bad_mesh_shapes(text, message):
    with pytest.raises(ValueError, match=message):
        sharding.parse_shape(text)


def test_mesh_shapes_cover_the_devices():
    assert sharding.parse_shape("model:2") == {"data": 1, "model": 2}
    mesh = sharding.make_mesh({"data": 4, "model": 2})
    assert dict(mesh.shape) == {"data": 4, "model": 2} and mesh.local_mesh == mesh
    with pytest.raises(ValueError, match="has 4 devices; there are 8"):
        sharding.make_mesh({"data": 2, "model": 2})


def test_place_shards_as_the_rules_say_and_keeps_values():
    params = models.load("tiny").params
    layout = sharding.Layout(sharding.make_mesh({"data": 4, "model": 2}),
                             sharding.parse_rules("fsdp"))
    placed = named(layout.place(params))
    for name, leaf in named(params).items():
        np.testing.assert_array_equal(np.asarray(placed[name]), np.asarray(leaf))
    kernel = placed["layers/mlp/down_proj/kernel"]
    assert kernel.sharding.spec == P(None, M, None)
    assert {shard.data.shape for shard in kernel.addressable_shards} == {(2, 64, 64)}


def test_sharded_load_reads_only_each_devices_block(tmp_path, monkeypatch):
    model = models.load("tiny")
    models.save_pretrained(model, tmp_path)
    blocks = []
    read = loading.read_leaf_slice

    def recording(tensors, names, kernel, spec, index):
        block = read(tensors, names, kernel, spec, index)
        blocks.append((spec.shape, block.shape))
        return block

    monkeypatch.setattr(loading, "read_leaf_slice", recording)
    layout = sharding.Layout(sharding.make_mesh({"data": 2, "model": 4}),
                             sharding.parse_rules("fsdp"))
    loaded = loading.load_hf_dir(tmp_path, shardings=layout.shardings)
    for name, leaf in named(model.params).items():
        np.testing.assert_array_equal(np.asarray(named(loaded.params)[name]), np.asarray(leaf))
        assert named(loaded.params)[name].sharding == named(layout.shardings(
            model.params))[name]
    kernels = [(full, block) for full, block in blocks if len(full) == 3]
    assert kernels and all(block[1] * 4 == full[1] for full, block in kernels)


def test_without_a_mesh_one_process_keeps_the_default_device():
    assert sharding.layout(sharding.MeshOptions()) is None
    assert sharding.process_slice(5) == range(5)
    assert sharding.allgather_bytes(b"abc") == [b"abc"]


@pytest.mark.parametrize("processes", [2, 3, 4])
def test_processes_share_the_members_contiguously_and_evenly(monkeypatch, processes):
    monkeypatch.setattr(jax, "process_count", lambda: processes)
    shares = []
    for index in range(processes):
        monkeypatch.setattr(jax, "process_index", lambda index=index: index)
        shares.append(sharding.process_slice(4))
    assert [m for share in shares for m in share] == list(range(4))
    assert max(map(len, shares)) - min(map(len, shares)) <= 1
