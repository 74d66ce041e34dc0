"""Ahead-of-time plans: a run's own programs compiled for a target's devices, on abstract
parameters and caches, with their memory per device and their cost.

The programs are the trainer's: the update rule's ``init`` (ES copies the loaded
parameters), one generation's rollout as ``models.generate`` runs it (ES: the population's
low-rank factors, or each full-rank member's perturbed parameters, then the prompt's
prefill into a fresh KV cache and the decode loop, for the rows one call plays), ES's
``tell``, held-out evaluation's prefill and decode, and GRPO's reference log-probabilities
and AdamW step. Every argument is a ``jax.ShapeDtypeStruct`` laid out by the run's mesh and
sharding rules; each program's outputs, as compiled, are the next one's arguments.
Nothing is allocated: ``jax.jit(...).lower(...).compile()`` gives XLA's
``memory_analysis()`` and ``cost_analysis()`` for the target's chip.

Per device, a program needs its arguments + outputs + temporaries − donated (aliased)
bytes, plus what stays resident meanwhile without being an argument (ES full-rank: θ while
a member's copy runs, and the other members' kept caches, unless
``rollout.keep_kv_cache`` is off; GRPO: the reference parameters
and AdamW's moments). The plan's figure is the largest program's. Seconds per generation
are each program's roofline time, max(FLOPs / peak FLOP/s, bytes / bandwidth), times the
calls a generation makes (every episode taking ``turns`` turns of ``max_new_tokens``; an
upper bound). A multi-host slice plans one process: its devices, its share of members.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
import types
from collections.abc import Callable
from typing import Any, NamedTuple

import flax.traverse_util
import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from agentic_esopt import es, sharding, targets
from agentic_esopt.agents import rollout
from agentic_esopt.models import architectures, decoder, kv_cache, loading, sampling
from agentic_esopt.models.config import ModelConfig
from agentic_esopt.training import grpo, rules
from agentic_esopt.training.config import TrainConfig

PyTree = Any
DEFAULT_PROMPT_TOKENS = 1024


@dataclasses.dataclass(frozen=True)
class Shapes:
    """What a generation feeds, beyond the config.

    Attributes:
      prompt_tokens: tokens of the longest prompt a turn feeds (the KV cache's context).
      turns: turns per episode (every episode is assumed to take them all).
    """

    prompt_tokens: int
    turns: int

    @classmethod
    def of(cls, config: TrainConfig, prompt_tokens: int | None = None) -> Shapes:
        """``prompt_tokens`` (default: ``rollout.max_context`` less the reply, else
        ``DEFAULT_PROMPT_TOKENS``) and the config's turns (``rollout.max_turns``, else 1)."""
        if prompt_tokens is None:
            context = config.rollout.max_context
            prompt_tokens = (context - config.rollout.max_new_tokens if context
                             else DEFAULT_PROMPT_TOKENS)
        return cls(prompt_tokens, config.rollout.max_turns or 1)


class Program(NamedTuple):
    """One compiled program of the plan.

    Attributes:
      name: e.g. ``es/decode``.
      compiled: the compiled program.
      calls: times a generation (``eval/*``: an evaluation; ``*/init``: a run) runs it;
        a decode loop's steps count as calls of one step.
      resident_bytes: bytes per device that stay resident while it runs, not its arguments.
      ideal_bytes: bytes per device it must hold (generation: weights and cache), or None;
        ``held_over_ideal`` compares the compiled program's with it (copies of weights,
        activations).
      model_flops: 2·N·tokens over all devices (the model's forward FLOPs), or None.
    """

    name: str
    compiled: Any
    calls: float
    resident_bytes: int
    ideal_bytes: int | None = None
    model_flops: float | None = None


def per_device_bytes(tree: PyTree) -> int:
    """Bytes one device holds of a tree of (sharded) arrays or shape structs: the
    largest shard of each leaf."""
    return sum(math.prod(leaf.sharding.shard_shape(leaf.shape)) * leaf.dtype.itemsize
               if getattr(leaf, "sharding", None) is not None
               else math.prod(leaf.shape) * leaf.dtype.itemsize
               for leaf in jax.tree.leaves(tree))


def abstract_params(config: ModelConfig, dtype: Any, mesh: Mesh,
                    rules_: sharding.Rules) -> PyTree:
    """The parameter tree as ``jax.ShapeDtypeStruct``s placed by ``rules_`` on ``mesh``.

    Raises:
      ValueError: listing every leaf the rules do not fit.
    """
    tree = flax.traverse_util.unflatten_dict({
        path: jax.ShapeDtypeStruct(shape, dtype)
        for path, shape in decoder.param_shapes(config).items()})
    specs = sharding.tree_specs(rules_, tree, dict(mesh.shape))
    return jax.tree.map(lambda leaf, spec: jax.ShapeDtypeStruct(
        leaf.shape, leaf.dtype, sharding=NamedSharding(mesh, spec)), tree, specs)


def random_params(config: ModelConfig, dtype: str, layout: sharding.Layout | None
                  ) -> PyTree:
    """Random parameters of ``config`` drawn leaf by leaf straight into their shards
    (N(0, 0.02²) matrices, the architecture's constants elsewhere): no leaf is ever whole
    on one device unless the layout says so, and nothing is drawn twice."""
    dtype = loading.resolve_dtype(dtype)
    constant = architectures.get(config).init_constant
    shapes = decoder.param_shapes(config)
    abstract = flax.traverse_util.unflatten_dict(
        {path: jax.ShapeDtypeStruct(shape, dtype) for path, shape in shapes.items()})
    placements = (layout.shardings(abstract) if layout is not None
                  else jax.tree.map(lambda _: None, abstract))
    flat = flax.traverse_util.flatten_dict(placements)
    keys = jax.random.split(jax.random.key(0), len(shapes))
    leaves = {}
    for key, (path, shape) in zip(keys, sorted(shapes.items())):
        value = constant(path)
        draw = (functools.partial(jnp.full, shape, value, dtype) if value is not None else
                functools.partial(lambda k, s: decoder.INIT_STDDEV * jax.random.normal(
                    k, s, dtype), key, shape))
        leaves[path] = jax.jit(draw, out_shardings=flat[path])()
    return flax.traverse_util.unflatten_dict(leaves)


def _compile(on: Mesh, function: Callable, /, *args, **kwargs) -> tuple[Any, PyTree]:
    """``function`` (jitted) compiled for abstract ``args``, and its abstract outputs with
    the shardings the compiler chose (unplaced ones replicated on mesh ``on``); a compiler
    error names the function it refused."""
    lowered = function.lower(*args, **kwargs)
    try:
        compiled = lowered.compile()
    except jax.errors.JaxRuntimeError as error:
        raise type(error)(f"{function.__name__}: {error}") from None

    def on_mesh(info, placed):  # A single-device output (a scalar) is replicated.
        placed = placed if isinstance(placed, NamedSharding) else NamedSharding(on, P())
        return jax.ShapeDtypeStruct(info.shape, info.dtype, sharding=placed)

    return compiled, jax.tree.map(on_mesh, lowered.out_info, compiled.output_shardings)


def _rows(mesh: Mesh, shape: tuple[int, ...], dtype: Any) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, dtype, sharding=kv_cache.rows_sharding(mesh, len(shape)))


