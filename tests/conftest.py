"""Test configuration: 8 fake host CPU devices so sharding runs on one CPU, LLVM's
cheapest code generation, and one persistent compilation cache for the session."""

import atexit
import os
import shutil
import tempfile

# Once: pytest-xdist's workers (and the processes tests launch) inherit the controller's
# environment. The tests compile far more than they run: LLVM's -O0 compiles the same HLO
# programs in about half the time (their results differ from -O2's by float rounding).
for flag in ("--xla_force_host_platform_device_count=8", "--xla_backend_optimization_level=0"):
    if flag.split("=")[0] not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + flag).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# One compilation cache for the session, set before pytest-xdist starts its workers so
# that they and the processes tests launch inherit it: a program compiled once is loaded,
# not recompiled, by later modules (whose in-memory programs are dropped below), workers
# and launched runs.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="agentic_esopt_jax_")
    atexit.register(shutil.rmtree, os.environ["JAX_COMPILATION_CACHE_DIR"], True)

# pylint: disable=wrong-import-position  # jax reads JAX_PLATFORMS when imported.
import jax  # noqa: E402
import pytest  # noqa: E402


def pytest_configure(config):
    config.addinivalue_line("markers", "smollm2: uses the real embedded SmolLM2 GGUF")


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
    """Drops every compiled program after each test module.

    Each XLA:CPU executable keeps its own memory mappings; a whole suite's worth of them
    in one process passes the kernel's per-process limit (vm.max_map_count, 65530), after
    which the next compile segfaults inside LLVM.
    """
    yield
    jax.clear_caches()
