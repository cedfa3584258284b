"""Exporting a cache to the HDF5 sample files Cerebras trains from, as modelzoo's ``create_hdf5_dataset.py``
(Release_2.1.1, ``hdf5_preprocessing``, one process) writes them from the same documents.

Each ``.h5`` file holds a dataset ``data`` of shape ``[n, 3, max_seq_length]`` and a file attribute ``n_examples``
(``n``). Row 0 of a sample is its input ids, row 1 its loss mask, row 2 its labels: the token that follows each input
position. ``data_params.json`` beside the files holds Cerebras's sections (``setup``, ``processing``, ``dataset``,
``post-process``, ``h5_dataset_stats``, counted as Cerebras counts them) and this exporter's own (``tokenmix``: the source,
the options Cerebras lacks, the files, and what was skipped or dropped).

The cache is already tokenized, so Cerebras's text options (ftfy, jsonl keys, tokenizer files) belong to the format it
was built with. Modes: LMData (``mode="lm"``), Summarization (``mode="summarization"``: a cache whose documents are a
prompt and its completion, with loss spans, such as one of the supervised format) and FIM (``mode="fim"``: LMData
samples rearranged). The tokenizer the cache was built with decodes each sample for the statistics (and FIM's parts).

The export streams: the cache is read ``batch_tokens`` at a time, each file is written under a hidden ``.partial`` name
and renamed once complete, and ``data_params.json`` is written last, so a directory with it holds a finished export.

This module checks the cache against the options, runs the export and records ``data_params.json``; the options and
their checks are in ``hdf5_options.py``, the cutting of the stream into samples (and its counts) in ``hdf5_samples.py``,
FIM's rearrangement in ``hdf5_fim.py``, the statistics in ``hdf5_statistics.py``, and the writing of the ``.h5`` files
(and reading them back) in ``hdf5_files.py``.
"""

from __future__ import annotations

import functools
import json
import logging
import os
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from tokenmix.export.hdf5_files import SampleFiles, clear_unfinished
from tokenmix.export.hdf5_fim import FimRearranger, FimTokens
from tokenmix.export.hdf5_options import MODES, PROCESSORS, Hdf5ExportOptions
from tokenmix.export.hdf5_samples import SampleCutter
from tokenmix.export.hdf5_statistics import SampleStatistics
from tokenmix.export.streaming import TokenSource, atomic_files, local_output
from tokenmix.sources.cerebras_hdf5 import DATA_PARAMS

logger = logging.getLogger(__name__)


def export_hdf5(cache: TokenSource, output_dir: str, options: Hdf5ExportOptions, progress: bool = True,
                tokenizer: str | None = None) -> dict[str, Any]:
    """Write the documents of ``cache`` into ``output_dir`` as Cerebras HDF5 samples; returns the statistics that
    ``data_params.json`` records under ``h5_dataset_stats``.

    ``tokenizer`` (a name or path) is the one the cache was built with; None takes the one its ledger records. Exports
    the rows committed when it starts. A directory holding a finished export (its ``data_params.json``), or one another
    export is writing (its partial ``data_params.json``, locked from the start), is refused; the files of this
    ``output_name`` that an interrupted export left are removed first. On an error, the file being written is removed and
    ``data_params.json`` is not written, so what remains reads as unfinished.
    """
    output_dir = local_output(output_dir, "Cerebras HDF5")
    pad_id = _check_source(cache, options)
    tokenizer_name, backend = _tokenizer(cache, tokenizer)
    eos_id = cache.identity.get("eos_id")
    fim = _fim(options, backend, eos_id, pad_id) if options.mode == "fim" else None
    with atomic_files(os.path.join(output_dir, DATA_PARAMS)) as (out,):  # held from the start: a second export here is refused
        clear_unfinished(output_dir, options.output_name)
        cutter = SampleCutter(cache, options, pad_id, fim)
        logger.info("exporting %d documents (%d tokens) of %s to %s as Cerebras %s samples of %d positions", cutter.rows,
                    cutter.stream_end - cutter.stream_start, cache.location, output_dir, MODES[options.mode], options.max_seq_length)
        files = SampleFiles(output_dir, options, SampleStatistics(eos_id, pad_id, functools.partial(backend.decode_batch, skip_special_tokens=False)))
        _write_samples(cutter, files, options, progress)
        params = _data_params(cache, output_dir, options, tokenizer_name, pad_id, cutter, files)
        out.write(json.dumps(params, indent=4, sort_keys=True).encode())
    _report(output_dir, options, cutter, files)
    return params["h5_dataset_stats"]


