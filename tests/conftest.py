"""Test configuration: 8 fake host CPU devices so sharding runs on one CPU, XLA's cheapest
code generation for the tests' own processes, and one persistent compilation cache for
the session."""

import atexit
import os
import shutil
import tempfile

# Inherited by pytest-xdist's workers and by the processes tests launch.
DEVICES_FLAG = "--xla_force_host_platform_device_count=8"
if DEVICES_FLAG.split("=")[0] not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + DEVICES_FLAG).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# One compilation cache for the session, set before pytest-xdist starts its workers so
# that they and the processes tests launch inherit it: a program compiled once is loaded,
# not recompiled, by later modules (whose in-memory programs are dropped below), workers
# and launched runs.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="agentic_esopt_jax_")
    atexit.register(shutil.rmtree, os.environ["JAX_COMPILATION_CACHE_DIR"], True)
# Every program, however quick to compile: the tiny models' programs take well under
# JAX's default second to compile, and each module recompiles them otherwise.
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")

# pylint: disable=wrong-import-position  # jax reads JAX_PLATFORMS when imported.
import jax  # noqa: E402
import pytest  # noqa: E402

# The tests compile far more than they run: LLVM's -O0 and XLA:CPU's older elemental
# emitters in place of its fusion emitters compile the same HLO programs in about a third
# of the time. Their results differ from the default code's by float rounding, so
# properties of the generated code itself (two programs agreeing bit for bit) are checked
# in processes of their own under the default (tests/es/blocked_update_check.py). XLA
# reads XLA_FLAGS once, when the backend starts. Processes that tests launch start with
# the flags above alone, XLA's defaults: training runs on the tiny model spend their time
# running (GRPO's steps most), loading their programs from the cache. Launches that mostly
# compile take ``fast_compile_env``.
FAST_COMPILE_FLAGS = "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false"
_LAUNCHED_FLAGS = os.environ["XLA_FLAGS"]
os.environ["XLA_FLAGS"] = f"{_LAUNCHED_FLAGS} {FAST_COMPILE_FLAGS}"
jax.devices()
os.environ["XLA_FLAGS"] = _LAUNCHED_FLAGS


def pytest_configure(config):
    config.addinivalue_line("markers", "smollm2: uses the real embedded SmolLM2 GGUF")


@pytest.fixture(scope="session")
def fast_compile_env():
    """The environment for a launched process that compiles more than it runs (benchmarks
    at smoke sizes, the digits runs): the tests' own fast-compiling flags."""
    return dict(os.environ, XLA_FLAGS=f"{_LAUNCHED_FLAGS} {FAST_COMPILE_FLAGS}")


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
    """Drops every compiled program after each test module.

    Each XLA:CPU executable keeps its own memory mappings; a whole suite's worth of them
    in one process passes the kernel's per-process limit (vm.max_map_count, 65530), after
    which the next compile segfaults inside LLVM.
    """
    yield
    jax.clear_caches()
