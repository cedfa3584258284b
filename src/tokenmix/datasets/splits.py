"""Cutting a source into train / validation / test by ratio, as Megatron and Nanotron's ``split: 949,50,1`` do (pure).

Each part is a contiguous range of the source's examples (or, document-aligned, of its documents); the sizes follow
Megatron's rule: each boundary is the rounded cumulative share, and the rounding error is taken off every boundary
so that the parts add up to the whole.
"""

from __future__ import annotations

SPLIT_NAMES = ("train", "validation", "test")


def parse_split(split: str | list[float] | tuple[float, ...], where: str) -> tuple[float, ...]:
    """``"949,50,1"`` (or ``"949/50/1"``, or a list) as up to three non-negative weights, padded with zeros."""
    parts = [p for p in split.replace("/", ",").split(",")] if isinstance(split, str) else list(split)
    try:
        weights = tuple(float(p) for p in parts)
    except (TypeError, ValueError):
        raise ValueError(f"{where}: split {split!r} is not numbers; write it as Nanotron does, e.g. 949,50,1") from None
    if not 1 <= len(weights) <= 3 or any(w < 0 for w in weights) or sum(weights) <= 0:
        raise ValueError(f"{where}: split {split!r} must be one to three non-negative weights (train, validation, test) with a "
                         "positive sum, e.g. 949,50,1")
    return weights + (0.0,) * (3 - len(weights))


def split_bounds(total: int, weights: tuple[float, ...]) -> list[int]:
    """Boundaries ``[0, a, b, total]`` of the train, validation and test parts of ``total`` items (Megatron's rounding)."""
    shares = [w / sum(weights) for w in weights]
    bounds = [0]
    for share in shares:
        bounds.append(bounds[-1] + int(round(share * float(total))))
    excess = bounds[-1] - total
    return [0] + [b - excess for b in bounds[1:]]
