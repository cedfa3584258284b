"""Where a global batch lives on the mesh: shardings from a haliax axis mapping, and which rows a process reads.

A batch of ``B`` examples of ``L`` tokens is a ``(Batch, Position)`` array. The axis mapping (haliax's
``ResourceMapping``: logical axis name -> mesh axis or tuple of mesh axes) says over which mesh axes
each logical axis is split; mesh axes it does not name hold replicas. From the ``NamedSharding`` this
gives, ``addressable_devices_indices_map`` says which rows each of this process's devices holds; the
process reads the union of those rows once, in ascending order, and the loader hands that one read
to ``jax.make_array_from_process_local_data``, which cuts every device's shard (rows and, where the
position axis is split, columns) out of it. Replicas (a model-parallel axis, or two devices of a
process holding the same rows) therefore never cause a second read.

Nothing here reads data: it is index arithmetic over the mesh, so it is computed once per batch size.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import haliax as hax
import numpy as np
from haliax.partitioning import pspec_for_axis
from jax.sharding import Mesh, NamedSharding, PartitionSpec

AxisMapping = Mapping[str, str | Sequence[str]]
"""haliax ``ResourceMapping`` style: logical axis name -> mesh axis name or tuple of names."""


def mesh_axes_of(mapping: AxisMapping, axis: str) -> tuple[str, ...]:
    """The mesh axes a logical axis is split over (empty when it is replicated)."""
    spec = mapping.get(axis)
    if spec is None:
        return ()
    return (spec,) if isinstance(spec, str) else tuple(spec)


def check_axis_mapping(mesh: Mesh, mapping: AxisMapping, batch_axis: str, position_axis: str) -> None:
    """Refuse mesh axes the mesh lacks, and a mesh axis used twice by the batch and position axes."""
    used: dict[str, str] = {}
    for axis in (batch_axis, position_axis):
        for name in mesh_axes_of(mapping, axis):
            if name not in mesh.shape:
                raise ValueError(f"axis_mapping[{axis!r}] names mesh axis {name!r}, but the mesh's axes are {tuple(mesh.axis_names)}")
            if name in used:
                raise ValueError(f"axis_mapping: mesh axis {name!r} is used by both {used[name]!r} and {axis!r}; a mesh axis splits one of them only")
            used[name] = axis


class BatchLayout:
    """The shardings of a ``batch_size`` x ``seq_len`` batch on a mesh, and the rows and shards of this process.

    ``tokens`` / ``loss_mask`` / ``segment_ids`` use ``token_sharding`` over (Batch, Position);
    ``source_ids`` use ``row_sharding`` over (Batch,); ``process_rows`` says which rows every process holds (where
    each process's fingerprint row digests go).
    """

    def __init__(self, mesh: Mesh, mapping: AxisMapping, batch_size: int, seq_len: int, batch_axis: str = "batch",
                 position_axis: str = "position"):
        check_axis_mapping(mesh, mapping, batch_axis, position_axis)
        self.batch_size = batch_size
        self.seq_len = seq_len
        self.Batch = hax.Axis(batch_axis, batch_size)
        self.Position = hax.Axis(position_axis, seq_len)
        self.batch_mesh_axes = mesh_axes_of(mapping, batch_axis)
        self.position_mesh_axes = mesh_axes_of(mapping, position_axis)
        self.batch_shards = math.prod(mesh.shape[a] for a in self.batch_mesh_axes)
        self.position_shards = math.prod(mesh.shape[a] for a in self.position_mesh_axes)
        if batch_size % self.batch_shards:
            raise ValueError(
                f"batch size {batch_size} is not divisible by {self.batch_shards}, the number of shards of axis {batch_axis!r} over mesh "
                f"axes {self.batch_mesh_axes} (sizes {[mesh.shape[a] for a in self.batch_mesh_axes]}); use a multiple of {self.batch_shards}"
            )
        if seq_len % self.position_shards:
            raise ValueError(
                f"seq_len {seq_len} is not divisible by {self.position_shards}, the number of shards of axis {position_axis!r} over mesh "
                f"axes {self.position_mesh_axes}; use a multiple of {self.position_shards} or do not shard {position_axis!r}"
            )
        spec = pspec_for_axis((self.Batch, self.Position), dict(mapping))
        self.token_sharding = NamedSharding(mesh, spec)
        self.row_sharding = NamedSharding(mesh, PartitionSpec(spec[0]))
        placement = self.token_sharding.addressable_devices_indices_map((batch_size, seq_len))
        spans = {_bounds(index[0], batch_size) for index in placement.values()}
        self.rows = np.concatenate([np.arange(a, b) for a, b in sorted(spans)]) if spans else np.zeros(0, np.int64)
        """The global rows this process's devices hold, ascending, each once: what the process reads.

        This is the order ``jax.make_array_from_process_local_data`` expects a process's rows in (its
        devices' row blocks, sorted), so the read can be handed to it as it is.
        """
        by_process: dict[int, set[tuple[int, int]]] = {}
        for device, index in self.token_sharding.devices_indices_map((batch_size, seq_len)).items():
            by_process.setdefault(device.process_index, set()).add(_bounds(index[0], batch_size))
        self.process_rows = [np.concatenate([np.arange(a, b) for a, b in sorted(by_process[p])]) for p in sorted(by_process)]
        """Every process's ``rows``, by process index: where each process's row digests go in the global batch."""
        self.fully_addressable = self.token_sharding.is_fully_addressable
        """Whether this process holds every device of the mesh (then every row is local and nothing is gathered)."""


def _bounds(index: slice, size: int) -> tuple[int, int]:
    start, stop, step = index.indices(size)
    if step != 1:
        raise ValueError(f"unexpected strided shard {index} of an axis of size {size}")
    return start, stop
