"""Peak memory of one ES generation and one GRPO step, side by side, on the same model.

    python -m experiments.bench_memory --json

For each model (SmolLM2-135M, and a ~1.1B-parameter random model of Qwen3's shape) and
the same batch (rows), prompt length and new tokens:

* ES generation: the population's rollout (low-rank member deltas, prefill, decode) and
  ``tell`` (the jitted update, which donates the state and goes leaf by leaf). The
  rollout's programs alone are population inference of the same rows
  (``inference_peak_bytes``), the floor ES's peak is measured against.
* GRPO step: the rollout (prefill, decode), the frozen reference's log-probabilities and
  one AdamW step (forward + backward with the layer scan rematerialised).

Each program is compiled (not run) and XLA's memory analysis gives its peak (arguments +
outputs + temporaries − aliased buffers); state the program does not take but that stays
resident meanwhile (GRPO's reference parameters during its AdamW step, the policy and
AdamW's moments during the reference pass) is added. A method's peak is its largest
program's. The compilation runs in one fresh subprocess per method, and each method runs once for
real in another, whose peak resident set size (``ru_maxrss``) is reported with the peak
it had before the first program ran (the model and the inputs); a run the kernel kills
for want of memory is reported as such.
Prints one JSON object per model with ``es_peak_bytes``, ``grpo_peak_bytes``, ``ratio`` and
``inference_peak_bytes``.
"""

import dataclasses
import functools
import json
import subprocess
import sys
import time

from absl import app, flags
import flax.traverse_util
import jax
import jax.numpy as jnp
import numpy as np

from agentic_esopt import es, models, targets
from agentic_esopt.models import decoder, sampling
from agentic_esopt.models.config import ModelConfig
from agentic_esopt.training import grpo

_MODELS = flags.DEFINE_list("models", ["smollm2-135m", "qwen3-1b"],
                            "Models: smollm2-135m (embedded GGUF), qwen3-1b (random) or tiny "
                            "(the tests' random model).")
_ROWS = flags.DEFINE_integer("rows", 8, "Batch rows: ES members × tasks = GRPO samples × "
                                        "tasks.")
_PROMPT_LEN = flags.DEFINE_integer("prompt_len", 128, "Prompt tokens per row.")
_NEW_TOKENS = flags.DEFINE_integer("new_tokens", 16, "Generated tokens per row.")
_MEASURE = flags.DEFINE_string("measure", None, "Internal: MODEL:METHOD:PART, one "
                                                "measurement in this process.")
_JSON = flags.DEFINE_bool("json", False, "Print only the JSON lines.")

# A ~1.1B-parameter Qwen3 (Qwen3's vocabulary, head size, GQA and q/k norms; d=1536).
QWEN3_1B = ModelConfig(model_type="qwen3", vocab_size=151936, hidden_size=1536,
                       intermediate_size=4608, num_layers=28, num_heads=16, num_kv_heads=8,
                       head_dim=128, rms_norm_eps=1e-6, tie_word_embeddings=True,
                       qk_norm=True, eos_token_ids=(151645,), pad_token_id=151643)
DTYPES = {"smollm2-135m": "float32", "qwen3-1b": "bfloat16", "tiny": "float32"}
INFERENCE_PROGRAMS = ("deltas", "prefill", "decode")  # ES's programs but tell.


@dataclasses.dataclass(frozen=True)
class Shapes:
    rows: int
    prompt_len: int
    new_tokens: int


def random_params(config: ModelConfig, dtype) -> dict:
    """N(0, 0.02²) parameters drawn leaf by leaf in ``dtype`` (no float32 copy of the whole
    model, which ``decoder.init_params`` makes, inflates the process's peak RSS)."""
    shapes = decoder.param_shapes(config)
    keys = jax.random.split(jax.random.key(0), len(shapes))
    return flax.traverse_util.unflatten_dict({
        path: 0.02 * jax.random.normal(key, shape, dtype)
        for key, (path, shape) in zip(keys, sorted(shapes.items()))})


def load(name: str) -> tuple[ModelConfig, dict]:
    """(config, params) of a benchmark model in its dtype."""
    if name == "qwen3-1b":
        return QWEN3_1B, random_params(QWEN3_1B, jnp.bfloat16)
    if name not in DTYPES:
        raise ValueError(f"unknown model {name!r}; choose from {sorted(DTYPES)}")
    model = models.load(name, dtype=DTYPES[name])
    return model.config, model.params


def tree_bytes(tree) -> int:
    return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree))


def compiled_peak(compiled) -> int:
    """Arguments + outputs + temporaries − aliased (donated) bytes of a compiled program."""
    m = compiled.memory_analysis()
    return (m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes
            - m.alias_size_in_bytes)


