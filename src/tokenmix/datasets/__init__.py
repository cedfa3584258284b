"""Random-access datasets over caches: token sequences, packed documents, epochs and exact mixtures.

The index math (permutations, source orders, mixture layout, packing plans, segments) is pure numpy
and does no I/O; the datasets compose it with cache reads.
"""

from typing import TYPE_CHECKING

from tokenmix._lazy import lazy_exports

if TYPE_CHECKING:
    from tokenmix.datasets.base import Dataset, Pending, TokenBatch
    from tokenmix.datasets.epochs import EpochedDataset
    from tokenmix.datasets.mixture import MixtureDataset, SourceUsage
    from tokenmix.datasets.order import SourceOrder
    from tokenmix.datasets.packed import PackedDataset
    from tokenmix.datasets.padded import PaddedDataset
    from tokenmix.datasets.permutation import FeistelPermutation
    from tokenmix.datasets.settings import STOP_STRATEGIES
    from tokenmix.datasets.token_seq import TokenSeqDataset

__all__ = [
    "STOP_STRATEGIES",
    "Dataset",
    "EpochedDataset",
    "FeistelPermutation",
    "MixtureDataset",
    "PackedDataset",
    "PaddedDataset",
    "Pending",
    "SourceOrder",
    "SourceUsage",
    "TokenBatch",
    "TokenSeqDataset",
]
_exports, __getattr__, __dir__ = lazy_exports(__name__, __file__)
