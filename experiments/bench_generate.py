"""Benchmark of batched KV-cache generation, plain and population-batched.

    python -m experiments.bench_generate --json [--model=tiny] [--cache_layout=stacked]

Prints one JSON object with, per batch size: prefill and decode tokens/s (greedy, no early
stop; compilation excluded and reported separately; best of --repeats runs, as the machine
may be shared), achieved GFLOP/s as a fraction of
this machine's float32 matmul GFLOP/s measured in the same run (FLOPs = 2 x matmul params
x tokens + causal attention), decode's time against its roofline (the larger of its FLOPs
at that matmul rate and the bytes it must read, every weight once per step and every real
cached key and value, at the memory read rate measured in the same run), the compiled
decode loop's memory, and transformers+torch
generate on the same weights and lengths. Then population mode: G members x k rows with
low-rank noise in one batch versus plain inference of the same rows, and versus
sequential full-rank members (perturb, then generate each member's rows). Last, a Qwen3.5
row (``qwen3_5``): a random hybrid model of a small Qwen3.5 shape (``QWEN3_5_SHAPE``), built
with transformers and loaded from a temporary folder, timed at --qwen3_5_batch rows against
transformers' torch fallback kernels (chunked gated delta rule, causal conv) on the same
weights. The object also says where it ran (backend, devices, processes, mesh, rules) and
the dense model's KV cache layout (``--cache_layout``: per_layer, stacked, or auto:
per_layer on CPU, stacked on GPU/TPU; the Qwen3.5 row always stacks);
``--mesh=data:4,model:2`` loads the parameters sharded by ``--rules`` (generation then
follows their shardings through jit).
"""

import json
import os
import tempfile
import time

from absl import app, flags
import jax
import jax.numpy as jnp
import numpy as np

from agentic_esopt import es, models, sharding
from agentic_esopt.models import config as config_lib
from agentic_esopt.models import decoder, layers, loading, sampling

_MODEL = flags.DEFINE_string("model", "smollm2-135m", "Model name or path for models.load.")
_DTYPE = flags.DEFINE_enum("dtype", "float32", list(loading.DTYPES), "Parameter dtype.")
_CACHE_LAYOUT = flags.DEFINE_enum("cache_layout", "auto", list(config_lib.CACHE_LAYOUTS),
                                  "KV cache layout of the dense model.")
_BATCH_SIZES = flags.DEFINE_list("batch_sizes", ["1", "8", "32", "64"], "Batch sizes.")
_PROMPT_LEN = flags.DEFINE_integer("prompt_len", 128, "Prompt tokens per row.")
_NEW_TOKENS = flags.DEFINE_integer("new_tokens", 64, "Generated tokens per row.")
_POPULATION = flags.DEFINE_integer("population_size", 32, "Members G in population mode.")
_ROWS_PER_MEMBER = flags.DEFINE_integer("rows_per_member", 2, "Rows per member.")
_RANK = flags.DEFINE_integer("rank", 1, "Low-rank noise rank.")
_SEQUENTIAL_MEMBERS = flags.DEFINE_integer(
    "sequential_members", 4, "Full-rank members actually run (the figure is per token).")
_REPEATS = flags.DEFINE_integer("repeats", 2, "Timed runs per figure; the fastest counts.")
_TORCH = flags.DEFINE_bool("torch", True, "Also time transformers+torch generate.")
_MESH = flags.DEFINE_string("mesh", "", "Mesh shape, e.g. data:4,model:2 (empty: none).")
_RULES = flags.DEFINE_string("rules", "fsdp", "Sharding rules: a preset or explicit rules.")
_JSON = flags.DEFINE_bool("json", False, "Print only the JSON result.")
_QWEN3_5 = flags.DEFINE_bool("qwen3_5", True, "Also time a random small Qwen3.5 model.")
_QWEN3_5_BATCH = flags.DEFINE_integer("qwen3_5_batch", 8, "Rows of the Qwen3.5 row.")

# A scaled-down Qwen3.5 (the layer pattern, head layout and ratios of the 4B model).
QWEN3_5_SHAPE = dict(vocab_size=8192, hidden_size=512, intermediate_size=1536,
                     num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=2,
                     head_dim=64, linear_num_key_heads=4, linear_num_value_heads=8,
                     linear_key_head_dim=64, linear_value_head_dim=64, pad_token_id=0)

GREEDY = sampling.SamplingMode(greedy=True, top_k=None, top_p=False)