def _write_samples(cutter: SampleCutter, files: SampleFiles, options: Hdf5ExportOptions, progress: bool) -> None:
    """Every sample the cutter makes into the files, with a progress bar; on an error the file being written is dropped."""
    total = cutter.stream_end - cutter.stream_start
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


def _check_source(cache: TokenSource, options: Hdf5ExportOptions) -> int:
    """Refuse a cache the options cannot export; returns the pad id."""
    identity = cache.identity
    if options.mode == "summarization" and not cache.has_loss_spans:
        raise ValueError(
            f"{cache.location}: mode 'summarization' trains on each document's loss spans, and this cache (format "
            f"{_source_format(identity)!r}) stores none; export it with mode='lm', or build the cache with a format "
            f"that marks what to train on (such as format: {{type: supervised}})"
        )
    if options.mode != "summarization" and cache.has_loss_spans:
        logger.warning("%s stores loss spans, which mode %r ignores (it trains on every token, prompts included); "
                       "mode='summarization' keeps them", cache.location, options.mode)
    limits = np.iinfo(options.data_dtype)
    vocab_size = identity.get("vocab_size")
    highest = vocab_size - 1 if vocab_size else int(np.iinfo(cache.dtype).max)
    if highest > limits.max:
        source = f"its vocabulary of {vocab_size}" if vocab_size else f"its dtype {cache.dtype}, its vocabulary size unknown"
        raise ValueError(f"input_ids_dtype {options.input_ids_dtype} holds ids up to {limits.max}, but {cache.location} may hold ids up "
                         f"to {highest} ({source}); choose a wider dtype such as int32")
    eos_id = identity.get("eos_id")
    if options.mode != "lm" and eos_id is None:
        raise ValueError(f"{cache.location}: mode {options.mode!r} needs the EOS id that ends each document, and the cache records "
                         "none; declare it (token_files: {eos_id: ...}) or export with mode='lm'")
    pad_id = options.pad_id if options.pad_id is not None else (eos_id if eos_id is not None else 0)
    if pad_id > limits.max:
        raise ValueError(f"pad_id {pad_id} does not fit input_ids_dtype {options.input_ids_dtype} (at most {limits.max}); "
                         f"give a smaller pad_id or a wider dtype")
    return int(pad_id)


def _tokenizer(cache: TokenSource, name: str | None) -> tuple[str, Any]:
    """The tokenizer the cache was built with (its name and its ``tokenizers.Tokenizer``), checked against the cache's
    identity."""
    from tokenmix.formats.tokenizer import load_tokenizer
    from tokenmix.formats.tokenizer_identity import tokenizer_identity

    ledger = getattr(cache, "ledger", None)
    name = name or (ledger.info.get("tokenizer") if ledger is not None else None)
    if not name:
        raise ValueError(f"{cache.location}: a Cerebras HDF5 export decodes its samples (data_params.json's detokenized_bytes and "
                         "detokenized_chars, FIM) with the cache's tokenizer, and none is recorded for it; give it (tokenizer=..., "
                         "or --tokenizer on the command line)")
    expected = cache.identity.get("tokenizer_fingerprint")
    if expected is not None and tokenizer_identity(name).fingerprint != expected:
        raise ValueError(f"{cache.location} was built with another tokenizer than {name!r} (fingerprints differ); give the "
                         "tokenizer the cache was built with")
    return name, load_tokenizer(name).backend_tokenizer


def _fim(options: Hdf5ExportOptions, backend: Any, eos_id: int, pad_id: int) -> FimRearranger:
    ids = {}
    for field in ("fim_prefix_tok", "fim_middle_tok", "fim_suffix_tok"):
        token = getattr(options, field)
        if backend.token_to_id(token) is None:
            raise ValueError(f"Hdf5ExportOptions.{field} is {token!r}, which is not in the tokenizer's vocabulary; give one of its "
                             "tokens (FIM needs its three sentinels in the vocabulary)")
        ids[field] = backend.encode(token).ids[-1]  # as Cerebras takes it: the last id the token's text encodes to
    tokens = FimTokens(ids["fim_prefix_tok"], ids["fim_middle_tok"], ids["fim_suffix_tok"], eos_id, pad_id)
    return FimRearranger(backend, tokens, options.fim_rate, options.spm_rate, options.seed)


