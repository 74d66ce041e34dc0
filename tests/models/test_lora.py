"""models.lora: adapters initialised as PEFT does, population-batched like any leaf, and
exported as PEFT adapter folders (peft applies them with our logits) or merged weights."""

import json

import jax
import numpy as np
import peft
import pytest
import safetensors.numpy

from agentic_esopt import es, models
from agentic_esopt.models import architectures, lora, tiny

from parity import assert_population_rows_equal_member_forwards, left_padded_batch
from test_export import load_torch, random_model, token_batch, torch_logits

SETTINGS = lora.Settings(rank=4, alpha=16, targets=("q_proj", "v_proj", "down_proj"))
QWEN3_5 = architectures.config_from_hf({
    "model_type": "qwen3_5_text", "vocab_size": 259, "hidden_size": 64,
    "intermediate_size": 96, "num_hidden_layers": 4, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 16, "linear_num_key_heads": 2,
    "linear_num_value_heads": 4, "linear_key_head_dim": 8, "linear_value_head_dim": 12,
    "eos_token_id": 2, "pad_token_id": 0})
QWEN3_5_SETTINGS = lora.Settings(rank=4, alpha=8, targets=("q_proj", "o_proj", "in_proj_qkv",
                                                           "up_proj"))
# The export parity tests' tolerances (test_export; for qwen3_5 twice test_qwen3_5's
# atol: with merged or adapted weights the gated-delta recurrences' float32 rounding
# reached 1.06e-4 on one of 10,619 logits on the CI machine's CPU).
TOLERANCES = {"qwen3_5": dict(atol=2e-4, rtol=1e-4)}
CASES = {"llama": (tiny.tiny_config(), SETTINGS),
         "qwen2-biases": (architectures.config_from_hf(
             {**architectures.config_to_hf(tiny.tiny_config()), "model_type": "qwen2"}),
             SETTINGS),
         "qwen3_5": (QWEN3_5, QWEN3_5_SETTINGS)}


def with_random_b(params, seed=1):
    """Adapters whose B are ~ N(0, 0.3²), so that they change the logits."""
    keys = iter(jax.random.split(jax.random.key(seed), 16))
    for leaves in lora.adapted(params).values():
        leaves["lora_b"] = 0.3 * jax.random.normal(next(keys), leaves["lora_b"].shape)
    return params


def adapted_model(name):
    config, settings = CASES[name]
    model = random_model(config)
    return model, with_random_b(lora.add_lora(model.params, jax.random.key(0), settings))


def test_adapters_start_as_peft_does_and_leave_the_model_unchanged():
    config, params, _ = tiny.tiny_model_parts()
    adapted = lora.add_lora(params, jax.random.key(0), SETTINGS)
    q = adapted["layers"]["attn"]["q_proj"]
    assert q["lora_a"].shape == (2, 64, 4) and q["lora_b"].shape == (2, 4, 64)
    down = adapted["layers"]["mlp"]["down_proj"]
    assert down["lora_a"].shape == (2, 128, 4) and down["lora_b"].shape == (2, 4, 64)
    # kaiming_uniform_(a=√5) on torch's (r, in) weight: U(−1/√in, 1/√in); B = 0.
    a = np.asarray(down["lora_a"])
    assert np.abs(a).max() <= 1 / np.sqrt(128) and np.std(a) == pytest.approx(
        1 / np.sqrt(3 * 128), rel=0.1)
    assert not np.any(np.asarray(q["lora_b"])) and np.all(np.asarray(q["lora_scale"]) == 4.0)
    assert set(adapted["layers"]["attn"]["k_proj"]) == {"kernel"}
    assert lora.settings_of(adapted) == lora.Settings(4, 16, ("down_proj", "q_proj", "v_proj"))
    ids = np.random.RandomState(0).randint(3, 259, (2, 9))
    np.testing.assert_allclose(models.logits(config, adapted, ids),
                               models.logits(config, params, ids), atol=1e-6, rtol=0)
    assert jax.tree.structure(lora.base(adapted)) == jax.tree.structure(params)


