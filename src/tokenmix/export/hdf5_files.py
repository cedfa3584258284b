"""The files of a Cerebras HDF5 export: ``{output_name}_{i}_0.h5`` files of ``files_per_record`` samples (named as
Cerebras's single process names them), each written under a hidden ``.partial`` name (created without following a link)
and renamed once complete; what an unfinished export left, removed before another starts; and a finished export's files
read back.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Iterator
from typing import BinaryIO

import h5py
import numpy as np

from tokenmix._safe_files import create_new, refuse_unsafe
from tokenmix.export.hdf5_options import Hdf5ExportOptions
from tokenmix.export.hdf5_statistics import SampleStatistics
from tokenmix.export.streaming import partial_name
from tokenmix.sources.cerebras_hdf5 import DATA_PARAMS

logger = logging.getLogger(__name__)


class SampleFiles:
    """Samples written into ``{output_name}_{i}_0.h5`` files of ``files_per_record`` samples; each is written under its
    ``.partial`` name and renamed once complete. ``statistics`` counts the samples of the complete files only, as
    Cerebras counts them from the files it wrote."""

    def __init__(self, output_dir: str, options: Hdf5ExportOptions, statistics: SampleStatistics):
        self._dir = output_dir
        self._options = options
        self.statistics = statistics
        self._pending = statistics.empty()
        """The statistics of the file being written."""
        self.complete = 0
        self.written = 0
        """Samples in the complete files."""
        self.remainder_dropped = 0
        """Samples of a last, partial file not written (``write_remainder`` false)."""
        self._h5: h5py.File | None = None
        self._file: BinaryIO | None = None
        """The partial file ``_h5`` writes into, created without following a link."""
        self._held = 0

    def write(self, samples: np.ndarray) -> None:
        per_file = self._options.files_per_record
        while len(samples):
            if self._h5 is None:
                self._open()
            data = self._h5["data"]
            take = min(len(samples), per_file - self._held)
            data.resize(self._held + take, axis=0)
            data[self._held : self._held + take] = samples[:take]
            self._pending.add(samples[:take])
            self._held += take
            samples = samples[take:]
            if self._held == per_file:
                self._finish()

    def close(self) -> None:
        """Finish the last file, or with ``write_remainder`` false drop it (it holds fewer than ``files_per_record``)."""
        if self._h5 is None:
            return
        if self._options.write_remainder:
            self._finish()
        else:
            self.remainder_dropped = self._held
            self.abort()

    def abort(self) -> None:
        """Drop the file being written."""
        if self._h5 is not None:
            self._close()
            os.remove(self._partial)

    @property
    def _path(self) -> str:
        return os.path.join(self._dir, _file_name(self._options.output_name, self.complete))

    @property
    def _partial(self) -> str:
        return partial_name(self._path)

    def _close(self, sync: bool = False) -> None:
        """Close the file being written; ``sync`` puts its bytes on disk first (before it is renamed into place)."""
        self._h5.close()  # type: ignore[union-attr]
        if sync:
            self._file.flush()  # type: ignore[union-attr]
            os.fsync(self._file.fileno())  # type: ignore[union-attr]
        self._file.close()  # type: ignore[union-attr]
        self._h5 = self._file = None

    def _open(self) -> None:
        msl = self._options.max_seq_length
        self._file = create_new(self._partial, "partial export file")
        self._h5 = h5py.File(self._file, "w")
        # one sample per chunk: a reader takes any sample without decompressing its neighbours
        self._h5.create_dataset("data", shape=(0, 3, msl), maxshape=(self._options.files_per_record, 3, msl), chunks=(1, 3, msl),
                                dtype=self._options.data_dtype, compression=self._options.compression, track_times=False)
        self._held = 0

    def _finish(self) -> None:
        assert self._h5 is not None
        self._h5.attrs["n_examples"] = self._held
        self._close(sync=True)
        os.replace(self._partial, self._path)
        self.complete += 1
        self.written += self._held
        self.statistics.merge(self._pending)
        self._pending = self.statistics.empty()


def clear_unfinished(output_dir: str, output_name: str) -> None:
    """Refuse a finished export; remove the samples an interrupted one of this ``output_name`` left (its partial
    ``data_params.json`` is the running export's, which replaced a stale one when it claimed it)."""
    if os.path.exists(os.path.join(output_dir, DATA_PARAMS)):
        raise FileExistsError(f"{output_dir} holds a finished HDF5 export ({DATA_PARAMS}); remove it or export into another directory")
    name = re.escape(output_name)
    ours = re.compile(rf"{name}_\d+_0\.h5|\.{name}_\d+_0\.h5\.partial")
    left = sorted(f for f in os.listdir(output_dir) if ours.fullmatch(f))
    for f in left:
        refuse_unsafe(os.path.join(output_dir, f), "file of an unfinished export")  # never an export's: a link planted there
    if left:
        logger.warning("%s: removing %d files an unfinished export left (%s ...)", output_dir, len(left), left[0])
        for f in left:
            os.remove(os.path.join(output_dir, f))


def read_hdf5_samples(output_dir: str) -> Iterator[np.ndarray]:
    """Each file of the finished export in ``output_dir``, in file order, as its ``[n, 3, max_seq_length]`` array.

    Raises ``FileNotFoundError`` at once where no export finished (no ``data_params.json``)."""
    params_path = os.path.join(output_dir, DATA_PARAMS)
    if not os.path.exists(params_path):
        raise FileNotFoundError(f"{output_dir}: no finished HDF5 export (no {DATA_PARAMS}); export into it with export_hdf5 first")
    with open(params_path) as f:
        params = json.load(f)
    paths = [os.path.join(output_dir, _file_name(params["processing"]["output_name"], i)) for i in range(params["tokenmix"]["n_files"])]
    return _read_files(paths)


def _read_files(paths: list[str]) -> Iterator[np.ndarray]:
    for path in paths:
        with h5py.File(path, "r") as h5:
            data = h5["data"][()]
            if int(h5.attrs["n_examples"]) != len(data):
                raise ValueError(f"{path}: n_examples is {int(h5.attrs['n_examples'])} but data holds {len(data)} samples")
        yield data


def _file_name(output_name: str, index: int) -> str:
    """The name of file ``index`` of an export: ``{output_name}_{index}_0.h5``, as Cerebras's process 0 names it."""
    return f"{output_name}_{index}_0.h5"
