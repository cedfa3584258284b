"""How a heuristic filter turns a batch's counts into its scores, and checks its thresholds.

Where NeMo divides by zero (a text without words or lines), the score is the one that removes the document, as NeMo's
own convention for empty texts does: 1.0 for a ratio that must stay low, 0.0 for one that must stay high.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from tokenmix.curate.heuristics.analyses import profile


def finish(values: np.ndarray, texts: pa.Array | pa.ChunkedArray) -> pa.Array:
    """Scores as an Arrow array, null where the text is null."""
    return pa.array(values, mask=np.asarray(texts.is_null(), dtype=bool) if texts.null_count else None)


def divide(numerator: np.ndarray, denominator: np.ndarray, empty: float) -> np.ndarray:
    """``numerator / denominator``, and ``empty`` where the denominator is 0."""
    out = np.full(len(denominator), empty, dtype=np.float64)
    np.divide(numerator, denominator, out=out, where=denominator > 0)
    return out


def ratio(texts: pa.Array, counted: str | np.ndarray, total: str, empty: float) -> pa.Array:
    """Each text's ``counted`` (a profile field, or counts) over its ``total``; ``empty`` where the total is 0."""
    counts = profile(texts)
    numerator = counts[counted] if isinstance(counted, str) else counted
    return finish(divide(numerator, counts[total], empty), texts)


def check_share(field: str, value: float) -> None:
    """A threshold that is a share: between 0 and 1."""
    if not 0 <= value <= 1:
        raise ValueError(f"filter.{field} must be between 0 and 1, got {value}")


def check_at_least(field: str, value: float, low: float) -> None:
    """A threshold that is a count or a length: at least ``low``."""
    if value < low:
        raise ValueError(f"filter.{field} must be >= {low}, got {value}")