def test_bad_targets_name_the_projections_there_are():
    params = tiny.tiny_model_parts()[1]
    with pytest.raises(ValueError, match=r"\['in_proj_qkv'\] name no projection of this "
                                         r"model; choose from \['down_proj', 'gate_proj', "
                                         r"'k_proj', 'o_proj', 'q_proj', 'up_proj', 'v_proj'\]"):
        lora.add_lora(params, jax.random.key(0), SETTINGS._replace(targets=("q_proj",
                                                                            "in_proj_qkv")))
    adapted = lora.add_lora(params, jax.random.key(0), SETTINGS)
    with pytest.raises(ValueError, match="already have LoRA adapters"):
        lora.add_lora(adapted, jax.random.key(0), SETTINGS)
    with pytest.raises(ValueError, match="rank >= 1"):
        lora.add_lora(params, jax.random.key(0), SETTINGS._replace(rank=0))


@pytest.mark.parametrize("noise", ["lowrank", "full"])
@pytest.mark.parametrize("name", ["llama", "qwen3_5"])
def test_population_rows_equal_member_forwards_on_materialised_adapters(name, noise):
    model, params = adapted_model(name)
    strategy = es.agentic_esopt(4, 0.3, 1e-3, noise=noise, rank=2 if noise == "lowrank" else 1,
                                scope="lora")
    population = strategy.ask(strategy.init(jax.random.key(5), params))
    ids, mask = left_padded_batch(length=20)
    members = np.array([3, 0, 1])
    assert_population_rows_equal_member_forwards(model.config, params, population, members,
                                                 ids, mask)
    perturbed = jax.tree.leaves(es.noise.perturb(params, population, 1))
    for (path, leaf), new in zip(jax.tree_util.tree_flatten_with_path(params)[0], perturbed):
        assert (not np.array_equal(leaf, new)) == (path[-1].key in ("lora_a", "lora_b")), path


@pytest.mark.parametrize("name", CASES)
def test_peft_applies_the_exported_adapter_with_our_logits(tmp_path, name):
    model, params = adapted_model(name)
    models.save_pretrained(model, tmp_path / "base")
    out = models.save_adapter(model.config, params, tmp_path / "adapter",
                              base_model_name_or_path=str(tmp_path / "base"))
    assert sorted(p.name for p in out.iterdir()) == ["adapter_config.json",
                                                     "adapter_model.safetensors"]
    written = json.loads((out / "adapter_config.json").read_text())
    settings = CASES[name][1]
    assert (written["peft_type"], written["task_type"], written["r"], written["lora_alpha"],
            sorted(written["target_modules"])) == ("LORA", "CAUSAL_LM", settings.rank,
                                                   settings.alpha, sorted(settings.targets))
    tensors = safetensors.numpy.load_file(out / "adapter_model.safetensors")
    layer = model.config.stacked_layers("attn")[0]
    q = f"base_model.model.model.layers.{layer}.self_attn.q_proj"
    assert tensors[f"{q}.lora_A.weight"].shape == (4, 64)  # (r, in)
    assert tensors[f"{q}.lora_B.weight"].shape[1] == 4  # (out, r)
    adapted = peft.PeftModel.from_pretrained(load_torch(tmp_path / "base"), out).eval()
    ids, mask = token_batch(model.config)
    ours = np.asarray(models.logits(model.config, params, ids, mask))
    base = np.asarray(models.logits(model.config, model.params, ids, mask))
    real = mask.astype(bool)
    assert np.abs(ours - base)[real].max() > 1e-2  # The adapters matter.
    np.testing.assert_allclose(torch_logits(adapted, ids, mask)[real], ours[real],
                               **TOLERANCES.get(name, dict(atol=1e-4, rtol=0)))


@pytest.mark.parametrize("name", ["llama", "qwen3_5"])
def test_merged_weights_load_in_transformers_with_our_logits(tmp_path, name):
    model, params = adapted_model(name)
    merged = lora.merge(params)
    assert jax.tree.structure(merged) == jax.tree.structure(model.params)
    models.save_pretrained(model, tmp_path / "merged", params=merged)
    ids, mask = token_batch(model.config)
    ours = np.asarray(models.logits(model.config, params, ids, mask))
    real = mask.astype(bool)
    np.testing.assert_allclose(torch_logits(load_torch(tmp_path / "merged"), ids, mask)[real],
                               ours[real], **TOLERANCES.get(name, dict(atol=1e-4, rtol=0)))


def test_save_pretrained_refuses_adapters(tmp_path):
    model, params = adapted_model("llama")
    with pytest.raises(ValueError, match="have LoRA adapters: write them with save_adapter"):
        models.save_pretrained(model, tmp_path / "out", params=params)
    with pytest.raises(ValueError, match="no LoRA adapters"):
        models.save_adapter(model.config, model.params, tmp_path / "out",
                            base_model_name_or_path="tiny")
    assert not (tmp_path / "out").exists()
