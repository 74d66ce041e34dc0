"""Launchers (absl flags, ml_collections config files) and benchmarks.

Importing the package, before any launcher imports the library, silences start-up chatter
that is not ours: transformers' "PyTorch was not found" advisory (we use its tokenizers
only) and, on machines with no accelerator device, JAX's probe for TPU and GPU backends.
"""

import os


def _has_accelerator() -> bool:
    return any(os.path.exists(device) for device in ("/dev/accel0", "/dev/nvidia0",
                                                     "/dev/nvidiactl", "/dev/vfio"))


os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
if not _has_accelerator():
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
