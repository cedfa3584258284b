"""Exporting a cache to the HDF5 sample files Cerebras trains from, as its ``create_hdf5_dataset.py`` writes them.

Each ``.h5`` file holds a dataset ``data`` of shape ``[n, 3, max_seq_length]`` and a file attribute ``n_examples``
(``n``). Row 0 of a sample is its input ids, row 1 its loss mask, row 2 its labels: the token that follows each input
position. A sample takes ``max_seq_length + 1`` tokens of the source (fewer when padded). ``data_params.json`` beside
the files records the options and statistics, in Cerebras's sections.

The cache is already tokenized, so Cerebras's text options (ftfy, jsonl keys, tokenizer files) have no counterpart here.
Of its modes, the two that apply to tokens already made:

* LMData (``mode="lm"``): every token is trained on; documents are packed into one stream cut into samples, or each
  document is cut on its own;
* Summarization (``mode="summarization"``): one document (prompt and completion, as a supervised format stored it) per
  sample, trained on exactly the tokens of its loss spans.

The export streams: the cache is read ``batch_tokens`` at a time, each file is written under a hidden ``.partial`` name
and renamed once complete, and ``data_params.json`` is written last, so a directory with it holds a finished export.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO, Literal

import h5py
import numpy as np
from tqdm.auto import tqdm

from tokenmix._safe_files import create_new, refuse_unsafe
from tokenmix.export.streaming import TokenSource, atomic_files, partial_name, span_mask

logger = logging.getLogger(__name__)

DATA_PARAMS = "data_params.json"
"""The file of options and statistics beside the samples; present only once the export has finished."""

MODES = {"lm": "LMData", "summarization": "Summarization"}
"""This module's mode names and Cerebras's."""

_COMPRESSIONS = (None, "gzip")


@dataclass(frozen=True)
class Hdf5ExportOptions:
    """How a cache becomes Cerebras HDF5 samples, with the option names of Cerebras's ``create_hdf5_dataset.py``.

    Every field is a Cerebras option except the two marked as this exporter's own.

    The three rows of a sample share one HDF5 dataset, so the file stores all of them as ``input_ids_dtype``; when
    ``input_mask_dtype`` differs, both are recorded in ``data_params.json`` (its mask row holds only 0 and 1, which
    every integer dtype represents exactly).
    """

    mode: Literal["lm", "summarization"] = "lm"
    """``lm`` (Cerebras's LMData: every token trained on) or ``summarization`` (one document per sample, trained only on
    its loss spans; needs a cache that stores them, such as one of the supervised format)."""
    max_seq_length: int = 2048
    """Positions per sample, at least 2. A full sample takes ``max_seq_length + 1`` tokens: its inputs are all but the
    last, its labels all but the first."""
    pack_sequences: bool = True
    """``lm``: true concatenates the documents (each with the EOS it was stored with) into one stream and cuts it into
    samples, so only the last is padded; false cuts each document on its own and pads its last sample. Either way, as
    Cerebras cuts, each sample starts on the token the one before ends with (its last label), so no label is lost.
    Summarization never packs."""
    min_sequence_len: int = 10
    """Documents of fewer tokens are skipped and counted (``discarded_documents``). Without packing a document needs at
    least 2 tokens (one label) whatever this says."""
    short_seq_prob: float = 0.0
    """``lm``: the probability that a sample takes fewer tokens, a count drawn uniformly from ``[2, max_seq_length]``,
    and is padded after them; the tokens it leaves start the next sample, so none is lost."""
    inverted_mask: bool = False
    """False: mask 1 marks the positions trained on. True: 1 marks the positions not trained on (padding included)."""
    input_ids_dtype: str = "int32"
    """Integer numpy dtype of the input ids and labels, and of the ``data`` dataset; it must hold every token id."""
    input_mask_dtype: str = "int32"
    """Integer numpy dtype of the loss mask, recorded for readers; stored as ``input_ids_dtype`` (see the class)."""
    pad_id: int | None = None
    """Id written at padded positions of input ids and labels; None takes the cache's EOS id, or 0 without one."""
    output_name: str = "examples"
    """Prefix of the file names: ``{output_name}_{i:05d}.h5``."""
    files_per_record: int = 50000
    """Samples per file; the last file holds the rest."""
    write_remainder: bool = True
    """``lm`` with packing: write the stream's final, partial sample (padded); false drops it, its labels counted as
    ``remainder_tokens_dropped``."""
    seed: int = 0
    """Seed of the numpy generator behind ``short_seq_prob``: the same seed gives the same files."""
    compression: Literal["gzip"] | None = "gzip"
    """This exporter's own: the HDF5 filter of ``data``, ``gzip`` (built into every HDF5 library) or None (larger files,
    faster export)."""
    batch_tokens: int = 1 << 20
    """This exporter's own: source tokens handled at once, which bounds memory (about 45 bytes each, some 50 MiB by
    default); at least one sample's worth. The files do not depend on it."""

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            _refuse("mode", self.mode, f"use one of {sorted(MODES)}")
        for name, least in (("max_seq_length", 2), ("min_sequence_len", 0), ("files_per_record", 1), ("seed", 0)):
            value = getattr(self, name)
            if not _is_int(value) or value < least:
                _refuse(name, value, f"give a whole number of at least {least}")
        for name in ("pack_sequences", "inverted_mask", "write_remainder"):
            if not isinstance(getattr(self, name), bool):
                _refuse(name, getattr(self, name), "give true or false")
        if not isinstance(self.short_seq_prob, int | float) or isinstance(self.short_seq_prob, bool) or not 0.0 <= self.short_seq_prob <= 1.0:
            _refuse("short_seq_prob", self.short_seq_prob, "give a probability in [0, 1]")
        if self.mode == "summarization" and self.short_seq_prob:
            _refuse("short_seq_prob", self.short_seq_prob, "summarization keeps each document whole in one sample; leave it at 0")
        for name in ("input_ids_dtype", "input_mask_dtype"):
            _integer_dtype(name, getattr(self, name))
        if self.pad_id is not None and (not _is_int(self.pad_id) or self.pad_id < 0):
            _refuse("pad_id", self.pad_id, "give a token id (a whole number, 0 or more) or None for the cache's EOS id")
        if not isinstance(self.output_name, str) or not self.output_name or self.output_name.startswith(".") or re.search(r"[/\\]", self.output_name):
            _refuse("output_name", self.output_name, "give a plain file name prefix (not empty, no path separator, not starting with a dot)")
        if self.compression not in _COMPRESSIONS:
            _refuse("compression", self.compression, f"use one of {list(_COMPRESSIONS)}")
        if not _is_int(self.batch_tokens) or self.batch_tokens < self.max_seq_length + 1:
            _refuse("batch_tokens", self.batch_tokens, f"give at least one sample's tokens, max_seq_length + 1 = {self.max_seq_length + 1}")

    @property
    def data_dtype(self) -> np.dtype:
        """The dtype of the ``data`` dataset (all three rows)."""
        return np.dtype(self.input_ids_dtype)


