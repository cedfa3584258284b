"""Exporting caches to the formats other training stacks read: Megatron ``.bin/.idx``, datatrove ``.ds``, Nanoset
``.npy``, Levanter caches and Cerebras HDF5. Every export streams (memory bounded), writes under temporary names and
renames when complete, and shows progress.
"""

from typing import TYPE_CHECKING

from tokenmix._lazy import lazy_exports

if TYPE_CHECKING:
    from tokenmix.export.datatrove_tokens import export_datatrove
    from tokenmix.export.dispatch import EXPORT_KINDS, export_cache
    from tokenmix.export.hdf5 import export_hdf5
    from tokenmix.export.hdf5_files import read_hdf5_samples
    from tokenmix.export.hdf5_options import Hdf5ExportOptions
    from tokenmix.export.levanter import export_levanter
    from tokenmix.export.megatron import export_megatron
    from tokenmix.export.nanoset import export_nanoset

__all__ = [
    "EXPORT_KINDS",
    "Hdf5ExportOptions",
    "export_cache",
    "export_datatrove",
    "export_hdf5",
    "export_levanter",
    "export_megatron",
    "export_nanoset",
    "read_hdf5_samples",
]
_exports, __getattr__, __dir__ = lazy_exports(__name__, __file__)
