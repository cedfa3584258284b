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

This module checks the cache against the options, runs the export and records ``data_params.json``; the options and
their checks are in ``hdf5_options.py``, the cutting of the stream into samples (and its counts) in ``hdf5_samples.py``,
and the writing of the ``.h5`` files (and reading them back) in ``hdf5_files.py``.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from tokenmix.export.hdf5_files import SampleFiles, clear_unfinished
from tokenmix.export.hdf5_options import MODES, Hdf5ExportOptions
from tokenmix.export.hdf5_samples import SampleCutter
from tokenmix.export.streaming import TokenSource, atomic_files
from tokenmix.sources.cerebras_hdf5 import DATA_PARAMS

logger = logging.getLogger(__name__)


def export_hdf5(cache: TokenSource, output_dir: str, options: Hdf5ExportOptions, progress: bool = True) -> dict[str, Any]:
    """Write the documents of ``cache`` into ``output_dir`` as Cerebras HDF5 samples; returns the statistics that
    ``data_params.json`` records under ``h5_dataset_stats``.

    Exports the rows committed when it starts. A directory holding a finished export (its ``data_params.json``) is
    refused; the files of this ``output_name`` that an interrupted export left are removed first. On an error, the file
    being written is removed and ``data_params.json`` is not written, so what remains reads as unfinished.
    """
    pad_id = _check_source(cache, options)
    os.makedirs(output_dir, exist_ok=True)
    clear_unfinished(output_dir, options.output_name)
    cutter = SampleCutter(cache, options, pad_id)
    total = cutter.stream_end - cutter.stream_start
    logger.info("exporting %d documents (%d tokens) of %s to %s as Cerebras %s samples of %d positions", cutter.rows, total,
                cache.location, output_dir, MODES[options.mode], options.max_seq_length)
    files = SampleFiles(output_dir, options)
    rough = cutter.rows if options.mode == "summarization" else -(-total // options.max_seq_length)
    try:
        with tqdm(total=rough, desc=f"hdf5 {options.output_name}", unit="sample", disable=not progress, dynamic_ncols=True, mininterval=0.5) as bar:
            for samples in cutter.samples():
                files.write(samples)
                bar.update(len(samples))
                done = cutter.position - cutter.stream_start
                if done > 0:  # samples so far, scaled to the whole stream: an ETA that holds for any mode
                    bar.total = max(bar.n, round(bar.n * total / done))
        files.close()
    except BaseException:
        files.abort()
        raise
    stats = cutter.statistics(files.complete)
    with atomic_files(os.path.join(output_dir, DATA_PARAMS)) as (params,):
        params.write(json.dumps(_data_params(cache, output_dir, options, pad_id, cutter.rows, stats), indent=2).encode())
    logger.info("wrote %d samples into %d files in %s from %d documents (%d too short to export, %d truncated, %d left with nothing "
                "to train on)", stats["n_examples"], stats["n_files"], output_dir, stats["processed_documents"], stats["discarded_documents"],
                stats["truncated_documents"], stats["no_loss_documents"])
    return stats


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


def _data_params(cache: TokenSource, output_dir: str, options: Hdf5ExportOptions, pad_id: int, rows: int, stats: dict[str, Any]) -> dict[str, Any]:
    """What ``data_params.json`` holds, in Cerebras's sections: ``setup``, ``processing``, ``dataset``, ``h5_dataset_stats``."""
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


def _source_format(identity: dict[str, Any]) -> str | None:
    """The cache's format type, or for token files read in place their kind (``megatron``, ``datatrove``, ...)."""
    return (identity.get("format") or {}).get("type") or identity.get("token_files")
