"""What the loader hands to a training step: the batch as a pytree of named arrays, and its step metadata."""

from __future__ import annotations

from dataclasses import dataclass

import equinox as eqx
import haliax as hax
import jax


class LmBatch(eqx.Module):
    """A global batch on the mesh: haliax NamedArrays, sharded as the loader's axis mapping says.

    ``tokens``, ``loss_mask`` (true where position i is trained to predict token i + 1),
    ``segment_ids`` (documents within an example, -1 for padding) and, when asked for, ``positions``
    (within each segment) have axes (Batch, Position);
    ``source_ids`` (the mixture source of each example) has axis (Batch,). Only arrays are leaves, so
    the batch can be passed straight to a jitted step without retracing per step.
    """

    tokens: hax.NamedArray
    loss_mask: hax.NamedArray
    segment_ids: hax.NamedArray
    source_ids: hax.NamedArray
    positions: hax.NamedArray | None = None
    """Each token's position within its segment, from 0 (Batch, Position); only with ``DataLoader(positions=True)``."""

    @property
    def Batch(self) -> hax.Axis:
        """The batch axis (its size is this step's batch size)."""
        return self.tokens.axes[0]

    @property
    def Position(self) -> hax.Axis:
        """The position axis (its size is the sequence length)."""
        return self.tokens.axes[1]

    def arrays(self) -> dict[str, jax.Array]:
        """The same batch as plain ``jax.Array``s (shape ``(B, L)``, and ``(B,)`` for ``source_ids``), same sharding."""
        arrays = {
            "tokens": self.tokens.array,
            "loss_mask": self.loss_mask.array,
            "segment_ids": self.segment_ids.array,
            "source_ids": self.source_ids.array,
        }
        if self.positions is not None:
            arrays["positions"] = self.positions.array
        return arrays


@dataclass(frozen=True)
class StepBatch:
    """One step of the loader: which step and examples, the batch, and its fingerprint.

    Kept apart from ``LmBatch`` so that the step number and fingerprint (Python values) never become
    part of a jitted function's static arguments.
    """

    step: int
    offset: int
    """The global example index of the batch's first row; the batch holds examples ``offset .. offset + size - 1``."""
    batch: LmBatch
    fingerprint: str | None
    """``tokenmix.loader.fingerprint`` of the global batch (None when the loader was made with ``fingerprint=False``)."""

    @property
    def size(self) -> int:
        """The batch size of this step."""
        return self.batch.Batch.size