class Programs:
    """Every program of both methods on one model and one set of shapes, with inputs."""

    def __init__(self, config: ModelConfig, params: dict, shapes: Shapes):
        self.config, self.params, self.shapes = config, params, shapes
        rng = np.random.default_rng(0)
        rows, prompt_len = shapes.rows, shapes.prompt_len
        self.tokens = jnp.asarray(rng.integers(0, config.vocab_size, (rows, prompt_len)),
                                  jnp.int32)
        self.mask = jnp.ones((rows, prompt_len), jnp.int32)
        self.new_tokens = sampling.bucket(shapes.new_tokens, sampling.MIN_NEW_TOKENS_BUCKET)
        self.mode = sampling.SamplingMode(greedy=False, top_k=None, top_p=False)
        self.strategy = es.agentic_esopt(rows, 1e-3, 1e-3, noise="lowrank", rank=1,
                                         antithetic=True)
        self.members = jnp.arange(rows, dtype=jnp.int32)
        self.optimizer = grpo.make_optimizer(1e-6, 0.0, 1.0)
        self.hyper = grpo.Hyper(temperature=1.0, clip_epsilon=0.2, kl_beta=1e-3, remat=True)

    @functools.cached_property
    def es_state(self) -> es.ESState:
        return self.strategy.init(0, self.params)

    @functools.cached_property
    def population(self) -> es.Population:
        return self.strategy.ask(self.es_state)

    def rollout(self, deltas):
        """(prefill, decode) as (function, args) pairs."""
        state = jax.eval_shape(lambda: sampling._prefill(  # pylint: disable=protected-access
            self.config, self.params, deltas, self.tokens, self.mask, self.new_tokens))
        scalars = (jnp.float32(1.0), jnp.float32(1.0), jnp.zeros(2, jnp.float32),
                   jnp.int32(self.shapes.new_tokens))
        keys = jax.random.split(jax.random.key(0), self.shapes.rows)
        eos = jnp.asarray(self.config.eos_token_ids, jnp.int32)
        return [
            (lambda: sampling._prefill.lower(  # pylint: disable=protected-access
                self.config, self.params, deltas, self.tokens, self.mask, self.new_tokens)),
            (lambda: sampling._decode.lower(  # pylint: disable=protected-access
                self.config, self.mode, self.params, deltas, state, keys, eos, *scalars)),
        ]

    def es_deltas(self):
        return sampling._population_deltas(  # pylint: disable=protected-access
            self.params, self.population, self.members)

    def grpo_batch(self) -> grpo.Batch:
        rows, window = self.shapes.rows, self.new_tokens
        tokens = jnp.concatenate([self.tokens, self.tokens[:, :self.new_tokens]], axis=1)
        return grpo.Batch(tokens, jnp.ones_like(tokens), jnp.ones((rows, window), jnp.float32),
                          jnp.zeros((rows, window), jnp.float32),
                          jnp.ones((rows,), jnp.float32))

    def es_peaks(self) -> dict[str, int]:
        deltas = jax.eval_shape(self.es_deltas)
        rewards = jnp.zeros((self.shapes.rows,), jnp.float32)
        prefill, decode = self.rollout(deltas)
        lowered = dict(
            deltas=sampling._population_deltas.lower(  # pylint: disable=protected-access
                self.params, self.population, self.members),
            prefill=prefill(), decode=decode(),
            tell=self.strategy.update.lower(self.es_state, self.population, rewards))
        return {name: compiled_peak(program.compile()) for name, program in lowered.items()}

    def grpo_peaks(self) -> dict[str, int]:
        opt_state = jax.eval_shape(self.optimizer.init, self.params)
        batch = self.grpo_batch()
        reference = jax.ShapeDtypeStruct((self.shapes.rows, self.new_tokens), jnp.float32)
        prefill, decode = self.rollout(decoder.no_deltas(self.params))
        params, moments = tree_bytes(self.params), tree_bytes(opt_state)
        # Resident besides each program's own arguments: the reference copy of the params
        # (rollout, AdamW step) and the policy + AdamW moments (reference pass).
        resident = dict(prefill=params + moments, decode=params + moments,
                        reference=params + moments, train_step=params)
        lowered = dict(
            prefill=prefill(), decode=decode(),
            reference=grpo.reference_logprobs.lower(self.config, 1.0, self.params, batch),
            train_step=grpo.train_step.lower(self.config, self.hyper, self.optimizer,
                                             self.params, opt_state, batch, reference))
        return {name: compiled_peak(program.compile()) + resident[name]
                for name, program in lowered.items()}

    def run_es(self) -> None:
        deltas = self.es_deltas()
        state = sampling._prefill(  # pylint: disable=protected-access
            self.config, self.params, deltas, self.tokens, self.mask, self.new_tokens)
        self._decode(deltas, state)
        rewards = jnp.asarray(np.linspace(-1, 1, self.shapes.rows), jnp.float32)
        jax.block_until_ready(self.strategy.update(self.es_state, self.population, rewards))

    def run_grpo(self) -> None:
        deltas = decoder.no_deltas(self.params)
        state = sampling._prefill(  # pylint: disable=protected-access
            self.config, self.params, deltas, self.tokens, self.mask, self.new_tokens)
        self._decode(deltas, state)
        policy = jax.tree.map(jnp.copy, self.params)
        opt_state = self.optimizer.init(policy)
        batch = self.grpo_batch()
        reference = grpo.reference_logprobs(self.config, 1.0, self.params, batch)
        jax.block_until_ready(grpo.train_step(self.config, self.hyper, self.optimizer, policy,
                                              opt_state, batch, reference))

    def _decode(self, deltas, state) -> None:
        keys = jax.random.split(jax.random.key(0), self.shapes.rows)
        jax.block_until_ready(sampling._decode(  # pylint: disable=protected-access
            self.config, self.mode, self.params, deltas, state, keys,
            jnp.asarray(self.config.eos_token_ids, jnp.int32), jnp.float32(1.0),
            jnp.float32(1.0), jnp.zeros(2, jnp.float32), jnp.int32(self.shapes.new_tokens)))