def _data_params(cache: TokenSource, output_dir: str, options: Hdf5ExportOptions, tokenizer: str, pad_id: int, cutter: SampleCutter,
                 files: SampleFiles) -> dict[str, Any]:
    """``data_params.json``: Cerebras's sections with its keys and counts, and this exporter's ``tokenmix`` section."""
    identity = cache.identity
    eos_id = identity.get("eos_id")
    processing: dict[str, Any] = {
        "max_seq_length": options.max_seq_length,
        "short_seq_prob": options.short_seq_prob,
        "output_name": options.output_name,
        "files_per_record": options.files_per_record,
        "write_remainder": options.write_remainder,
        "seed": options.seed,
        "eos_id": eos_id,
        "pad_id": pad_id,
    }
    if options.mode == "fim":
        processing.update({f: getattr(options, f) for f in ("fim_rate", "spm_rate", "fim_prefix_tok", "fim_middle_tok", "fim_suffix_tok")})
    dataset: dict[str, Any] = {
        "min_sequence_len": options.min_sequence_len,
        "input_ids_dtype": np.dtype(options.input_ids_dtype).name,
        "input_mask_dtype": np.dtype(options.input_mask_dtype).name,
        "inverted_mask": options.inverted_mask,
    }
    if options.mode != "summarization":
        dataset["pack_sequences"] = options.pack_sequences
    post_process: dict[str, Any] = {
        "discarded_files": cutter.discarded,
        "processed_files": cutter.rows,
        "successful_files": cutter.rows - cutter.discarded,
        "n_examples": files.written,
        "raw_chars_count": None,
        "raw_bytes_count": None,
    }
    ledger = getattr(cache, "ledger", None)
    if ledger is not None:  # the characters and bytes of the records' text, as the build counted them
        post_process["raw_chars_count"] = sum(s.chars for s in ledger.shards)
        post_process["raw_bytes_count"] = sum(s.utf8_bytes for s in ledger.shards)
    post_process.update({k: v for k, v in (("eos_id", eos_id), ("pad_id", pad_id), ("vocab_size", identity.get("vocab_size"))) if v is not None})
    return {
        "setup": {
            "dataset_processor": PROCESSORS[options.mode],
            "mode": MODES[options.mode],
            "input_dir": cache.location,
            "output_dir": os.path.abspath(output_dir),
            "processes": 1,
        },
        "processing": processing,
        "dataset": dataset,
        "post-process": post_process,
        "h5_dataset_stats": files.statistics.as_dict(),
        "tokenmix": {
            "exported_by": __name__,
            "source_format": _source_format(identity),
            "source_documents": cutter.rows,
            "source_tokens": cutter.stream_end - cutter.stream_start,
            "tokenizer": tokenizer,
            "data_dtype": options.data_dtype.name,
            "compression": options.compression,
            "keep_last_window": options.keep_last_window,
            "short_seq_carry": options.short_seq_carry,
            "n_files": files.complete,
            "remainder_samples_dropped": files.remainder_dropped,
            **cutter.counts,
        },
    }


def _report(output_dir: str, options: Hdf5ExportOptions, cutter: SampleCutter, files: SampleFiles) -> None:
    """Log what was written, and name every kind of token or sample the Cerebras rules left out."""
    counts = cutter.counts
    logger.info("wrote %d samples into %d files in %s from %d documents", files.written, files.complete, output_dir, cutter.rows)
    lost = {
        "windows or examples shorter than min_sequence_len skipped": counts["too_short"],
        "examples longer than max_seq_length skipped": counts["too_long"],
        "tokens cut off by short_seq_prob (short_seq_carry keeps them)": counts["short_seq_tokens_dropped"],
        "tokens of the stream's final partial window not written (its first is also the window before's last label, so one "
        "fewer are missing from the export; keep_last_window writes it)": counts["last_window_tokens_dropped"],
        "samples of the last, partial file not written (write_remainder)": files.remainder_dropped,
    }
    for what, n in lost.items():
        if n:
            logger.warning("%s: %d %s, as Cerebras does", output_dir, n, what)


def _source_format(identity: dict[str, Any]) -> str | None:
    """The cache's format type, or for token files read in place their kind (``megatron``, ``datatrove``, ...)."""
    return (identity.get("format") or {}).get("type") or identity.get("token_files")
