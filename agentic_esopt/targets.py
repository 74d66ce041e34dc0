"""Devices a run can be planned for without owning them, and their published figures.

A target is ``cpu:N`` (N of this host's CPU devices; fake ones with
``XLA_FLAGS=--xla_force_host_platform_device_count=N`` set before JAX starts), ``host``
(this process's own devices, e.g. a GPU) or ``tpu:GENERATION:TOPOLOGY`` (``tpu:v5e:2x4``,
``tpu:v5p:4x4x4``): a TPU slice described by libtpu
(``jax.experimental.topologies.get_topology_desc``) on any machine, TPU or not, whose
devices programs can be compiled for but not run on. A slice of several hosts runs one
process per host; each process compiles and runs its programs on its own devices.
"""

from __future__ import annotations

import dataclasses
import glob
import importlib.util
import math
import os
import resource
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import numpy as np
from jax.sharding import Mesh

from agentic_esopt import sharding

# How libtpu starts on a machine that is not a TPU VM (see ``libtpu_off_tpu``): quietly (it
# warns that it finds no metadata server, accelerator type or worker list), and without
# /tmp/libtpu_lockfile, which keeps a second process off a TPU VM's chips; a host without
# chips has nothing to guard, and with it two planners on one host fail to start.
LIBTPU_OFF_TPU_ENV = {"TPU_SKIP_MDS_QUERY": "1", "TPU_ACCELERATOR_TYPE": "v5litepod-8",
                      "TPU_WORKER_HOSTNAMES": "localhost", "TPU_STDERR_LOG_LEVEL": "3",
                      "TPU_MIN_LOG_LEVEL": "3", "ALLOW_MULTIPLE_LIBTPU_LOAD": "1"}


class Chip(NamedTuple):
    """One chip's published figures (per chip; a chip may be several JAX devices).

    Attributes:
      memory_bytes: high-bandwidth memory.
      peak_flops: dense bfloat16 FLOP/s.
      bandwidth: memory bandwidth, bytes/s.
      source: where the figures are published.
    """

    memory_bytes: int
    peak_flops: float
    bandwidth: float
    source: str


GiB = 2**30
TPU_CHIPS: dict[str, Chip] = {
    "v4": Chip(32 * GiB, 275e12, 1228e9, "https://cloud.google.com/tpu/docs/v4"),
    "v5e": Chip(16 * GiB, 197e12, 819e9, "https://cloud.google.com/tpu/docs/v5e"),
    "v5p": Chip(95 * GiB, 459e12, 2765e9, "https://cloud.google.com/tpu/docs/v5p"),
    "v6e": Chip(32 * GiB, 918e12, 1640e9, "https://cloud.google.com/tpu/docs/v6e"),
}
# Slices of at most this many chips are one host (v5litepod-8, v6e-8: one VM of 8 chips);
# larger ones, and v4 and v5p slices, have libtpu's hosts of 4 chips.
SINGLE_HOST_UP_TO = {"v5e": 8, "v6e": 8}
# GPUs by a word of their device kind (``host`` targets; memory from the device itself).
GPU_CHIPS: dict[str, Chip] = {
    "H100": Chip(80 * 10**9, 989e12, 3350e9, "https://www.nvidia.com/en-us/data-center/h100/"),
    "H200": Chip(141 * 10**9, 989e12, 4800e9, "https://www.nvidia.com/en-us/data-center/h200/"),
}


@dataclasses.dataclass(frozen=True)
class Target:
    """Devices to plan for.

    Attributes:
      name: the target as given (``tpu:v5e:2x4``).
      devices: every device of the slice, all processes'.
      device_memory_bytes: memory of one device.
      peak_flops: one device's peak FLOP/s (None: unknown, e.g. CPUs).
      bandwidth: one device's memory bandwidth in bytes/s (None: unknown).
      source: where the figures come from.
      runnable: whether this process can run programs on the devices (not a
        topology description).
    """

    name: str
    devices: tuple[Any, ...]
    device_memory_bytes: int
    peak_flops: float | None
    bandwidth: float | None
    source: str
    runnable: bool

    @property
    def processes(self) -> int:
        return len({d.process_index for d in self.devices})

    @property
    def device_kind(self) -> str:
        return self.devices[0].device_kind


def host_memory_bytes() -> int:
    """This machine's physical memory."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def peak_rss_bytes() -> int:
    """This process's peak resident set size so far."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB.


def target(name: str) -> Target:
    """The target ``name`` (see the module docstring).

    Raises:
      ValueError: one line naming the valid choices, for an unknown target, TPU generation
        or topology, too few CPU devices, or libtpu missing.
    """
    kind, _, rest = name.partition(":")
    if kind == "cpu" and rest.isdigit() and int(rest) >= 1:
        return _cpu(name, int(rest))
    if kind == "host" and not rest:
        return _host(name)
    if kind == "tpu" and rest:
        return _tpu(name, *rest.partition(":")[::2])
    raise ValueError(f"unknown target {name!r}: choose cpu:N, host, or tpu:GENERATION:TOPOLOGY "
                     f"with GENERATION one of {tuple(TPU_CHIPS)} (e.g. tpu:v5e:2x4)")


