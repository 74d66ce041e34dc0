"""Test configuration: 8 fake host CPU devices so sharding runs on one CPU, and one
persistent compilation cache for the session."""

import atexit
import os
import shutil
import tempfile

if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    # Once: pytest-xdist's workers inherit the controller's environment.
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    ).strip()
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