def measure(model: str, method: str, part: str, shapes: Shapes) -> dict:
    """One part of one method on one model, in this process: ``compiled`` (the programs'
    peaks) or ``run`` (a real run's peak RSS, and the peak before it: model and inputs)."""
    config, params = load(model)
    programs = Programs(config, params, shapes)
    if part == "compiled":
        peaks = programs.es_peaks() if method == "es" else programs.grpo_peaks()
        return dict(programs=peaks, peak_bytes=max(peaks.values()),
                    num_params=sum(x.size for x in jax.tree.leaves(params)),
                    param_bytes=tree_bytes(params))
    rss_before = targets.peak_rss_bytes()
    began = time.perf_counter()
    (programs.run_es if method == "es" else programs.run_grpo)()
    return dict(rss_before_bytes=rss_before, peak_rss_bytes=targets.peak_rss_bytes(),
                run_s=time.perf_counter() - began)


def measure_in_subprocess(model: str, method: str, part: str, shapes: Shapes) -> dict:
    """``measure`` in a fresh process; a run the kernel kills (out of memory) is reported
    as ``{"killed_by_signal": n}``."""
    command = [sys.executable, "-m", "experiments.bench_memory",
               f"--measure={model}:{method}:{part}", f"--rows={shapes.rows}",
               f"--prompt_len={shapes.prompt_len}", f"--new_tokens={shapes.new_tokens}"]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode < 0 and part == "run":
        return dict(killed_by_signal=-done.returncode)
    if done.returncode:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def model_report(model: str, shapes: Shapes) -> dict:
    """Both methods' compiled peaks, their ratio and each real run's RSS."""
    results = {method: {**measure_in_subprocess(model, method, "compiled", shapes),
                        "run": measure_in_subprocess(model, method, "run", shapes)}
               for method in ("es", "grpo")}
    es_result, grpo_result = results["es"], results["grpo"]
    rss = [r["run"].get("peak_rss_bytes") for r in (es_result, grpo_result)]
    return dict(
        model=model, dtype=DTYPES[model], num_params=es_result["num_params"],
        param_bytes=es_result["param_bytes"], **dataclasses.asdict(shapes),
        backend=jax.default_backend(),
        es_peak_bytes=es_result["peak_bytes"], grpo_peak_bytes=grpo_result["peak_bytes"],
        ratio=grpo_result["peak_bytes"] / es_result["peak_bytes"],
        inference_peak_bytes=max(peak for name, peak in es_result["programs"].items()
                                 if name in INFERENCE_PROGRAMS),
        rss_ratio=rss[1] / rss[0] if all(rss) else None,
        es_programs=es_result["programs"], grpo_programs=grpo_result["programs"],
        es_run=es_result["run"], grpo_run=grpo_result["run"])


def main(argv):
    del argv
    shapes = Shapes(_ROWS.value, _PROMPT_LEN.value, _NEW_TOKENS.value)
    if _MEASURE.value:
        model, method, part = _MEASURE.value.split(":")
        print(json.dumps(measure(model, method, part, shapes)))
        return
    for model in _MODELS.value:
        if model not in DTYPES:
            raise app.UsageError(f"--models: unknown model {model!r}; choose from "
                                 f"{sorted(DTYPES)}")
    for model in _MODELS.value:
        report = model_report(model, shapes)
        if not _JSON.value:
            print(f"{model}: ES {report['es_peak_bytes'] / 2**30:.2f} GiB, GRPO "
                  f"{report['grpo_peak_bytes'] / 2**30:.2f} GiB (x{report['ratio']:.2f})")
        print(json.dumps(report))


if __name__ == "__main__":
    app.run(main)
