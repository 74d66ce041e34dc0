"""Qwen3.5 (hybrid Gated DeltaNet + gated attention): parity with transformers, ES noise."""

import copy
import dataclasses
import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest
import safetensors.numpy
import torch
import transformers

from agentic_esopt import es, models
from agentic_esopt.models import architectures
from agentic_esopt.models.architectures import qwen3_5

from parity import (assert_population_rows_equal_member_forwards, left_padded_batch,
                    torch_logits)

# 8 layers: two groups of (linear, linear, linear, full); 4 value heads share 2 key heads.
QWEN3_5 = dict(num_hidden_layers=8, head_dim=16, linear_num_key_heads=2,
               linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=12)
LENGTH = 80  # Longer than one 64-token chunk.


@pytest.fixture(scope="module")
def reference(hf_checkpoint):
    torch_model, path = hf_checkpoint("qwen3_5", seed=3, **QWEN3_5)
    return torch_model, models.load(path)


@pytest.fixture(scope="module")
def population(reference):
    """A low-rank population of the reference model, shared so that its factors and
    perturbed members compile once."""
    strategy = es.agentic_esopt(population_size=3, sigma=0.05, learning_rate=1e-3,
                                noise="lowrank", rank=2)
    return strategy.ask(strategy.init(jax.random.key(7), reference[1].params))


def assert_logits_match(torch_model, model):
    ids, mask = left_padded_batch(length=LENGTH)
    ours = np.asarray(models.logits(model.config, model.params, ids, mask))
    expected = torch_logits(torch_model, ids, mask)
    real = mask.astype(bool)
    assert np.abs(expected[real]).max() > 0.5  # The comparison is not trivially small.
    # The linear-attention layers' chunked recurrences sum more terms than a dense layer:
    # float32 rounding reaches 1e-4 on the largest logits.
    np.testing.assert_allclose(ours[real], expected[real], atol=1e-4, rtol=1e-4)


def test_config_from_transformers(reference):
    config = reference[1].config
    assert architectures.get(config) is qwen3_5.ARCHITECTURE
    assert config.kinds == ("linear_attention",) * 3 + ("full_attention",) + (
        "linear_attention",) * 3 + ("full_attention",)
    assert qwen3_5.layer_pattern(config) == config.kinds[:4]
    assert config.rotary_dim == 4 and config.attn_output_gate
    assert config.stacked_layers("attn") == (3, 7)
    assert config.linear_attention.conv_dim == 2 * 2 * 8 + 4 * 12


def test_logits_match_transformers(reference):
    assert_logits_match(*reference)


def test_tied_head_logits_match_transformers(hf_checkpoint):
    torch_model, path = hf_checkpoint("qwen3_5", seed=4, tie_word_embeddings=True,
                                      num_hidden_layers=4, full_attention_interval=2,
                                      **{k: v for k, v in QWEN3_5.items()
                                         if k != "num_hidden_layers"})
    model = models.load(path)
    assert "lm_head" not in model.params
    assert model.config.kinds == ("linear_attention", "full_attention") * 2
    assert_logits_match(torch_model, model)


def test_multimodal_checkpoint_loads_its_language_model(reference, tmp_path):
    """Weights under model.language_model.*, mtp.* and vision weights ignored."""
    torch_model, model = reference
    tensors = {name.replace("model.", "model.language_model.", 1): t.numpy()
               for name, t in torch_model.state_dict().items()}
    tensors["mtp.fc.weight"] = np.zeros((4, 4), np.float32)
    tensors["model.visual.patch_embed.proj.weight"] = np.zeros((4, 3), np.float32)
    safetensors.numpy.save_file(tensors, tmp_path / "model.safetensors")
    text = json.loads(torch_model.config.to_json_string())
    outer = {"model_type": "qwen3_5", "architectures": ["Qwen3_5ForConditionalGeneration"],
             "tie_word_embeddings": False, "text_config": {**text, "eos_token_id": None},
             "vision_config": {"depth": 1}, "eos_token_id": 2}
    (tmp_path / "config.json").write_text(json.dumps(outer))
    loaded = models.load(tmp_path)
    assert loaded.config == model.config
    jax.tree.map(np.testing.assert_array_equal, loaded.params, model.params)


def test_chunked_delta_rule_equals_recurrent():
    rng = np.random.RandomState(0)
    B, T, H, dk, dv = 2, 150, 3, 8, 5
    q, k = (qwen3_5.l2_normalize(rng.randn(B, T, H, dk)) for _ in range(2))
    v = rng.randn(B, T, H, dv).astype(np.float32)
    g = -np.exp(rng.randn(B, T, H)).astype(np.float32)  # Decays down to ~e^-15 per step.
    beta = rng.uniform(size=(B, T, H)).astype(np.float32)
    state = rng.randn(B, H, dk, dv).astype(np.float32)
    out, final = qwen3_5.chunked_delta_rule(q, k, v, g, beta, state)
    out_ref, final_ref = qwen3_5.recurrent_delta_rule(q, k, v, g, beta, state)
    np.testing.assert_allclose(out, out_ref, atol=1e-5, rtol=0)
    np.testing.assert_allclose(final, final_ref, atol=1e-5, rtol=0)


