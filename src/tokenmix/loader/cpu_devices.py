"""Fake CPU devices for meshes on a machine without accelerators (the demo, the training launch, tests)."""

from __future__ import annotations

import os

DEVICE_COUNT_FLAG = "--xla_force_host_platform_device_count"


def use_fake_cpu_devices(count: int) -> None:
    """Ask JAX for ``count`` CPU devices and the CPU platform alone, unless the environment says otherwise.

    Only effective before JAX starts, hence no module-level JAX import here or in ``cli.main``.
    """
    flags = os.environ.get("XLA_FLAGS", "")
    if DEVICE_COUNT_FLAG not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} {DEVICE_COUNT_FLAG}={count}".strip()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
