"""Devices and hosts: the (data, model) mesh, parameter sharding rules, multi-host runs.

Mesh axes: ``data`` carries batch rows (population members × episodes; across processes,
each process plays its own members) and ``model`` splits parameter dimensions (FSDP or
tensor parallel, as the rules say). The mesh is built with
``mesh_utils.create_hybrid_device_mesh`` so that every process owns a contiguous block of
``data`` rows with whole ``model`` groups: parameters are replicated across processes and
each process runs its members on its own devices (``Layout.local``); the global mesh
(``Layout.mesh``) is what orbax checkpoints are written on.

Sharding rules are big_vision / MaxText style: ``(regex, spec)`` pairs matched in order
against a parameter's path (``layers/attn/q_proj/kernel``); the first full match wins. A
spec names the leaf's trailing dimensions, so one rule covers stacked ``(L, in, out)`` and
plain ``(in, out)`` kernels alike; leading (layer) dimensions are never split. Presets:
``replicated``, ``fsdp`` (every kernel's input dimension and the embedding's model
dimension over ``model``) and ``tp`` (Megatron: column-parallel q/k/v/gate/up and LM head,
row-parallel o/down).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.experimental import mesh_utils, multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from agentic_esopt import options as options_lib

PyTree = Any
DATA, MODEL = "data", "model"
AXES = (DATA, MODEL)
Rules = tuple[tuple[str, tuple[str | None, ...]], ...]
_COLUMN = r"(q_proj|k_proj|v_proj|gate_proj|up_proj|in_proj_\w+)"
PRESETS: dict[str, Rules] = {
    "replicated": ((r".*", ()),),
    "fsdp": ((r".*/kernel", (MODEL, None)),
             (r"embed/embedding", (None, MODEL)),
             (r".*", ())),
    "tp": ((rf".*{_COLUMN}/kernel", (None, MODEL)),
           (rf".*{_COLUMN}/bias", (MODEL,)),
           (r".*(o_proj|down_proj|out_proj)/kernel", (MODEL, None)),
           (r"lm_head/kernel", (None, MODEL)),
           (r"embed/embedding", (None, MODEL)),
           (r".*", ())),
}


def parse_shape(text: str) -> dict[str, int]:
    """``"data:4,model:2"`` -> ``{"data": 4, "model": 2}`` (missing axes have size 1).

    Raises:
      ValueError: for an unknown or repeated axis, or a size that is not a positive int.
    """
    sizes = {axis: 1 for axis in AXES}
    seen = set()
    for item in filter(None, (part.strip() for part in text.split(","))):
        axis, _, size = item.partition(":")
        if axis not in AXES or axis in seen:
            raise ValueError(f"mesh axis {axis!r} is unknown or repeated in {text!r}; axes "
                             f"are {AXES}")
        if not size.isdigit() or int(size) < 1:
            raise ValueError(f"mesh axis {axis!r} needs a positive size, got {size!r}")
        seen.add(axis)
        sizes[axis] = int(size)
    return sizes


def parse_rules(text: str) -> Rules:
    """A preset name, or explicit rules ``"REGEX=DIM,DIM;REGEX="`` (each DIM ``model`` or
    ``None``; an empty spec replicates), e.g. ``".*/kernel=model,None;.*="``.

    Raises:
      ValueError: for a bad regex, a malformed rule, or a dimension other than model/None.
    """
    if text in PRESETS:
        return PRESETS[text]
    rules = []
    for item in filter(None, (part.strip() for part in text.split(";"))):
        pattern, equals, dims = item.rpartition("=")
        if not equals:
            raise ValueError(f"rule {item!r} is not REGEX=SPEC (or rules are not one of the "
                             f"presets {tuple(PRESETS)})")
        try:
            re.compile(pattern)
        except re.error as error:
            raise ValueError(f"rule {item!r}: bad regex ({error})") from error
        spec = tuple(None if d.strip() == "None" else d.strip()
                     for d in dims.split(",") if d.strip())
        if any(d not in (MODEL, None) for d in spec):
            raise ValueError(f"rule {item!r}: parameters split over {MODEL!r} only (or None); "
                             f"{DATA!r} carries batch rows")
        rules.append((pattern, spec))
    if not rules:
        raise ValueError("no sharding rules given")
    return tuple(rules)


def path_name(path: Sequence[Any]) -> str:
    """``layers/attn/q_proj/kernel`` for a jax key path (or a tuple of names)."""
    return "/".join(str(getattr(k, "key", getattr(k, "name", k))) for k in path)


def leaf_spec(rules: Rules, name: str, shape: Sequence[int],
              axis_sizes: dict[str, int]) -> tuple[P, list[str]]:
    """The PartitionSpec of leaf ``name`` and every problem with it (unmatched leaf,
    a spec longer than the leaf, a dimension the mesh axis does not divide)."""
    for pattern, spec in rules:
        if re.fullmatch(pattern, name):
            break
    else:
        return P(), [f"no sharding rule matches parameter {name!r}"]
    if len(spec) > len(shape):
        return P(), [f"rule {pattern!r} gives {len(spec)} dimensions to parameter {name!r} "
                     f"of shape {tuple(shape)}"]
    full = (None,) * (len(shape) - len(spec)) + tuple(spec)
    problems = [f"parameter {name!r}: dimension {dim} (size {shape[dim]}) is not divisible "
                f"by mesh axis {axis!r} (size {axis_sizes[axis]}), rule {pattern!r}"
                for dim, axis in enumerate(full)
                if axis is not None and shape[dim] % axis_sizes[axis]]
    return P(*full), problems


def tree_specs(rules: Rules, tree: PyTree, axis_sizes: dict[str, int]) -> PyTree:
    """A PartitionSpec per leaf of ``tree`` (arrays or shape structs).

    Raises:
      ValueError: listing every leaf whose rule does not fit (see ``leaf_spec``).
    """
    problems: list[str] = []

    def spec(path, leaf):
        found, leaf_problems = leaf_spec(rules, path_name(path), leaf.shape, axis_sizes)
        problems.extend(leaf_problems)
        return found

    specs = jax.tree_util.tree_map_with_path(spec, tree)
    if problems:
        raise ValueError("sharding rules do not fit the parameters:\n  "
                         + "\n  ".join(problems))
    return specs


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where a run's arrays live.

    Attributes:
      mesh: the global (data, model) mesh over every process's devices.
      rules: the parameter sharding rules.
    """

    mesh: Mesh
    rules: Rules

    @property
    def local(self) -> Mesh:
        """This process's block of the mesh (the whole mesh on one process)."""
        return self.mesh.local_mesh

    @property
    def axis_sizes(self) -> dict[str, int]:
        return dict(self.mesh.shape)

    def shardings(self, tree: PyTree) -> PyTree:
        """A local ``NamedSharding`` per leaf of a parameter tree (arrays or shape structs).

        Raises:
          ValueError: listing every leaf the rules do not fit (see ``leaf_spec``).
        """
        return jax.tree.map(lambda _, spec: NamedSharding(self.local, spec), tree,
                            tree_specs(self.rules, tree, self.axis_sizes))

    def place(self, params: PyTree) -> PyTree:
        """``params`` placed on this process's devices as the rules say."""
        return jax.device_put(params, self.shardings(params))

    def commit(self, tree: PyTree) -> PyTree:
        """Every leaf on this process's mesh: placed leaves keep their spec, the rest are
        replicated (so jitted steps see the same shardings from the first call on)."""
        return jax.tree.map(lambda leaf: jax.device_put(
            leaf, NamedSharding(self.local, _local_spec(leaf))), tree)

    def to_global(self, tree: PyTree) -> PyTree:
        """Process-local arrays (the same on every process) as global arrays on ``mesh``,
        replicated across processes (what orbax writes once)."""
        if jax.process_count() == 1:
            return tree
        local = self.commit(tree)
        return multihost_utils.host_local_array_to_global_array(
            local, self.mesh, jax.tree.map(_local_spec, local))

    def to_local(self, tree: PyTree) -> PyTree:
        """The inverse of ``to_global``."""
        if jax.process_count() == 1:
            return tree
        specs = jax.tree.map(_local_spec, tree)
        return multihost_utils.global_array_to_host_local_array(tree, self.mesh, specs)