def unit_lower_systems(batch, size=64, width=256, seed=0):
    """Unit lower-triangular systems like a Qwen3.5 chunk's (64 steps; values and keys of
    128 + 128 columns), strictly lower entries in [-0.3, 0.3]."""
    rng = np.random.RandomState(seed)
    lower = np.tril(rng.uniform(-0.3, 0.3, (batch, size, size)), -1)
    return (lower + np.eye(size)).astype(np.float32), rng.randn(batch, size, width).astype(
        np.float32)


def test_unit_lower_solve_on_cpu_solves():
    system, rhs = unit_lower_systems(4)
    expected = np.linalg.solve(system.astype(np.float64), rhs.astype(np.float64))
    np.testing.assert_allclose(qwen3_5.unit_lower_solve(system, rhs), expected, atol=1e-5)


def test_unit_lower_solve_returns_when_every_device_runs_it():
    """LAPACK's batched solve of this size never returns when 8 host devices call it at
    once (jax 0.10.2); the solve must (in a subprocess, so that a hang fails the test
    instead of stalling the suite)."""
    script = """
import jax, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from agentic_esopt.models.architectures import qwen3_5
import test_qwen3_5
system, rhs = test_qwen3_5.unit_lower_systems(len(jax.devices()) * 64)
rows = NamedSharding(Mesh(jax.devices(), ("data",)), P("data"))
system, rhs = jax.device_put(system, rows), jax.device_put(rhs, rows)
solve = jax.jit(qwen3_5.unit_lower_solve)
for _ in range(20):  # LAPACK's kernel hung within 20 calls in 3 of 3 tries
    solved = jax.block_until_ready(solve(system, rhs))
system, rhs = np.asarray(system), np.asarray(rhs)
print(len(jax.devices()), float(np.abs(np.einsum("bij,bjk->bik", system, solved) - rhs).max()))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, cwd=os.path.dirname(__file__), check=True)
    devices, residual = done.stdout.split()
    assert int(devices) == 8 and float(residual) < 1e-4


def prompts():
    """Token prompts of 70, 5 and 23 tokens (the first longer than one 64-token chunk)."""
    rng = np.random.RandomState(1)
    return [rng.randint(3, 259, n).tolist() for n in (70, 5, 23)]


def torch_greedy(torch_model, token_lists, max_new_tokens):
    width = max(map(len, token_lists))
    ids = torch.tensor([[0] * (width - len(t)) + t for t in token_lists])
    mask = torch.tensor([[0] * (width - len(t)) + [1] * len(t) for t in token_lists])
    with torch.no_grad():
        out = torch_model.generate(input_ids=ids, attention_mask=mask, do_sample=False,
                                   max_new_tokens=max_new_tokens, eos_token_id=-1,
                                   pad_token_id=0)
    return out[:, width:].tolist()


def test_greedy_generation_matches_transformers(reference):
    torch_model, model = reference
    token_lists = prompts()
    expected = torch_greedy(torch_model, token_lists, 10)
    out = models.generate(model, token_lists, max_new_tokens=10, temperature=0.0)
    assert out.token_ids == expected
    alone = models.generate(model, token_lists[1:2], max_new_tokens=10)
    assert alone.token_ids == expected[1:2]  # Padding does not leak into the state.


def test_long_prompts_fed_in_pieces_carry_the_recurrent_state(reference, request):
    _, model = reference
    token_lists = prompts()
    whole = models.generate(model, token_lists, max_new_tokens=10)
    widths = request.getfixturevalue("fed_pieces")  # From here on.
    assert models.generate(model, token_lists, max_new_tokens=10).token_ids == whole.token_ids
    assert widths == [12] * 8  # The 96-token bucket, halved to 12-token pieces.


def test_es_noise_leaf_kinds(reference):
    params = reference[1].params
    shapes = {jax.tree_util.keystr(path): leaf.shape
              for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]}
    matrices = {path for path, shape in shapes.items() if es.noise.is_matrix(path, shape)}
    linear = "['layers']['linear_attn']"
    assert {f"{linear}['{p}']['kernel']" for p in ("in_proj_qkv", "in_proj_z", "in_proj_b",
                                                    "in_proj_a", "out_proj")} <= matrices
    for vector in ("['conv1d']['scale']", "['A_log']['scale']", "['dt']['bias']",
                   "['norm']['scale']"):
        assert linear + vector in shapes and linear + vector not in matrices
    assert all(p.endswith("['kernel']") or "embed" in p for p in matrices)


def test_lowrank_rows_equal_forward_on_perturbed_params(reference, population):
    config, params = reference[1].config, reference[1].params
    members = np.array([2, 0, 1])
    ids, mask = left_padded_batch(length=LENGTH)
    assert_population_rows_equal_member_forwards(config, params, population, members, ids,
                                                 mask)


def test_init_params():
    config = architectures.config_from_hf({
        "model_type": "qwen3_5_text", "vocab_size": 32, "hidden_size": 64,
        "intermediate_size": 96, "num_hidden_layers": 8, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "linear_num_key_heads": 2,
        "linear_num_value_heads": 4, "linear_key_head_dim": 8, "linear_value_head_dim": 12})
    assert config.kinds == ("linear_attention",) * 3 + ("full_attention",) + (
        "linear_attention",) * 3 + ("full_attention",)  # full_attention_interval 4.
    assert config.rotary_dim == 4  # Default partial_rotary_factor 0.25.
    params = models.init_params(config, jax.random.key(0))
    linear = params["layers"]["linear_attn"]
    assert linear["conv1d"]["scale"].shape == (6, config.linear_attention.conv_dim, 1, 4)
    assert float(np.abs(linear["conv1d"]["scale"]).max()) > 0  # Drawn, not constant.
    assert params["layers"]["attn"]["q_proj"]["kernel"].shape == (2, 64, 2 * 4 * 16)
    assert params["layers"]["mlp"]["up_proj"]["kernel"].shape == (8, 64, 96)
    assert float(np.abs(params["final_norm"]["scale"]).max()) == 0.0  # x̂·(1 + 0).
    assert float(linear["norm"]["scale"].min()) == 1.0
    ids = np.arange(6).reshape(1, 6)
    assert np.isfinite(models.logits(config, params, ids, np.ones_like(ids))).all()


def test_bfloat16_is_as_close_as_transformers_bfloat16(reference):
    torch_model, model = reference
    bf16 = jax.tree.map(lambda p: p.astype("bfloat16"), model.params)
    ids, mask = left_padded_batch(length=LENGTH)
    ours = np.asarray(models.logits(model.config, bf16, ids, mask))
    full = torch_logits(torch_model, ids, mask)
    torch_bf16 = torch_logits(copy.deepcopy(torch_model).to(torch.bfloat16), ids, mask)
    real = mask.astype(bool)
    assert ours.dtype == np.float32 and np.isfinite(ours).all()
    ours_error = np.abs(ours[real] - full[real]).max()
    assert 0 < ours_error <= 1.5 * np.abs(torch_bf16[real] - full[real]).max()


def test_save_pretrained_round_trips_through_transformers(reference, tmp_path):
    torch_model, model = reference
    out = models.save_pretrained(model, tmp_path / "export")
    loaded = models.load(out)
    assert loaded.config == model.config
    jax.tree.map(np.testing.assert_array_equal, loaded.params, model.params)
    exported = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    assert type(exported) is type(torch_model)
    ids, mask = left_padded_batch(length=LENGTH)
    np.testing.assert_array_equal(torch_logits(exported, ids, mask),
                                  torch_logits(torch_model, ids, mask))


def test_lowrank_population_generates_like_perturbed_members(reference, population):
    model, token_lists = reference[1], prompts()
    members = np.array([2, 0, 1])
    out = models.generate(model, token_lists, max_new_tokens=10, population=population,
                          members=members)
    for row, member in enumerate(members):
        member_model = dataclasses.replace(
            model, params=es.noise.perturb(model.params, population, member))
        # The whole batch, in the plain generation's compiled shapes (rows are independent
        # of the batch: test_greedy_generation_matches_transformers).
        expected = models.generate(member_model, token_lists, max_new_tokens=10)
        assert out.token_ids[row] == expected.token_ids[row]
    assert out.token_ids != models.generate(model, token_lists, max_new_tokens=10).token_ids


def test_padding_does_not_reach_the_state(reference):
    model = reference[1]
    ids, mask = left_padded_batch(length=LENGTH)
    other = np.where(mask.astype(bool), ids, (ids * 7 + 1) % 259)  # Different pad tokens.
    real = mask.astype(bool)
    first = np.asarray(models.logits(model.config, model.params, ids, mask))
    second = np.asarray(models.logits(model.config, model.params, other, mask))
    np.testing.assert_array_equal(first[real], second[real])


def test_loader_rejects_a_mixer_on_the_wrong_layer(hf_checkpoint):
    _, path = hf_checkpoint("qwen3_5", seed=5, num_hidden_layers=4, **{
        k: v for k, v in QWEN3_5.items() if k != "num_hidden_layers"})
    tensors = safetensors.numpy.load_file(path / "model.safetensors")
    tensors["model.layers.3.linear_attn.A_log"] = tensors["model.layers.0.linear_attn.A_log"]
    safetensors.numpy.save_file(tensors, path / "model.safetensors")
    with pytest.raises(ValueError, match=r"layers\.3\.linear_attn\.A_log.*not a linear_attn"):
        models.load(path)