def matmul_gflops(n: int, k: int, m: int, repeats: int = 10) -> float:
    """float32 GFLOP/s of a jitted (n, k) @ (k, m) matmul on the default device."""
    x = jnp.ones((n, k), jnp.float32)
    w = jnp.ones((k, m), jnp.float32)
    f = jax.jit(jnp.matmul)
    f(x, w).block_until_ready()
    start = time.perf_counter()
    for _ in range(repeats):
        out = f(x, w)
    out.block_until_ready()
    return 2 * n * k * m * repeats / (time.perf_counter() - start) / 1e9


def memory_read_gbps(gib: float = 1.0, repeats: int = 5) -> float:
    """GB/s of a jitted float32 sum over a ``gib`` GiB array: one read of memory."""
    x = jnp.ones(int(gib * 2**30) // 4, jnp.float32)
    f = jax.jit(jnp.sum)
    f(x).block_until_ready()
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        f(x).block_until_ready()
        seconds.append(time.perf_counter() - start)
    return x.nbytes / float(np.median(seconds)) / 1e9


def matmul_params(config: models.ModelConfig) -> int:
    """Parameters used in matrix products per token (layer kernels and the LM head)."""
    shapes = decoder.param_shapes(config)
    layers = sum(np.prod(s) for p, s in shapes.items() if p[0] == "layers" and p[-1] == "kernel")
    return int(layers + config.hidden_size * config.vocab_size)


def attention_flops(config: models.ModelConfig, keys_per_query: np.ndarray) -> float:
    """QKᵀ and PV FLOPs over all layers for queries attending to the given key counts."""
    c = config
    return 4.0 * c.num_layers * c.num_heads * c.head_dim * float(np.sum(keys_per_query))


def flops(config: models.ModelConfig, batch: int, prompt_len: int, new_tokens: int
          ) -> tuple[float, float]:
    """(prefill, decode) FLOPs of a batch (causal attention: only attended keys count)."""
    dense = 2.0 * matmul_params(config)
    prefill = batch * (dense * prompt_len + attention_flops(config, np.arange(1, prompt_len + 1)))
    decode_keys = np.arange(prompt_len + 1, prompt_len + new_tokens + 1)
    decode = batch * (dense * new_tokens + attention_flops(config, decode_keys))
    return prefill, decode


def decode_bytes(config: models.ModelConfig, batch: int, prompt_len: int, new_tokens: int,
                 itemsize: int) -> float:
    """Bytes a decode loop must read at least: every matmul weight once per step, and each
    step every real cached key and value of every row."""
    c = config
    keys = np.arange(prompt_len + 1, prompt_len + new_tokens + 1)
    weights = matmul_params(c) * itemsize * new_tokens
    cache = batch * 2 * c.num_layers * c.num_kv_heads * c.head_dim * itemsize * float(keys.sum())
    return weights + cache


def compiled_peak_bytes(compiled) -> int:
    """Arguments + outputs + temporaries − donated aliases of a compiled executable."""
    m = compiled.memory_analysis()
    return int(m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes
               - m.alias_size_in_bytes)


def random_prompts(config: models.ModelConfig, batch: int, length: int, seed: int = 0):
    return np.random.RandomState(seed).randint(3, config.vocab_size, (batch, length)).astype(
        np.int32)


def time_jax(config, params, deltas, tokens: np.ndarray, new_tokens: int) -> dict:
    """Times one greedy prefill + decode loop (after compiling both ahead of time)."""
    batch = tokens.shape[0]
    tokens, mask = jnp.asarray(tokens), jnp.ones(tokens.shape, jnp.int32)
    start = time.perf_counter()
    prefill = sampling._prefill.lower(config, params, deltas, tokens, mask,
                                      new_tokens=new_tokens).compile()
    state = prefill(params, deltas, tokens, mask)
    loop_args = (jax.random.split(jax.random.key(0), batch), jnp.asarray([-1], jnp.int32),
                 jnp.float32(1.0), jnp.float32(1.0), jnp.zeros(2, jnp.float32),
                 jnp.int32(new_tokens))
    decode = sampling._decode.lower(config, GREEDY, params, deltas, state, *loop_args).compile()
    compile_s = time.perf_counter() - start
    jax.block_until_ready(state)
    prefill_s = decode_s = float("inf")
    for _ in range(_REPEATS.value):
        start = time.perf_counter()
        state = jax.block_until_ready(prefill(params, deltas, tokens, mask))
        prefill_s = min(prefill_s, time.perf_counter() - start)
        start = time.perf_counter()
        state = jax.block_until_ready(decode(params, deltas, state, *loop_args))
        decode_s = min(decode_s, time.perf_counter() - start)
    assert int(state.step) == new_tokens
    return dict(compile_s=compile_s, prefill_s=prefill_s, decode_s=decode_s,
                prefill_tokens_per_s=tokens.size / prefill_s,
                decode_tokens_per_s=batch * new_tokens / decode_s,
                decode_peak_bytes=compiled_peak_bytes(decode),
                tokens=np.asarray(state.tokens))


def hf_config_dict(config: models.ModelConfig) -> dict:
    """A transformers config dict equivalent to a ModelConfig."""
    c = config
    rope = {"rope_type": c.rope.kind, "rope_theta": c.rope.theta}
    if c.rope.kind != "default":
        rope["factor"] = c.rope.factor
    if c.rope.kind == "llama3":
        rope.update(low_freq_factor=c.rope.low_freq_factor,
                    high_freq_factor=c.rope.high_freq_factor,
                    original_max_position_embeddings=c.rope.original_max_position_embeddings)
    return dict(model_type=c.model_type, vocab_size=c.vocab_size, hidden_size=c.hidden_size,
                intermediate_size=c.intermediate_size, num_hidden_layers=c.num_layers,
                num_attention_heads=c.num_heads, num_key_value_heads=c.num_kv_heads,
                head_dim=c.head_dim, rms_norm_eps=c.rms_norm_eps,
                tie_word_embeddings=c.tie_word_embeddings, rope_parameters=rope,
                attention_bias=c.o_bias or (c.qkv_bias and c.model_type != "qwen2"),
                mlp_bias=c.mlp_bias, max_position_embeddings=c.max_position_embeddings)


def torch_model(model: models.Model, dtype: str):
    """The same weights as a transformers model (inverse of the loader's name map)."""
    import torch  # pylint: disable=import-outside-toplevel
    import transformers  # pylint: disable=import-outside-toplevel

    config = transformers.AutoConfig.for_model(**hf_config_dict(model.config))
    module = transformers.AutoModelForCausalLM.from_config(config).eval()
    state = {}
    flat = {path: np.array(leaf, np.float32) for path, leaf in
            jax.tree_util.tree_flatten_with_path(model.params)[0]
            for path in [tuple(k.key for k in path)]}
    for path, array in flat.items():
        array = np.swapaxes(array, -1, -2) if path[-1] == "kernel" else array
        for slot, name in loading.hf_names(model.config, path).items():
            state[name] = torch.from_numpy(array if slot is None else array[slot])
    missing, unexpected = module.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    module.tie_weights()
    return module.to(getattr(torch, dtype))


def time_torch(module, tokens: np.ndarray, new_tokens: int) -> dict:
    """transformers greedy generate: prefill (one forward) and total generate time."""
    import torch  # pylint: disable=import-outside-toplevel

    ids = torch.from_numpy(tokens.astype(np.int64))
    mask = torch.ones_like(ids)
    kwargs = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                  pad_token_id=0)
    with torch.inference_mode():
        module.generate(ids[:, :8], attention_mask=mask[:, :8], **{**kwargs,
                                                                 "max_new_tokens": 2,
                                                                 "min_new_tokens": 2})
        start = time.perf_counter()
        module(input_ids=ids, attention_mask=mask, use_cache=True)
        prefill_s = time.perf_counter() - start
        start = time.perf_counter()
        out = module.generate(ids, attention_mask=mask, **kwargs)
        generate_s = time.perf_counter() - start
    decode_s = max(generate_s - prefill_s, 1e-9)
    return dict(prefill_s=prefill_s, generate_s=generate_s,
                prefill_tokens_per_s=ids.numel() / prefill_s,
                decode_tokens_per_s=ids.shape[0] * new_tokens / decode_s,
                tokens=out[:, ids.shape[1]:].numpy())


