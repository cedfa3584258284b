"""The loader: each step's global batch as sharded arrays on a JAX device mesh (see docs/design/loader.md).

Using ``DataLoader``, ``BatchIterator``, ``LoaderError``, the batch types or ``BatchLayout`` imports JAX: a
program that wants fake CPU devices must set ``XLA_FLAGS=--xla_force_host_platform_device_count=N`` (or
``jax_num_cpu_devices``) before that. ``BatchSchedule`` (pure index math) and ``batch_fingerprint`` import no JAX.
"""

from typing import TYPE_CHECKING

from tokenmix._lazy import lazy_exports

if TYPE_CHECKING:
    from tokenmix.loader.batch import LmBatch, StepBatch
    from tokenmix.loader.batch_schedule import BatchSchedule
    from tokenmix.loader.fingerprint import batch_fingerprint
    from tokenmix.loader.loader import BatchIterator, DataLoader, LoaderError
    from tokenmix.loader.sharding import BatchLayout

__all__ = ["BatchIterator", "BatchLayout", "BatchSchedule", "DataLoader", "LmBatch", "LoaderError", "StepBatch", "batch_fingerprint"]
_exports, __getattr__, __dir__ = lazy_exports(__name__, __file__)
