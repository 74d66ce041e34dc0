"""Test configuration: 8 fake host CPU devices so sharding runs on one CPU."""

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")


def pytest_configure(config):
    config.addinivalue_line("markers", "smollm2: uses the real embedded SmolLM2 GGUF")
