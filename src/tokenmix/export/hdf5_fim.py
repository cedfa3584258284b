"""Cerebras's FIM mode: an LMData sample rearranged for fill-in-the-middle, as modelzoo's ``hdf5_preprocessing`` does it.

A sample's inputs are split at each EOS into parts (the EOS dropped). For each part (the last, after the final EOS, even
when empty; earlier empty ones are skipped) one draw with probability ``fim_rate`` decides whether it is rearranged:
its text (decoded with special tokens kept) is cut at two character positions drawn uniformly from
``[0, len(text)]``, prefix, middle and suffix are encoded again, and a second draw with probability ``spm_rate``
picks suffix-prefix-middle order over prefix-suffix-middle. Each part is then laid out with its sentinels and an EOS;
the sample is brought back to ``max_seq_length + 1`` tokens by removing tokens one at a time from the parts in turn
(each from the end of its suffix, then the start of its prefix, then the start of its middle), or by padding after the
last part. Inputs and labels are the result shifted by one; the mask marks every position but the padding.

The draws come from one ``numpy.random.RandomState(seed)`` in sample order, as Cerebras's single process draws them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

_PREFIX, _MIDDLE, _SUFFIX = 0, 1, 2


@dataclass(frozen=True)
class FimTokens:
    """The ids FIM lays out around the parts."""

    prefix: int
    middle: int
    suffix: int
    eos: int
    pad: int


class FimRearranger:
    """Rearranges LMData samples one after another, drawing from its own generator."""

    def __init__(self, tokenizer: Any, tokens: FimTokens, fim_rate: float, spm_rate: float, seed: int):
        self._tokenizer = tokenizer
        """A ``tokenizers.Tokenizer``: its ``decode`` and ``encode`` are the ones Cerebras's NeoX tokenizer calls."""
        self._tokens = tokens
        self._fim_rate = fim_rate
        self._spm_rate = spm_rate
        self._rng = np.random.RandomState(seed)

    def rearrange(self, sample: np.ndarray) -> np.ndarray:
        """The ``[3, max_seq_length]`` sample (inputs, mask, labels) rearranged; the mask is never inverted."""
        inputs = sample[0]
        length = len(inputs)
        breaks = np.flatnonzero(inputs == self._tokens.eos).tolist()
        parts, begin = [], 0
        for end in breaks:
            if end > begin:
                parts.append(self._split(inputs[begin:end]))
            begin = end + 1
        parts.append(self._split(inputs[begin:]))
        sentinels = sum(1 if order == "AR" else 4 for _, order in parts)
        excess = sum(len(piece) for pieces, _ in parts for piece in pieces) + sentinels - 1 - length
        padding = 0
        if excess >= 0:
            _shorten([pieces for pieces, _ in parts], excess)
        else:
            padding = -excess
        sequence = np.concatenate([self._lay_out(pieces, order) for pieces, order in parts]
                                  + [np.full(padding, self._tokens.pad, np.int64)])
        out = np.empty_like(sample)
        out[0] = sequence[:-1]
        out[1] = np.arange(length) < length - padding
        out[2] = sequence[1:]
        return out

    def _split(self, part: np.ndarray) -> tuple[list[list[int]], str]:
        """A part as its prefix, middle and suffix token lists and its order (``PSM``, ``SPM``, or ``AR``: left as it is,
        held as its suffix so that shortening takes from its end)."""
        if not self._rng.binomial(1, self._fim_rate):
            return [[], [], part.tolist()], "AR"
        text = self._tokenizer.decode(part.tolist(), skip_special_tokens=False)
        cuts = sorted(self._rng.randint(low=0, high=len(text) + 1, size=2).tolist())
        pieces = [self._tokenizer.encode(piece).ids for piece in (text[: cuts[0]], text[cuts[0] : cuts[1]], text[cuts[1] :])]
        return pieces, "SPM" if self._rng.binomial(1, self._spm_rate) else "PSM"

    def _lay_out(self, pieces: list[list[int]], order: str) -> np.ndarray:
        t = self._tokens
        prefix, middle, suffix = pieces
        if order == "PSM":
            ids = [t.prefix, *prefix, t.suffix, *suffix, t.middle, *middle, t.eos]
        elif order == "SPM":
            ids = [t.prefix, t.suffix, *suffix, t.middle, *prefix, *middle, t.eos]
        else:
            ids = [*prefix, *middle, *suffix, t.eos]
        return np.asarray(ids, np.int64)


def _shorten(parts: list[list[list[int]]], excess: int) -> None:
    """Remove ``excess`` tokens, one per turn from each part in turn: from the end of its suffix, then from the start of
    its prefix, then from the start of its middle; a part whose current piece is empty moves to the next piece instead
    of giving a token that turn."""
    piece = [_SUFFIX] * len(parts)
    i = 0
    while excess:
        tokens = parts[i][piece[i]]
        if tokens:
            tokens.pop(-1 if piece[i] == _SUFFIX else 0)
            excess -= 1
        else:
            piece[i] = (piece[i] + 1) % 3
        i = (i + 1) % len(parts)
