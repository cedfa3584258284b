"""Fake CPU devices for meshes on a machine without accelerators (the demo, the training launch, tests)."""

from __future__ import annotations

import os
import sys

DEVICE_COUNT_FLAG = "--xla_force_host_platform_device_count"


def use_fake_cpu_devices(count: int) -> None:
    """Ask JAX for ``count`` CPU devices and the CPU platform alone, unless the environment says otherwise.

    Only effective before JAX starts its backends, hence no module-level JAX import here or in ``cli.main``. JAX reads
    ``JAX_PLATFORMS`` when it is imported, so where it is imported already its setting is changed too (else it would
    still probe for a TPU, and log that it found none, on every run).
    """
    flags = os.environ.get("XLA_FLAGS", "")
    if DEVICE_COUNT_FLAG not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} {DEVICE_COUNT_FLAG}={count}".strip()
    if "JAX_PLATFORMS" not in os.environ:
        os.environ["JAX_PLATFORMS"] = "cpu"
        if "jax" in sys.modules:
            sys.modules["jax"].config.update("jax_platforms", "cpu")