def with_fractions(result: dict, config, batch: int, prompt_len: int, new_tokens: int,
                   peak_gflops: float, read_gbps: float, itemsize: int) -> dict:
    """``result`` with achieved GFLOP/s, the fractions of the matmul rate, and decode's
    roofline time and the fraction of it achieved."""
    prefill_flops, decode_flops = flops(config, batch, prompt_len, new_tokens)
    for phase, total in (("prefill", prefill_flops), ("decode", decode_flops)):
        achieved = total / result[f"{phase}_s"] / 1e9
        result[f"{phase}_gflops"] = achieved
        result[f"{phase}_fraction_of_matmul_peak"] = achieved / peak_gflops
    read = decode_bytes(config, batch, prompt_len, new_tokens, itemsize)
    result["decode_bytes_read"] = read
    result["decode_roofline_s"] = max(decode_flops / peak_gflops, read / read_gbps) / 1e9
    result["decode_fraction_of_roofline"] = result["decode_roofline_s"] / result["decode_s"]
    return result


def population_benchmark(model: models.Model, prompt_len: int, new_tokens: int,
                         plain: dict) -> dict:
    """Low-rank population batch vs plain inference of the same rows vs sequential full-rank."""
    size, rows = _POPULATION.value, _ROWS_PER_MEMBER.value
    members = np.repeat(np.arange(size), rows).astype(np.int32)
    tokens = random_prompts(model.config, size * rows, prompt_len)

    def population(noise):
        strategy = es.agentic_esopt(population_size=size, sigma=1e-3, learning_rate=5e-4,
                                    noise=noise,
                                    rank=_RANK.value if noise == "lowrank" else 1)
        return strategy.ask(strategy.init(jax.random.key(0), model.params))

    lowrank = population("lowrank")
    start = time.perf_counter()
    deltas = jax.block_until_ready(
        sampling._population_deltas(model.params, lowrank, jnp.asarray(members)))
    deltas_first_s = time.perf_counter() - start
    start = time.perf_counter()
    deltas = jax.block_until_ready(
        sampling._population_deltas(model.params, lowrank, jnp.asarray(members)))
    deltas_s = time.perf_counter() - start
    batched = time_jax(model.config, model.params, deltas, tokens, new_tokens)
    batched_tokens_per_s = batched["decode_tokens_per_s"]
    total_tokens = size * rows * new_tokens
    batched_total_s = deltas_s + batched["prefill_s"] + batched["decode_s"]

    full = population("full")
    sequential_s, perturb_s = 0.0, 0.0
    count = min(_SEQUENTIAL_MEMBERS.value, size)
    for member in range(count + 1):  # Member 0 runs twice: once to compile.
        start = time.perf_counter()
        params = jax.block_until_ready(es.noise.perturb(model.params, full, member % size))
        perturbed_s = time.perf_counter() - start
        member_rows = tokens[members == member % size]
        timing = time_jax(model.config, params, decoder.no_deltas(params), member_rows,
                          new_tokens)
        if member > 0:
            perturb_s += perturbed_s
            sequential_s += perturbed_s + timing["prefill_s"] + timing["decode_s"]
    param_bytes = sum(leaf.nbytes for leaf in jax.tree.leaves(model.params))
    sequential_tokens_per_s = count * rows * new_tokens / sequential_s
    return dict(
        population_size=size, rows_per_member=rows, rank=_RANK.value,
        factors_first_call_s=deltas_first_s, factors_s=deltas_s,
        lowrank_prefill_tokens_per_s=batched["prefill_tokens_per_s"],
        lowrank_decode_tokens_per_s=batched_tokens_per_s,
        lowrank_end_to_end_tokens_per_s=total_tokens / batched_total_s,
        plain_decode_tokens_per_s=plain["decode_tokens_per_s"],
        lowrank_vs_plain_decode_speed=batched_tokens_per_s / plain["decode_tokens_per_s"],
        lowrank_decode_peak_bytes=batched["decode_peak_bytes"],
        plain_decode_peak_bytes=plain["decode_peak_bytes"],
        lowrank_vs_plain_peak_memory=batched["decode_peak_bytes"] / plain["decode_peak_bytes"],
        sequential_members_run=count,
        sequential_fullrank_tokens_per_s=sequential_tokens_per_s,
        sequential_perturb_s_per_member=perturb_s / count,
        sequential_fullrank_peak_bytes=param_bytes + timing["decode_peak_bytes"],
        lowrank_batched_vs_sequential_speedup=(total_tokens / batched_total_s
                                               / sequential_tokens_per_s))