def export_hdf5(cache: TokenSource, output_dir: str, options: Hdf5ExportOptions, progress: bool = True) -> dict[str, Any]:
    """Write the documents of ``cache`` into ``output_dir`` as Cerebras HDF5 samples; returns the statistics that
    ``data_params.json`` records under ``h5_dataset_stats``.

    Exports the rows committed when it starts. A directory holding a finished export (its ``data_params.json``) is
    refused; the files of this ``output_name`` that an interrupted export left are removed first. On an error, the file
    being written is removed and ``data_params.json`` is not written, so what remains reads as unfinished.
    """
    pad_id = _check_source(cache, options)
    os.makedirs(output_dir, exist_ok=True)
    _clear_unfinished(output_dir, options.output_name)
    export = _Export(cache, options, pad_id)
    total = export.stream_end - export.stream_start
    logger.info("exporting %d documents (%d tokens) of %s to %s as Cerebras %s samples of %d positions", export.rows, total,
                cache.location, output_dir, MODES[options.mode], options.max_seq_length)
    files = _SampleFiles(output_dir, options)
    rough = export.rows if options.mode == "summarization" else -(-total // options.max_seq_length)
    try:
        with tqdm(total=rough, desc=f"hdf5 {options.output_name}", unit="sample", disable=not progress, dynamic_ncols=True, mininterval=0.5) as bar:
            for samples in export.samples():
                files.write(samples)
                bar.update(len(samples))
                done = export.position - export.stream_start
                if done > 0:  # samples so far, scaled to the whole stream: an ETA that holds for any mode
                    bar.total = max(bar.n, round(bar.n * total / done))
        files.close()
    except BaseException:
        files.abort()
        raise
    stats = export.statistics(files.complete)
    with atomic_files(os.path.join(output_dir, DATA_PARAMS)) as (params,):
        params.write(json.dumps(_data_params(cache, output_dir, options, pad_id, export.rows, stats), indent=2).encode())
    logger.info("wrote %d samples into %d files in %s from %d documents (%d too short to export, %d truncated, %d left with nothing "
                "to train on)", stats["n_examples"], stats["n_files"], output_dir, stats["processed_documents"], stats["discarded_documents"],
                stats["truncated_documents"], stats["no_loss_documents"])
    return stats


def read_hdf5_samples(output_dir: str) -> Iterator[np.ndarray]:
    """Each file of the finished export in ``output_dir``, in file order, as its ``[n, 3, max_seq_length]`` array.

    Raises ``FileNotFoundError`` at once where no export finished (no ``data_params.json``)."""
    params_path = os.path.join(output_dir, DATA_PARAMS)
    if not os.path.exists(params_path):
        raise FileNotFoundError(f"{output_dir}: no finished HDF5 export (no {DATA_PARAMS}); export into it with export_hdf5 first")
    with open(params_path) as f:
        params = json.load(f)
    paths = [os.path.join(output_dir, _file_name(params["processing"]["output_name"], i)) for i in range(params["h5_dataset_stats"]["n_files"])]
    return _read_files(paths)


def _read_files(paths: list[str]) -> Iterator[np.ndarray]:
    for path in paths:
        with h5py.File(path, "r") as h5:
            data = h5["data"][()]
            if int(h5.attrs["n_examples"]) != len(data):
                raise ValueError(f"{path}: n_examples is {int(h5.attrs['n_examples'])} but data holds {len(data)} samples")
        yield data


class _Export:
    """One export's walk over the cache: where the pieces of the stream that become samples lie, their samples, and
    the counts for the statistics."""

    def __init__(self, cache: TokenSource, options: Hdf5ExportOptions, pad_id: int):
        self.cache = cache
        self.options = options
        self.msl = options.max_seq_length
        self.pad = np.asarray(pad_id, options.data_dtype)
        self.lengths = _PieceLengths(options.max_seq_length, options.short_seq_prob, options.seed)
        self.rows = cache.num_rows()
        self.stream_start = int(cache.row_bounds(0, 1)[0]) if self.rows else 0
        self.stream_end = int(cache.row_bounds(self.rows - 1, self.rows)[-1]) if self.rows else 0
        self.position = self.stream_start
        """How far into the token stream the samples handed out reach (for the progress bar)."""
        self.window_rows = max(1, options.batch_tokens // 16)
        """Rows whose bounds are read at once (8 bytes each: half a byte per token of a batch)."""
        self.batch_samples = max(1, options.batch_tokens // options.max_seq_length)
        self.counts = dict.fromkeys(("num_sequences", "non_pad_tokens", "loss_valid_tokens", "processed_documents", "discarded_documents",
                                     "truncated_documents", "no_loss_documents", "remainder_tokens_dropped"), 0)

    def samples(self) -> Iterator[np.ndarray]:
        """Batches of ``[k, 3, max_seq_length]`` samples, in order."""
        if self.options.mode == "summarization":
            return self._summarization()
        return self._packed() if self.options.pack_sequences else self._unpacked()

    def statistics(self, n_files: int) -> dict[str, Any]:
        """Cerebras's ``h5_dataset_stats`` and the export's own counts.

        ``num_sequences`` (= ``n_examples``): samples written; ``num_tokens``: their positions; ``non_pad_tokens``: the
        positions holding a token of the source (counted by position, so an EOS whose id is the pad id counts);
        ``num_pad_tokens``: the others; ``loss_valid_tokens``: the positions trained on; ``num_masked_tokens``: the others;
        ``source_documents``, ``source_tokens``: what the cache held; ``processed_documents``: the documents exported;
        ``discarded_documents``: those skipped as shorter than ``min_sequence_len``; ``truncated_documents``
        (summarization): those cut at ``max_seq_length + 1`` tokens; ``no_loss_documents`` (summarization): those
        skipped because truncation left no token to train on; ``remainder_tokens_dropped``: labels of the final partial
        sample not written (``write_remainder`` false); ``n_files``."""
        counts = self.counts
        n = counts["num_sequences"]
        return {
            "num_sequences": n,
            "n_examples": n,
            "num_tokens": n * self.msl,
            "non_pad_tokens": counts["non_pad_tokens"],
            "num_pad_tokens": n * self.msl - counts["non_pad_tokens"],
            "loss_valid_tokens": counts["loss_valid_tokens"],
            "num_masked_tokens": n * self.msl - counts["loss_valid_tokens"],
            "source_documents": self.rows,
            "source_tokens": self.stream_end - self.stream_start,
            "processed_documents": counts["processed_documents"],
            "discarded_documents": counts["discarded_documents"],
            "truncated_documents": counts["truncated_documents"],
            "no_loss_documents": counts["no_loss_documents"],
            "remainder_tokens_dropped": counts["remainder_tokens_dropped"],
            "n_files": n_files,
        }

    def _windows(self) -> Iterator[tuple[int, np.ndarray]]:
        """Each window of rows: its first row and its ``rows + 1`` token bounds."""
        for start in range(0, self.rows, self.window_rows):
            yield start, self.cache.row_bounds(start, min(start + self.window_rows, self.rows))

    def _long_enough(self, sizes: np.ndarray, least: int) -> np.ndarray:
        """Which documents have at least ``least`` tokens; the others are counted as discarded."""
        keep = sizes >= least
        self.counts["discarded_documents"] += int(len(keep) - keep.sum())
        return keep

    def _packed(self) -> Iterator[np.ndarray]:
        """The kept documents as one stream, cut whatever the document boundaries into pieces that overlap by one
        token (as Cerebras cuts it: a piece starts on the token the one before ends with, so no label is lost)."""
        carry = np.empty(0, self.cache.dtype)
        for _, bounds in self._windows():
            keep = self._long_enough(np.diff(bounds), self.options.min_sequence_len)
            self.counts["processed_documents"] += int(keep.sum())
            for begin in range(int(bounds[0]), int(bounds[-1]), self.options.batch_tokens):
                end = min(begin + self.options.batch_tokens, int(bounds[-1]))
                stream = np.concatenate([carry, self._kept_tokens(bounds, keep, begin, end)])
                lengths = self.lengths.fitting(len(stream))
                advance = lengths - 1
                self.position = end
                yield from self._emit(stream, np.cumsum(advance) - advance, lengths)
                carry = stream[int(advance.sum()):]
        if self.options.write_remainder and len(carry) >= 2:
            yield from self._emit(carry, np.zeros(1, np.int64), np.array([len(carry)]))
        else:  # the first token left was the last label written
            self.counts["remainder_tokens_dropped"] = max(len(carry) - 1, 0)

    def _kept_tokens(self, bounds: np.ndarray, keep: np.ndarray, begin: int, end: int) -> np.ndarray:
        """The tokens in ``[begin, end)`` of the stream that belong to kept rows (``keep``, per row of ``bounds``)."""
        first = int(np.searchsorted(bounds, begin, side="right")) - 1
        last = int(np.searchsorted(bounds, end, side="left"))
        kept = keep[first:last]
        if not kept.any():
            return np.empty(0, self.cache.dtype)
        tokens = np.asarray(self.cache.read_tokens(begin, end))
        if kept.all():
            return tokens
        inside = np.minimum(bounds[first + 1 : last + 1], end) - np.maximum(bounds[first:last], begin)
        return tokens[np.repeat(kept, inside)]

    def _unpacked(self) -> Iterator[np.ndarray]:
        """Each kept document cut on its own into pieces that overlap by one token."""
        for _, bounds in self._windows():
            sizes = np.diff(bounds)
            keep = self._long_enough(sizes, max(self.options.min_sequence_len, 2))
            self.counts["processed_documents"] += int(keep.sum())
            steps = sizes[keep] - 1
            counts, drawn = self.lengths.cover(steps)
            document = np.repeat(np.arange(len(steps)), counts)
            advance = drawn - 1
            before = np.cumsum(advance) - advance
            offset = before - before[np.cumsum(counts) - counts][document]
            lengths = np.minimum(advance, steps[document] - offset) + 1
            yield from self._read_pieces(bounds[:-1][keep][document] + offset, lengths)

    def _summarization(self) -> Iterator[np.ndarray]:
        """One piece per kept document: its first ``max_seq_length + 1`` tokens, trained where its loss spans say."""
        least = max(self.options.min_sequence_len, 2)
        for start, bounds in self._windows():
            sizes = np.diff(bounds)
            lengths = np.minimum(sizes, self.msl + 1)
            rows, begins, ends = self.cache.loss_spans(start, start + len(sizes))
            row = rows - start
            trained_labels = np.bincount(row, np.maximum(np.minimum(ends, lengths[row]) - np.maximum(begins, 1), 0), len(sizes))
            keep = self._long_enough(sizes, least)
            no_loss = keep & (trained_labels == 0)  # truncation cut off every trained token: nothing to learn from
            keep &= ~no_loss
            self.counts["no_loss_documents"] += int(no_loss.sum())
            self.counts["processed_documents"] += int(keep.sum())
            self.counts["truncated_documents"] += int((keep & (sizes > self.msl + 1)).sum())
            trained = functools.partial(_trained_between, bounds[row] + begins, bounds[row] + ends)
            yield from self._read_pieces(bounds[:-1][keep], lengths[keep], trained)

    def _read_pieces(self, starts: np.ndarray, lengths: np.ndarray, trained: Callable[[int, int], np.ndarray] | None = None) -> Iterator[np.ndarray]:
        """The samples of the stream's pieces ``[starts, starts + lengths)`` (in stream order), reading at most
        ``batch_tokens`` at once (one piece, at most ``max_seq_length + 1`` tokens, when a piece alone spans more)."""
        ends = starts + lengths
        i = 0
        while i < len(starts):
            begin = int(starts[i])
            j = max(i + 1, int(np.searchsorted(ends, begin + self.options.batch_tokens, side="right")))
            end = int(ends[j - 1])
            tokens = np.asarray(self.cache.read_tokens(begin, end))
            self.position = end
            yield from self._emit(tokens, starts[i:j] - begin, lengths[i:j], None if trained is None else trained(begin, end))
            i = j

    def _emit(self, tokens: np.ndarray, starts: np.ndarray, lengths: np.ndarray, trained: np.ndarray | None = None) -> Iterator[np.ndarray]:
        """The samples of the pieces ``[starts, starts + lengths)`` of ``tokens``, ``batch_samples`` at a time."""
        for i in range(0, len(starts), self.batch_samples):
            yield self._assemble(tokens, starts[i : i + self.batch_samples], lengths[i : i + self.batch_samples], trained)

    def _assemble(self, tokens: np.ndarray, starts: np.ndarray, lengths: np.ndarray, trained: np.ndarray | None) -> np.ndarray:
        """``[k, 3, max_seq_length]``: per piece its inputs (all tokens but the last), mask and labels (all but the
        first), padded. Trained positions are the real ones, or with ``trained`` (per token of ``tokens``) those
        whose label is trained on."""
        positions = np.arange(self.msl)
        real = positions < (lengths - 1)[:, None]
        at = starts[:, None] + positions
        mask = real if trained is None else real & trained.take(at + 1, mode="clip")
        samples = np.empty((len(starts), 3, self.msl), self.options.data_dtype)
        samples[:, 0] = np.where(real, tokens.take(at, mode="clip"), self.pad)
        samples[:, 1] = mask != self.options.inverted_mask
        samples[:, 2] = np.where(real, tokens.take(at + 1, mode="clip"), self.pad)
        self.counts["num_sequences"] += len(starts)
        self.counts["non_pad_tokens"] += int((lengths - 1).sum())
        self.counts["loss_valid_tokens"] += int(mask.sum())
        return samples


class _PieceLengths:
    """Tokens each sample takes, in sample order: ``max_seq_length + 1``, or with probability ``short_seq_prob`` a count
    drawn uniformly from ``[2, max_seq_length]``. Drawn in fixed blocks from one generator, so the sequence depends on
    the seed alone, never on how the export is batched."""

    _BLOCK = 8192

    def __init__(self, max_seq_length: int, short_seq_prob: float, seed: int):
        self._full = max_seq_length + 1
        self._prob = short_seq_prob
        self._rng = np.random.default_rng(seed)
        self._ahead = np.empty(0, np.int64)

    def _peek(self, n: int) -> np.ndarray:
        """The next ``n`` lengths, left in place."""
        if not self._prob:
            return np.full(n, self._full, np.int64)
        while len(self._ahead) < n:
            short = self._rng.random(self._BLOCK) < self._prob
            drawn = self._rng.integers(2, self._full, self._BLOCK)
            self._ahead = np.concatenate([self._ahead, np.where(short, drawn, self._full)])
        return self._ahead[:n]

    def _take(self, n: int) -> np.ndarray:
        taken = self._peek(n)
        self._ahead = self._ahead[n:]
        return taken

    def fitting(self, tokens: int) -> np.ndarray:
        """The next lengths of pieces that fit in ``tokens``, each piece starting on the last token of the one before
        (a piece of ``m`` tokens advances ``m - 1``); taken."""
        n = tokens // (self._full - 1) + 1
        while True:
            reach = np.cumsum(self._peek(n) - 1)
            if reach[-1] >= tokens:
                return self._take(int(np.searchsorted(reach, tokens - 1, side="right")))
            n *= 2

    def cover(self, steps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For documents of ``steps + 1`` tokens cut into pieces that overlap by one token (a piece of ``m`` tokens
        advances ``m - 1``): how many of the next lengths each document takes, and those lengths, taken (a document's
        last piece is cut short where the document ends)."""
        if not self._prob:
            counts = -(-steps // (self._full - 1))
            return counts, np.full(int(counts.sum()), self._full, np.int64)
        counts = np.empty(len(steps), np.int64)
        reach = np.cumsum(self._peek(len(steps) + 16) - 1)
        taken = base = 0
        for document, need in enumerate(steps.tolist()):  # where a document ends depends on where the one before did
            while reach[-1] < base + need:
                reach = np.cumsum(self._peek(2 * len(reach)) - 1)
            last = int(np.searchsorted(reach, base + need))
            counts[document] = last + 1 - taken
            taken, base = last + 1, int(reach[last])
        return counts, self._take(taken)


class _SampleFiles:
    """Samples written into ``{output_name}_{i:05d}.h5`` files of ``files_per_record`` samples; each is written under
    its ``.partial`` name and renamed once complete."""

    def __init__(self, output_dir: str, options: Hdf5ExportOptions):
        self._dir = output_dir
        self._options = options
        self.complete = 0
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
            self._held += take
            samples = samples[take:]
            if self._held == per_file:
                self._finish()

    def close(self) -> None:
        """Finish the last file."""
        if self._h5 is not None:
            self._finish()

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


def _check_source(cache: TokenSource, options: Hdf5ExportOptions) -> int:
    """Refuse a cache the options cannot export; returns the pad id."""
    identity = cache.identity
    if options.mode == "summarization" and not cache.has_loss_spans:
        raise ValueError(
            f"{cache.location}: mode 'summarization' trains on each document's loss spans, and this cache (format "
            f"{_source_format(identity)!r}) stores none; export it with mode='lm', or build the cache with a format "
            f"that marks what to train on (such as format: {{type: supervised}})"
        )
    if options.mode == "lm" and cache.has_loss_spans:
        logger.warning("%s stores loss spans, which mode 'lm' ignores (it trains on every token, prompts included); "
                       "mode='summarization' keeps them", cache.location)
    limits = np.iinfo(options.data_dtype)
    vocab_size = identity.get("vocab_size")
    highest = vocab_size - 1 if vocab_size else int(np.iinfo(cache.dtype).max)
    if highest > limits.max:
        source = f"its vocabulary of {vocab_size}" if vocab_size else f"its dtype {cache.dtype}, its vocabulary size unknown"
        raise ValueError(f"input_ids_dtype {options.input_ids_dtype} holds ids up to {limits.max}, but {cache.location} may hold ids up "
                         f"to {highest} ({source}); choose a wider dtype such as int32")
    eos_id = identity.get("eos_id")
    pad_id = options.pad_id if options.pad_id is not None else (eos_id if eos_id is not None else 0)
    if pad_id > limits.max:
        raise ValueError(f"pad_id {pad_id} does not fit input_ids_dtype {options.input_ids_dtype} (at most {limits.max}); "
                         f"give a smaller pad_id or a wider dtype")
    return int(pad_id)


def _clear_unfinished(output_dir: str, output_name: str) -> None:
    """Refuse a finished export; remove what an interrupted one of this ``output_name`` left."""
    if os.path.exists(os.path.join(output_dir, DATA_PARAMS)):
        raise FileExistsError(f"{output_dir} holds a finished HDF5 export ({DATA_PARAMS}); remove it or export into another directory")
    name, params = re.escape(output_name), re.escape(DATA_PARAMS)
    ours = re.compile(rf"{name}_\d{{5}}\.h5|\.{name}_\d{{5}}\.h5\.partial|\.{params}\.partial")
    left = sorted(f for f in os.listdir(output_dir) if ours.fullmatch(f))
    for f in left:
        refuse_unsafe(os.path.join(output_dir, f), "file of an unfinished export")  # never an export's: a link planted there
    if left:
        logger.warning("%s: removing %d files an unfinished export left (%s ...)", output_dir, len(left), left[0])
        for f in left:
            os.remove(os.path.join(output_dir, f))


def _data_params(cache: TokenSource, output_dir: str, options: Hdf5ExportOptions, pad_id: int, rows: int, stats: dict[str, Any]) -> dict[str, Any]:
    identity = cache.identity
    dataset: dict[str, Any] = {"min_sequence_len": options.min_sequence_len}
    if options.mode == "lm":
        dataset["pack_sequences"] = options.pack_sequences
    return {
        "setup": {
            "mode": MODES[options.mode],
            "source_cache": cache.location,
            "source_format": _source_format(identity),
            "source_rows": rows,
            "output_dir": os.path.abspath(output_dir),
            "exported_by": __name__,
        },
        "processing": {
            "max_seq_length": options.max_seq_length,
            "short_seq_prob": options.short_seq_prob,
            "output_name": options.output_name,
            "files_per_record": options.files_per_record,
            "write_remainder": options.write_remainder,
            "seed": options.seed,
            "input_ids_dtype": np.dtype(options.input_ids_dtype).name,
            "input_mask_dtype": np.dtype(options.input_mask_dtype).name,
            "data_dtype": options.data_dtype.name,
            "inverted_mask": options.inverted_mask,
            "pad_id": pad_id,
            "eos_id": identity.get("eos_id"),
            "bos_id": identity.get("bos_id"),
            "vocab_size": identity.get("vocab_size"),
            "compression": options.compression,
        },
        "dataset": dataset,
        "h5_dataset_stats": stats,
    }


def _trained_between(span_begins: np.ndarray, span_ends: np.ndarray, begin: int, end: int) -> np.ndarray:
    """Per token of ``[begin, end)`` of the stream, whether it lies in one of the spans (sorted, disjoint, in stream
    positions)."""
    lo, hi = np.searchsorted(span_ends, begin, side="right"), np.searchsorted(span_begins, end, side="left")
    return span_mask(np.clip(span_begins[lo:hi], begin, end) - begin, np.clip(span_ends[lo:hi], begin, end) - begin, end - begin)


def _source_format(identity: dict[str, Any]) -> str | None:
    """The cache's format type, or for token files read in place their kind (``megatron``, ``datatrove``, ...)."""
    return (identity.get("format") or {}).get("type") or identity.get("token_files")


def _file_name(output_name: str, index: int) -> str:
    return f"{output_name}_{index:05d}.h5"


def _is_int(value: Any) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool)


def _integer_dtype(field: str, value: Any) -> None:
    try:
        dtype = np.dtype(value)
    except TypeError:
        dtype = None
    if dtype is None or dtype.kind not in "iu":
        _refuse(field, value, "give an integer numpy dtype such as int32, int16 or uint16")


def _refuse(field: str, value: Any, fix: str) -> None:
    raise ValueError(f"Hdf5ExportOptions.{field} is {value!r}: {fix}")