def _cpu(name: str, count: int) -> Target:
    devices = jax.devices("cpu")
    if len(devices) < count:
        raise ValueError(f"target {name} needs {count} CPU devices; JAX started with "
                         f"{len(devices)}: set XLA_FLAGS=--xla_force_host_platform_device_"
                         f"count={count} before JAX starts (experiments.plan does)")
    return Target(name, tuple(devices[:count]), host_memory_bytes() // count, None, None,
                  "this host's memory, shared by its CPU devices", True)


def _host(name: str) -> Target:
    devices = jax.devices()
    stats = devices[0].memory_stats() or {}
    chip = next((c for word, c in GPU_CHIPS.items() if word in devices[0].device_kind), None)
    memory = stats.get("bytes_limit") or (chip.memory_bytes if chip
                                          else host_memory_bytes() // len(devices))
    source = "device.memory_stats()" if "bytes_limit" in stats else "published"
    return Target(name, tuple(devices), int(memory), chip and chip.peak_flops,
                  chip and chip.bandwidth, f"{source}; {chip.source if chip else 'no peak'}",
                  True)


def _tpu(name: str, generation: str, topology: str) -> Target:
    if generation not in TPU_CHIPS:
        raise ValueError(f"unknown TPU generation {generation!r} in {name!r}: choose one of "
                         f"{tuple(TPU_CHIPS)}")
    dims = topology.split("x")
    if not all(d.isdigit() and int(d) >= 1 for d in dims) or len(dims) not in (2, 3):
        raise ValueError(f"bad TPU topology {topology!r} in {name!r}: chips per dimension, "
                         "e.g. 2x4 (v5e, v6e) or 2x2x2 (v4, v5p)")
    if not has_libtpu():
        raise ValueError(f"target {name!r} needs libtpu: pip install -e '.[tpu]' (the libtpu "
                         "that matches the pinned jax)")
    libtpu_off_tpu()
    from jax.experimental import topologies  # pylint: disable=import-outside-toplevel
    chips = [int(d) for d in dims]
    single_host = {}
    if generation in SINGLE_HOST_UP_TO and math.prod(chips) <= SINGLE_HOST_UP_TO[generation]:
        single_host = dict(chips_per_host_bounds=[*chips, 1][:3])
    try:
        devices = topologies.get_topology_desc(topology_name=f"{generation}:{topology}",
                                               platform="tpu", **single_host).devices
    except Exception as error:  # pylint: disable=broad-except
        raise ValueError(f"target {name!r}: libtpu has no topology {generation}:{topology}: "
                         f"{str(error).splitlines()[0]}") from None
    chip = TPU_CHIPS[generation]
    per_chip = len(devices) / math.prod(chips)  # v4: two cores, two devices
    return Target(name, tuple(devices), int(chip.memory_bytes / per_chip),
                  chip.peak_flops / per_chip, chip.bandwidth / per_chip, chip.source, False)


def libtpu_off_tpu() -> None:
    """On a machine without TPUs, keeps libtpu's start-up warnings (no metadata server, no
    accelerator type, no worker list) out of the log and lets several processes load it
    (for topologies only): sets ``LIBTPU_OFF_TPU_ENV`` where unset. Call it before JAX
    starts its backends; a TPU VM is left as it is."""
    if glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*"):
        return
    for name, value in LIBTPU_OFF_TPU_ENV.items():
        os.environ.setdefault(name, value)


def has_libtpu() -> bool:
    """Whether libtpu is installed (``tpu:`` targets need it)."""
    return importlib.util.find_spec("libtpu") is not None


def local_mesh(devices: Sequence[Any], shape: dict[str, int], name: str) -> Mesh:
    """The (data, model) mesh one process of a run on ``devices`` computes on: process
    0's devices, ``data / processes`` rows of whole ``model`` groups (``sharding.make_mesh``'s
    local mesh).

    Raises:
      ValueError: if the mesh does not cover the devices or split over the processes.
    """
    sizes = tuple(shape[axis] for axis in sharding.AXES)
    processes = len({d.process_index for d in devices})
    own = [d for d in devices if d.process_index == devices[0].process_index]
    if math.prod(sizes) != len(devices):
        raise ValueError(f"mesh {_shape_text(shape)} has {math.prod(sizes)} devices; target "
                         f"{name} has {len(devices)} ({len(own)} per process × {processes} "
                         f"processes): choose sizes whose product is {len(devices)}")
    if sizes[0] % processes or sizes[0] // processes * sizes[1] != len(own):
        raise ValueError(f"mesh {_shape_text(shape)}: each of the {processes} processes of "
                         f"{name} needs data/{processes} whole rows of model groups on its "
                         f"{len(own)} devices (model must divide {len(own)})")
    local = (sizes[0] // processes, sizes[1])
    try:
        from jax.experimental import mesh_utils  # pylint: disable=import-outside-toplevel
        grid = mesh_utils.create_device_mesh(local, devices=own)
    except (ValueError, NotImplementedError, AssertionError):
        grid = np.array(own).reshape(local)
    return Mesh(grid, sharding.AXES)


def _shape_text(shape: dict[str, int]) -> str:
    return ",".join(f"{axis}:{shape[axis]}" for axis in sharding.AXES)