def qwen3_5_benchmark(prompt_len: int, new_tokens: int, batch: int, dtype: str) -> dict:
    """Greedy prefill/decode tokens/s of a random small Qwen3.5, ours vs transformers."""
    import torch  # pylint: disable=import-outside-toplevel
    import transformers  # pylint: disable=import-outside-toplevel

    torch.manual_seed(0)
    module = transformers.Qwen3_5ForCausalLM(
        transformers.Qwen3_5TextConfig(**QWEN3_5_SHAPE)).eval()
    with tempfile.TemporaryDirectory() as path:
        module.save_pretrained(path)
        model = models.load(path, dtype)
    tokens = random_prompts(model.config, batch, prompt_len)
    ours = time_jax(model.config, model.params, decoder.no_deltas(model.params), tokens,
                    new_tokens)
    reference = time_torch(module.to(getattr(torch, dtype)), tokens, new_tokens)
    return dict(
        shape=QWEN3_5_SHAPE, batch=batch, compile_s=ours["compile_s"],
        prefill_tokens_per_s=ours["prefill_tokens_per_s"],
        decode_tokens_per_s=ours["decode_tokens_per_s"],
        torch_prefill_tokens_per_s=reference["prefill_tokens_per_s"],
        torch_decode_tokens_per_s=reference["decode_tokens_per_s"],
        prefill_speedup_vs_torch=(ours["prefill_tokens_per_s"]
                                  / reference["prefill_tokens_per_s"]),
        decode_speedup_vs_torch=ours["decode_tokens_per_s"] / reference["decode_tokens_per_s"],
        greedy_tokens_match_torch=float(np.mean(ours["tokens"][:, :new_tokens]
                                                == reference["tokens"])))


