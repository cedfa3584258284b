"""``prebuilt``: records that already hold token ids (newer Levanter's ``PrebuiltLmDatasetFormat``).

Each record's ``input_ids_key`` field is a list of token ids, stored as it is (no BOS/EOS added, as Levanter adds none),
and, with ``loss_weights_key``, a list of the same length saying where the loss counts: Levanter weights the loss at
position ``i`` (predicting token ``i + 1``) by ``weights[i]``. tokenmix trains on a token or not, so the weights must be
0 or 1; token ``i + 1`` is a target where ``weights[i]`` is 1. Each record is one example (padded, or cut at
``seq_len``), as Levanter reads a prebuilt cache entry per example, unless ``pack`` says otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tokenmix.formats.base import BadRecordError, FormatContext, LmDatasetFormatBase, Pack, RecordRenderer, Rendered, record_field, token_ids


@LmDatasetFormatBase.register_subclass("prebuilt")
@dataclass(frozen=True)
class PrebuiltLmDatasetFormat(LmDatasetFormatBase):
    """Token ids given by each record, with optional 0/1 loss weights."""

    input_ids_key: str = "input_ids"
    """Field holding the token ids."""
    loss_weights_key: str | None = None
    """Field holding one 0 or 1 per token: whether the loss at that position (predicting the next token) counts."""
    pack: Pack = None
    """Unset: one record per example (Levanter's); true or a number packs records together."""

    adds_special_tokens = False
    reads_token_ids = True
    dataset_options = ("pack",)
    default_pack = "pad"

    @property
    def masks_loss(self) -> bool:
        return self.loss_weights_key is not None

    def bind(self, context: FormatContext) -> RecordRenderer:
        import numpy as np  # here: a config's formats are read without numpy

        vocab = context.vocab_size

        def render(record: dict[str, Any]) -> Rendered:
            ids = token_ids(record_field(record, self.input_ids_key, "input_ids_key"), self.input_ids_key, vocab)
            if self.loss_weights_key is None:
                return Rendered([ids.tolist()])
            weights = record_field(record, self.loss_weights_key, "loss_weights_key")
            if not isinstance(weights, list) or not all(isinstance(w, int | float) for w in weights):
                raise BadRecordError("wrong_type", f"{self.loss_weights_key!r} must be a list of 0s and 1s (JSON numbers), one per "
                                                   f"token of {self.input_ids_key!r}")
            weights = np.asarray(weights, dtype=np.float64)
            if weights.shape != ids.shape:
                raise BadRecordError("wrong_type", f"{self.loss_weights_key!r} has {weights.size} weights for {ids.size} tokens")
            odd = np.flatnonzero((weights != 0) & (weights != 1))
            if odd.size:
                raise BadRecordError("wrong_type", f"{self.loss_weights_key!r}[{odd[0]}] is {weights[odd[0]]}: tokenmix trains on a "
                                                   "token or not, so loss weights must be 0 or 1")
            target = np.empty(ids.size, bool)  # token j is a target when the loss at position j - 1 counts
            target[1:] = weights[:-1] == 1
            target[0] = target[1] if ids.size > 1 else False
            cuts = np.flatnonzero(np.diff(target)) + 1
            runs = np.split(ids, cuts)
            return Rendered([r.tolist() for r in runs], [bool(target[start]) for start in np.concatenate([[0], cuts])])

        return render