def describe(layout: Layout | None) -> dict[str, Any]:
    """Where a run or benchmark runs: backend, devices, processes, mesh and rules."""
    return dict(backend=jax.default_backend(), device_kind=jax.devices()[0].device_kind,
                device_count=jax.device_count(), process_count=jax.process_count(),
                mesh=None if layout is None else dict(layout.mesh.shape),
                rules=None if layout is None else [[p, list(s)] for p, s in layout.rules])


def _local_spec(leaf: Any) -> P:
    sharding = getattr(leaf, "sharding", None)
    return sharding.spec if isinstance(sharding, NamedSharding) else P()


def make_mesh(shape: dict[str, int] | None = None) -> Mesh:
    """The (data, model) mesh; each process a contiguous block of ``data`` rows.

    Args:
      shape: axis sizes whose product is ``jax.device_count()``; None: one device of each
        process, along ``data``.

    Raises:
      ValueError: if the sizes do not cover the devices, or do not split evenly over the
        processes.
    """
    processes = jax.process_count()
    if shape is None:
        devices = np.array([jax.local_devices(process_index=p)[0] for p in range(processes)])
        return Mesh(devices.reshape(processes, 1), AXES)
    sizes = tuple(shape[axis] for axis in AXES)
    if np.prod(sizes) != jax.device_count():
        raise ValueError(f"mesh {shape} has {np.prod(sizes)} devices; there are "
                         f"{jax.device_count()} ({jax.local_device_count()} per process × "
                         f"{processes} processes)")
    if sizes[0] % processes or (sizes[0] // processes) * sizes[1] != jax.local_device_count():
        raise ValueError(f"mesh {shape}: each of the {processes} processes needs "
                         f"{DATA}/{processes} whole rows of {MODEL} groups on its own "
                         f"{jax.local_device_count()} devices")
    per_process = (sizes[0] // processes, sizes[1])
    devices = mesh_utils.create_hybrid_device_mesh(per_process, (processes, 1),
                                                   process_is_granule=True)
    return Mesh(devices, AXES)


@dataclasses.dataclass(frozen=True)
class MeshOptions:
    """The device mesh and how parameters are split over it (a config's ``mesh`` section)."""

    shape: str = options_lib.field("", "Mesh axis sizes, e.g. 'data:4,model:2', whose "
                                       "product is the number of devices of all processes; "
                                       "empty: no mesh on one process, one device per "
                                       "process otherwise.")
    rules: str = options_lib.field("fsdp", "Parameter sharding: a preset (replicated, fsdp, "
                                           "tp) or rules 'REGEX=DIM,...;...' over parameter "
                                           "paths, DIM = model or None.")

    def problems(self) -> list[str]:
        problems = []
        for name, parse, value in (("shape", parse_shape, self.shape),
                                   ("rules", parse_rules, self.rules)):
            try:
                parse(value)
            except ValueError as error:
                problems.append(f"{name}: {error}")
        return problems


def layout(options: MeshOptions) -> Layout | None:
    """The run's layout (None: one process without a mesh keeps JAX's default device)."""
    if not options.shape and jax.process_count() == 1:
        return None
    return Layout(make_mesh(parse_shape(options.shape) if options.shape else None),
                  parse_rules(options.rules))


@dataclasses.dataclass(frozen=True)
class DistributedOptions:
    """The processes of a multi-host run (a config's ``distributed`` section).

    Nothing set and ``auto`` off: one process. Any field set: ``jax.distributed.initialize``
    with those (JAX fills in the rest from the cluster environment). ``auto``: JAX detects
    everything (TPU pod slices, SLURM, Open MPI, Kubernetes).
    """

    coordinator: str | None = options_lib.field(None, "host:port of process 0's "
                                                       "coordinator.")
    num_processes: int | None = options_lib.field(None, "Number of processes.")
    process_id: int | None = options_lib.field(None, "This process's index, in "
                                                     "[0, num_processes).")
    auto: bool = options_lib.field(False, "Let jax.distributed.initialize() detect the "
                                          "cluster (TPU pods, SLURM, ...).")

    @property
    def enabled(self) -> bool:
        return self.auto or any(v is not None for v in (self.coordinator, self.num_processes,
                                                        self.process_id))

    def problems(self) -> list[str]:
        problems: list[str] = []
        check = options_lib.checker(problems)
        check(self.num_processes is None or self.num_processes >= 1,
              f"num_processes must be >= 1, got {self.num_processes}")
        check(self.process_id is None or self.num_processes is None
              or 0 <= self.process_id < self.num_processes,
              f"process_id must be in [0, num_processes={self.num_processes}), got "
              f"{self.process_id}")
        check(self.coordinator is None or re.fullmatch(r"[^:\s]+:\d+", self.coordinator),
              f"coordinator must be host:port, got {self.coordinator!r}")
        return problems


def initialize(options: DistributedOptions) -> None:
    """Starts ``jax.distributed`` as ``options`` say (nothing for one process). Call it
    before anything touches a device."""
    if options.enabled:
        jax.distributed.initialize(options.coordinator, options.num_processes,
                                   options.process_id)


def is_primary() -> bool:
    """Whether this process writes the run's files (process 0)."""
    return jax.process_index() == 0


def sync(name: str) -> None:
    """Waits until every process gets here (nothing on one process)."""
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(name)


def process_slice(size: int) -> range:
    """This process's contiguous share of ``range(size)`` (shares differ by at most one)."""
    bounds = np.linspace(0, size, jax.process_count() + 1).round().astype(int)
    return range(bounds[jax.process_index()], bounds[jax.process_index() + 1])


def process_sum(value: int) -> int:
    """``value`` summed over every process (``value`` itself on one process)."""
    if jax.process_count() == 1:
        return value
    return int(multihost_utils.process_allgather(np.array([value], np.int64)).sum())


def allgather_bytes(data: bytes) -> list[bytes]:
    """Every process's ``data``, in process order (``[data]`` on one process). Padded to
    a power of two of at least 64 KiB, so few gathers of different sizes compile."""
    if jax.process_count() == 1:
        return [data]
    lengths = multihost_utils.process_allgather(np.array([len(data)], np.int64)).reshape(-1)
    padded = np.zeros(max(1 << 16, 1 << int(lengths.max()).bit_length()), np.uint8)
    padded[:len(data)] = np.frombuffer(data, np.uint8)
    gathered = multihost_utils.process_allgather(padded)
    return [gathered[p, :n].tobytes() for p, n in enumerate(lengths)]