def main(argv):
    del argv
    layout = sharding.layout(sharding.MeshOptions(_MESH.value, _RULES.value))
    model = models.load(_MODEL.value, _DTYPE.value, layout and layout.shardings,
                        cache_layout=_CACHE_LAYOUT.value)
    config = model.config
    prompt_len, new_tokens = _PROMPT_LEN.value, _NEW_TOKENS.value
    if _TORCH.value:
        import torch  # pylint: disable=import-outside-toplevel

        torch.set_num_threads(os.cpu_count())
        reference = torch_model(model, _DTYPE.value)
    peak = matmul_gflops(1024, config.hidden_size, config.intermediate_size)
    read_gbps = memory_read_gbps()
    itemsize = jnp.dtype(loading.DTYPES[_DTYPE.value]).itemsize
    result = dict(model=_MODEL.value, dtype=_DTYPE.value, **sharding.describe(layout),
                  cache_layout="stacked" if layers.stacks_cache(config) else "per_layer",
                  prompt_len=prompt_len, new_tokens=new_tokens,
                  matmul_params=matmul_params(config), matmul_gflops=peak,
                  memory_read_gbps=read_gbps, batches={})
    plain = {}
    for batch in [int(b) for b in _BATCH_SIZES.value]:
        tokens = random_prompts(config, batch, prompt_len)
        timing = time_jax(config, model.params, decoder.no_deltas(model.params), tokens,
                          new_tokens)
        plain[batch] = timing
        entry = with_fractions({k: v for k, v in timing.items() if k != "tokens"}, config,
                               batch, prompt_len, new_tokens, peak, read_gbps, itemsize)
        if _TORCH.value:
            torch_timing = time_torch(reference, tokens, new_tokens)
            entry["torch"] = {k: v for k, v in torch_timing.items() if k != "tokens"}
            entry["decode_speedup_vs_torch"] = (timing["decode_tokens_per_s"]
                                                / torch_timing["decode_tokens_per_s"])
            entry["prefill_speedup_vs_torch"] = (timing["prefill_tokens_per_s"]
                                                 / torch_timing["prefill_tokens_per_s"])
            entry["greedy_tokens_match_torch"] = float(
                np.mean(timing["tokens"][:, :new_tokens] == torch_timing["tokens"]))
        result["batches"][str(batch)] = entry
        if not _JSON.value:
            print(batch, json.dumps(entry), flush=True)
    rows = _POPULATION.value * _ROWS_PER_MEMBER.value
    if rows not in plain:
        plain[rows] = time_jax(config, model.params, decoder.no_deltas(model.params),
                               random_prompts(config, rows, prompt_len), new_tokens)
    result["population"] = population_benchmark(model, prompt_len, new_tokens, plain[rows])
    if _QWEN3_5.value:
        result["qwen3_5"] = qwen3_5_benchmark(prompt_len, new_tokens, _QWEN3_5_BATCH.value,
                                              _DTYPE.value)
    print(json.dumps(result, indent=None if _JSON.value else 2))


if __name__ == "__main__":
    app.run(main)