def _settings(config: ModelConfig, options: rollout.Options, temperature: float
              ) -> Any:
    """``generate``'s resolved sampling settings (no tokenizer: the model's own ids)."""
    tokenizer = types.SimpleNamespace(eos_token_id=None, pad_token_id=None, decode=str)
    return sampling._Settings.build(  # pylint: disable=protected-access
        config, tokenizer, rollout.sampling(options, temperature), jax.random.key(0))


def generation_programs(prefix: str, config: ModelConfig, params: PyTree, deltas: PyTree,
                        rows: int, shapes: Shapes, options: rollout.Options,
                        temperature: float, mesh: Mesh, calls: float, resident: int = 0,
                        extra_resident_caches: int = 0) -> list[Program]:
    """``models.generate``'s programs for one call of ``rows`` prompts of
    ``shapes.prompt_tokens`` tokens into a fresh cache: the prefill (``_extend``, in the
    pieces ``generate`` feeds) and the decode loop (one step per call).

    Args:
      extra_resident_caches: caches of other calls kept meanwhile (full-rank members').
    """
    settings = _settings(config, options, temperature)
    new_slots = kv_cache.bucket(options.max_new_tokens, sampling.MIN_NEW_TOKENS_BUCKET)
    width = kv_cache.bucket(shapes.prompt_tokens, sampling.MIN_PROMPT_BUCKET)
    batch = -(-kv_cache.bucket(rows) // mesh.shape[sharding.DATA]) * mesh.shape[sharding.DATA]
    length = kv_cache.bucket(width + new_slots)
    if options.max_context is not None:
        length = max(width + new_slots, min(length, options.max_context))
    piece = sampling.piece_width(batch, width, length, config.num_heads)
    dtype = params["embed"]["embedding"].dtype
    _, cache = _compile(mesh, kv_cache._empty, config, batch,  # pylint: disable=protected-access
                        length, dtype, mesh)
    cache_bytes = per_device_bytes(cache)
    resident += extra_resident_caches * cache_bytes
    flops_per_token = 2.0 * rules.base.parameter_count(params)
    prefill, state = _compile(
        mesh, sampling._extend, config, params, deltas,  # pylint: disable=protected-access
        cache,
        _rows(mesh, (batch, piece), jnp.int32), _rows(mesh, (batch, piece), bool),
        _rows(mesh, (batch, piece), jnp.int32), _rows(mesh, (batch, length), bool),
        jax.ShapeDtypeStruct((), jnp.int32), new_tokens=new_slots, mesh=mesh)
    key_type = jax.eval_shape(lambda: jax.random.key(0)).dtype
    scalar = jax.ShapeDtypeStruct((), jnp.float32)
    decode, _ = _compile(
        mesh, sampling._decode, config,  # pylint: disable=protected-access
        settings.mode, params, deltas,
        state, _rows(mesh, (batch,), key_type),
        jax.ShapeDtypeStruct((max(1, len(settings.eos_ids)),), jnp.int32), scalar, scalar,
        jax.ShapeDtypeStruct((2,), jnp.float32), jax.ShapeDtypeStruct((), jnp.int32),
        mesh=mesh)
    return [
        Program(f"{prefix}/prefill", prefill, calls * width / piece, resident,
                ideal_bytes=per_device_bytes(params) + cache_bytes,
                model_flops=flops_per_token * batch * piece),
        Program(f"{prefix}/decode", decode, calls * options.max_new_tokens, resident,
                ideal_bytes=per_device_bytes(params) + cache_bytes,
                model_flops=flops_per_token * batch)]


def es_programs(config: TrainConfig, model_config: ModelConfig, params: PyTree, mesh: Mesh,
                shapes: Shapes, processes: int) -> list[Program]:
    """An ES run's programs: init, one generation (rollout and tell), one evaluation."""
    rule = rules.make(config)
    init, state = _compile(mesh, jax.jit(rule.init), params)
    _, population = _compile(mesh, rule.strategy.ask, state)
    members = -(-config.es.population_size // processes)  # this process's share
    tasks, batches = task_batches(config.rollout.tasks_per_generation,
                                  config.rollout.batch_size)
    calls = shapes.turns * batches  # per member: a turn of each batch of tasks
    programs = [Program("es/init", init, 0, 0)]
    theta = state.params
    if config.es.noise == "lowrank":
        rows = members * tasks
        batch = -(-kv_cache.bucket(rows) // mesh.shape[sharding.DATA]) * mesh.shape[
            sharding.DATA]
        deltas_program, deltas = _compile(
            mesh, sampling._population_deltas,  # pylint: disable=protected-access
            theta, population, _rows(mesh, (batch,), jnp.int32), mesh=mesh)
        programs.append(Program("es/deltas", deltas_program, calls, 0))
        programs += generation_programs("es", model_config, theta, deltas, rows, shapes,
                                        config.rollout, config.rollout.temperature, mesh,
                                        calls)
    else:
        perturb, member = _compile(mesh, es.noise.perturb, theta, population,
                                   jax.ShapeDtypeStruct((), jnp.int32))
        theta_bytes = per_device_bytes(theta)
        programs.append(Program("es/perturb", perturb, calls * members, 0))
        programs += generation_programs(
            "es", model_config, member, decoder.no_deltas(member), tasks, shapes,
            config.rollout, config.rollout.temperature, mesh, calls * members,
            resident=theta_bytes,
            extra_resident_caches=members - 1 if config.rollout.keep_kv_cache else 0)
    rewards = jax.ShapeDtypeStruct((config.es.population_size,), jnp.float32,
                                   sharding=NamedSharding(mesh, P()))
    tell, _ = _compile(mesh, rule.strategy.update, state, population, rewards)
    programs.append(Program("es/tell", tell, 1, 0))
    return programs + eval_programs(config, model_config, theta, mesh, shapes)


def task_batches(tasks: int, batch_size: int) -> tuple[int, int]:
    """(tasks per batch, batches): ``tasks`` played in batches of ``batch_size`` (0: one)."""
    batch = min(batch_size or tasks, tasks)
    return batch, -(-tasks // batch)


def eval_programs(config: TrainConfig, model_config: ModelConfig, params: PyTree, mesh: Mesh,
                  shapes: Shapes, resident: int = 0) -> list[Program]:
    """Held-out evaluation's programs: the unperturbed parameters play ``eval.size`` tasks
    × ``eval.repeats`` in batches of ``eval.batch_size`` tasks (0: one batch)."""
    batch, batches = task_batches(config.eval.size, config.eval.batch_size)
    return generation_programs("eval", model_config, params, decoder.no_deltas(params),
                               batch * config.eval.repeats, shapes, config.rollout,
                               config.eval.temperature, mesh, shapes.turns * batches,
                               resident)


def optimizer_shardings(optimizer: optax.GradientTransformation, params: PyTree) -> PyTree:
    """The layout ``optimizer.init`` gives its state on sharded parameters outside jit:
    each parameter-shaped leaf (AdamW's moments) as its parameter, the rest replicated.
    (Left to the compiler, the moments' zeros, which depend on no input, come out on one
    device.)"""
    replicated = NamedSharding(jax.tree.leaves(params)[0].sharding.mesh, P())
    return optax.tree_map_params(optimizer, lambda _, param: param.sharding,
                                 jax.eval_shape(optimizer.init, params), params,
                                 transform_non_params=lambda _: replicated)


def grpo_programs(config: TrainConfig, model_config: ModelConfig, params: PyTree, mesh: Mesh,
                  shapes: Shapes) -> list[Program]:
    """A GRPO run's programs: the rollout of G samples per task, the reference's
    log-probabilities and the AdamW step, per mini-batch of turns; one evaluation."""
    rule = rules.make(config)
    options = config.rule
    init, opt_state = _compile(mesh, jax.jit(rule.optimizer.init, out_shardings=(
        optimizer_shardings(rule.optimizer, params))), params)
    params_bytes, moments = per_device_bytes(params), per_device_bytes(opt_state)
    rows = options.group_size * config.rollout.tasks_per_generation
    tasks, batches = task_batches(config.rollout.tasks_per_generation,
                                  config.rollout.batch_size)
    programs = [Program("grpo/init", init, 0, params_bytes)]
    programs += generation_programs("grpo", model_config, params, decoder.no_deltas(params),
                                    options.group_size * tasks, shapes, config.rollout,
                                    config.rollout.temperature, mesh, shapes.turns * batches,
                                    resident=params_bytes + moments)
    window = kv_cache.bucket(config.rollout.max_new_tokens, grpo.MIN_SEQUENCE_BUCKET)
    length = kv_cache.bucket(shapes.prompt_tokens + config.rollout.max_new_tokens,
                             grpo.MIN_SEQUENCE_BUCKET)
    minibatch = options.minibatch_size

    def replicated(shape, dtype):
        return jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, P()))

    batch = grpo.Batch(replicated((minibatch, length), jnp.int32),
                       replicated((minibatch, length), jnp.int32),
                       replicated((minibatch, window), jnp.float32),
                       replicated((minibatch, window), jnp.float32),
                       replicated((minibatch,), jnp.float32))
    steps = math.ceil(rows * shapes.turns / minibatch) * options.epochs
    tokens_flops = 2.0 * rules.base.parameter_count(params) * minibatch * length
    reference, logprobs = _compile(mesh, grpo.reference_logprobs, model_config,
                                   config.rollout.temperature or 1.0, params, batch)
    hyper = grpo.Hyper(config.rollout.temperature or 1.0, options.clip_epsilon,
                       options.kl_beta, options.remat)
    step, _ = _compile(mesh, grpo.train_step, model_config, hyper, rule.optimizer, params,
                       opt_state, batch, logprobs)
    programs += [Program("grpo/reference", reference, steps, params_bytes + moments,
                         model_flops=tokens_flops),
                 Program("grpo/train_step", step, steps, params_bytes,
                         model_flops=3 * tokens_flops)]
    return programs + eval_programs(config, model_config, params, mesh, shapes,
                                    resident=params_bytes + moments)


def program_figures(program: Program, target: targets.Target, devices: int) -> dict[str, Any]:
    """A program's memory per device, cost per call and per generation, and its distance
    from the ideal.

    XLA's cost analysis counts a loop's body once (the layer scan, the decode loop, tell's
    loops over members), so where the model's FLOPs are known (prefill, decode, GRPO)
    ``flops`` is 2·N per token (×3 for a backward pass) per device, and ``bytes_accessed``
    at least the arguments a call must read; XLA's own counts are kept (``xla_*``).
    """
    memory = program.compiled.memory_analysis()
    cost = program.compiled.cost_analysis() or {}
    cost = cost[0] if isinstance(cost, list) else cost
    held = (memory.argument_size_in_bytes + memory.output_size_in_bytes
            + memory.temp_size_in_bytes - memory.alias_size_in_bytes)
    xla_flops, xla_bytes = float(cost.get("flops", 0.0)), float(cost.get("bytes accessed", 0.0))
    flops = program.model_flops / devices if program.model_flops else xla_flops
    accessed = max(xla_bytes, float(memory.argument_size_in_bytes))
    seconds = None
    if target.peak_flops and target.bandwidth:
        seconds = max(flops / target.peak_flops, accessed / target.bandwidth)
    return dict(
        name=program.name, argument_bytes=memory.argument_size_in_bytes,
        output_bytes=memory.output_size_in_bytes, temp_bytes=memory.temp_size_in_bytes,
        alias_bytes=memory.alias_size_in_bytes, resident_bytes=program.resident_bytes,
        per_device_bytes=held + program.resident_bytes, flops=flops,
        bytes_accessed=accessed, xla_flops=xla_flops, xla_bytes_accessed=xla_bytes,
        calls=program.calls, seconds_per_call=seconds,
        seconds=None if seconds is None else seconds * program.calls,
        held_over_ideal=held / program.ideal_bytes if program.ideal_bytes else None,
        xla_flops_over_model=(xla_flops * devices / program.model_flops
                              if program.model_flops else None))


def suggestions(config: TrainConfig, mesh: Mesh) -> list[str]:
    """What would make a plan that does not fit fit."""
    found = []
    model_axis, devices = mesh.shape[sharding.MODEL], mesh.devices.size
    if model_axis < devices:
        found.append(f"more model parallelism (--config.mesh.shape=data:"
                     f"{devices // (2 * model_axis) or 1},model:{min(devices, 2 * model_axis)}"
                     f" or beyond, with --config.mesh.rules=fsdp or tp)")
    if config.model.dtype == "float32":
        found.append("bfloat16 parameters (--config.model.dtype=bfloat16)")
    if config.rule_name == "es" and config.es.noise == "full":
        found.append("low-rank noise (--config.es.noise=lowrank): no perturbed copy of θ "
                     "and no cache per member")
        if config.rollout.keep_kv_cache:
            found.append("no kept caches (--config.rollout.keep_kv_cache=False): each "
                         "member re-prefills its turn, as Qwen3.5's recurrent caches do anyway")
    found.append("fewer rows per device (tasks in batches: rollout.batch_size, "
                 "eval.batch_size; or more devices on data) or shorter prompts")
    return found


def _needed_bytes(message: str) -> int:
    """The bytes a compiler's out-of-memory message says a program needs (XLA:TPU refuses
    to compile what does not fit: "... required for HLO temporaries (27.29G) ..."); 0 if
    it names none."""
    found = re.search(r"\(([\d.]+)([KMG])\) exceeds", message)
    if not found:
        return 0
    return int(float(found.group(1)) * 2 ** {"K": 10, "M": 20, "G": 30}[found.group(2)])


def resolve_layout(config: ModelConfig, target: targets.Target) -> ModelConfig:
    """``cache_layout=auto`` as the target's backend resolves it (stacked off CPU)."""
    if config.cache_layout != "auto":
        return config
    stacked = target.devices[0].platform != "cpu"
    return dataclasses.replace(config, cache_layout="stacked" if stacked else "per_layer")


def plan(config: TrainConfig, model_config: ModelConfig, target: targets.Target,
         shapes: Shapes) -> dict[str, Any]:
    """The plan of ``config``'s programs on ``target`` (see the module docstring), on the
    global mesh ``config.mesh.shape`` (empty: every device on ``data``).

    Raises:
      ValueError: one line for a mesh that does not match the target, rules that do not
        fit the parameters, or a rule that cannot run there.
    """
    mesh_shape = (sharding.parse_shape(config.mesh.shape) if config.mesh.shape
                  else {sharding.DATA: len(target.devices), sharding.MODEL: 1})
    mesh = targets.local_mesh(target.devices, mesh_shape, target.name)
    if config.rule_name == "grpo" and target.processes > 1:
        raise ValueError(f"rule.name=grpo runs on one process; target {target.name} has "
                         f"{target.processes} hosts")
    model_config = resolve_layout(model_config, target)
    params = abstract_params(model_config, loading.resolve_dtype(config.model.dtype), mesh,
                             sharding.parse_rules(config.mesh.rules))
    build = {"es": es_programs, "grpo": grpo_programs}.get(config.rule_name)
    if build is None:
        raise ValueError(f"rule.name={config.rule_name} has no plan; plannable rules: es, grpo")
    arguments = (config, model_config, params, mesh, shapes)
    try:
        programs = build(*arguments, target.processes) if build is es_programs else build(
            *arguments)
    except jax.errors.JaxRuntimeError as error:
        if "RESOURCE_EXHAUSTED" not in str(error):
            raise ValueError(f"the run does not compile for {target.name}: "
                             f"{str(error).splitlines()[0]}") from None
        programs, compile_error = [], str(error).splitlines()[0]
    else:
        compile_error = None
    figures = [program_figures(p, target, mesh.devices.size) for p in programs]
    needed = _needed_bytes(compile_error) if compile_error else 0
    peak = max([f["per_device_bytes"] for f in figures] + [needed])
    excess = peak - target.device_memory_bytes
    train = [f for f in figures if not f["name"].startswith("eval/") and f["calls"]]
    seconds = [f["seconds"] for f in train]
    return dict(
        target=target.name, device_kind=target.device_kind, devices=len(target.devices),
        processes=target.processes, mesh=mesh_shape, process_mesh=dict(mesh.shape),
        rules=config.mesh.rules, rule=config.rule_name, dtype=config.model.dtype,
        cache_layout=model_config.cache_layout,
        num_params=rules.base.parameter_count(params),
        param_bytes_per_device=per_device_bytes(params),
        prompt_tokens=shapes.prompt_tokens, turns=shapes.turns,
        max_new_tokens=config.rollout.max_new_tokens,
        device_memory_bytes=target.device_memory_bytes, peak_flops=target.peak_flops,
        bandwidth=target.bandwidth, chip_source=target.source,
        per_device_bytes=peak, fits=excess <= 0 and compile_error is None,
        excess_bytes=max(0, excess), compile_error=compile_error,
        suggestions=suggestions(config, mesh) if excess > 0 or compile_error else [],
        flops_per_generation=sum(f["flops"] * f["calls"] for f in train),
        bytes_per_generation=sum(f["bytes_accessed"] * f["calls"] for f in train),
        seconds_per_generation=None if None in seconds else sum(seconds),
        programs=figures)


def compare_peak(result: dict, measured: dict) -> dict:
    """A plan's memory prediction (``plan``'s result) beside what a run of its programs
    measured (``experiments.plan --execute``): a device's peak against the plan's largest
    per-device total where devices keep memory statistics; else (CPU devices share the
    host's memory) the process's peak RSS against that total on every device plus the RSS
    before the weights."""
    if measured["device_peak_bytes"] is not None:
        predicted, peak = result["per_device_bytes"], measured["device_peak_bytes"]
        predicted_as = "the plan's largest per-device total"
        measured_by = "the largest device.memory_stats()['peak_bytes_in_use']"
    else:
        predicted = result["per_device_bytes"] * result["devices"] + measured["rss_before_bytes"]
        peak = measured["peak_rss_bytes"]
        predicted_as = ("the plan's largest per-device total x devices + the process's RSS "
                        "before the weights")
        measured_by = "the process's peak RSS (getrusage)"
    return dict(predicted_peak_bytes=predicted, predicted_as=predicted_as,
                measured_peak_bytes=peak, measured_by=measured_by,
                measured_over_predicted=peak / predicted)
