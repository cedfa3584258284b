"""The loader: each step's global batch as sharded arrays on a JAX device mesh (see docs/design/loader.md).

Importing this package imports JAX: a program that wants fake CPU devices must set
``XLA_FLAGS=--xla_force_host_platform_device_count=N`` (or ``jax_num_cpu_devices``) before JAX starts.
"""

from tokenmix.datasets.batch_schedule import BatchSchedule
from tokenmix.loader.batch import LmBatch, StepBatch
from tokenmix.loader.fingerprint import batch_fingerprint
from tokenmix.loader.loader import BatchIterator, DataLoader, LoaderError
from tokenmix.loader.sharding import BatchLayout

__all__ = ["BatchIterator", "BatchLayout", "BatchSchedule", "DataLoader", "LmBatch", "LoaderError", "StepBatch", "batch_fingerprint"]
