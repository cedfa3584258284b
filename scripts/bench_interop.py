"""Megatron files read through a mixture against a raw numpy memmap of the same files, and export throughput against a
raw write of the same bytes.

    python scripts/bench_interop.py [--config_path config/shared_corpus.yaml] [--batches 200] [--repeats 3]

Builds (or reuses) the config's train caches, exports each source to Megatron ``.bin/.idx`` (timed: the export's limit
is writing the same bytes from memory with ``ndarray.tofile``, timed right after), then reads shuffled 64 x 2048 batches
of a mixture of those Megatron sources (``token_files: {kind: megatron}``) with ``MixtureDataset.get_batch``; in the
same run the very same windows are gathered from raw ``np.memmap``s of the ``.bin`` files (page cache warm): the limit.
Also times datatrove, Nanoset and Levanter exports, and Cerebras HDF5 (gzip, as Cerebras writes, and uncompressed)
against a raw write of its samples' bytes. Best of --repeats passes each, measured and limit in turns.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from functools import partial

import numpy as np

from tokenmix import build_caches, load_data_config, open_cache
from tokenmix.export import Hdf5ExportOptions, export_datatrove, export_hdf5, export_levanter, export_megatron, export_nanoset, read_hdf5_samples

BATCH, SEQ = 64, 2048


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def best(repeats: int, fn) -> float:
    return min(timed(fn) for _ in range(repeats))


def best_alternating(repeats: int, measured, limit) -> tuple[float, float]:
    """The best time of each, run in turns (the VM's neighbours slow both alike)."""
    pairs = [(timed(measured), timed(limit)) for _ in range(repeats)]
    return min(p[0] for p in pairs), min(p[1] for p in pairs)


def export_against_raw_write(cache, path: str, repeats: int) -> tuple[float, float]:
    """Seconds to export ``cache`` to Megatron at ``path``, and to write its tokens' bytes from memory (both fsynced)."""
    stream = cache.read_tokens(0, cache.num_tokens()).astype(np.uint16)

    def raw_write() -> None:
        with open(path + ".raw", "wb") as f:
            stream.tofile(f)
            f.flush()
            os.fsync(f.fileno())

    return best_alternating(repeats, partial(export_megatron, cache, path + "_text_document", progress=False), raw_write)


def hdf5_against_raw_write(cache, out: str, compression: str | None, repeats: int) -> tuple[float, float]:
    """Seconds to export ``cache`` to Cerebras HDF5 (2048-token samples), and to write as many bytes from memory."""
    import shutil

    options = Hdf5ExportOptions(max_seq_length=SEQ, compression=compression)

    def export() -> None:
        shutil.rmtree(out, ignore_errors=True)
        export_hdf5(cache, out, options, progress=False)

    export()
    samples = np.concatenate(list(read_hdf5_samples(out)))

    def raw_write() -> None:
        with open(out + ".raw", "wb") as f:
            samples.tofile(f)
            f.flush()
            os.fsync(f.fileno())

    return best_alternating(repeats, export, raw_write)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config_path", default="config/shared_corpus.yaml")
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    config = load_data_config(args.config_path)
    build_caches(config, progress=False)
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP")) as tmp:
        print(f"{'source':<12} {'tokens':>12} {'export s':>9} {'raw write s':>11} {'ratio':>6}   (megatron)")
        caches = {name: open_cache(config, name) for name in config.configs}
        for name, cache in caches.items():
            export_s, raw_s = export_against_raw_write(cache, os.path.join(tmp, name), args.repeats)
            print(f"{name:<12} {cache.num_tokens():>12,} {export_s:>9.3f} {raw_s:>11.3f} {raw_s / export_s:>6.2f}x")
        label, first = next(iter(caches.items()))
        for kind, export in (("datatrove", partial(export_datatrove, first, os.path.join(tmp, "export.ds"), progress=False)),
                             ("nanoset", partial(export_nanoset, first, os.path.join(tmp, "export_input_ids.npy"), progress=False)),
                             ("levanter", partial(export_levanter, first, os.path.join(tmp, "levanter"), tokenizer="t", progress=False))):
            seconds = best(args.repeats, export)
            print(f"{kind} export of {label}: {seconds:.3f} s, {first.num_tokens() / seconds / 1e6:.1f} M tokens/s")
        for compression in ("gzip", None):
            hdf5_s, raw_s = hdf5_against_raw_write(first, os.path.join(tmp, f"h5_{compression}"), compression, args.repeats)
            print(f"hdf5 export of {label} (compression {compression}): {hdf5_s:.3f} s, {first.num_tokens() / hdf5_s / 1e6:.1f} M tokens/s; "
                  f"raw write of its samples' bytes {raw_s:.3f} s: {raw_s / hdf5_s:.2f}x")

        megatron = load_data_config({
            "tokenizer": config.tokenizer, "cache_dir": os.path.join(tmp, "plans"),
            "configs": {name: {"train_urls": [os.path.join(tmp, f"{name}_text_document")], "token_files": {"kind": "megatron"}}
                        for name in config.configs},
        })
        train = megatron.train_set(SEQ)
        rng = np.random.default_rng(0)
        start = int(rng.integers(0, 1 << 20))
        index = np.arange(start, start + args.batches * BATCH)
        ids, draws = train.locate(index)
        windows = np.empty(len(index), np.int64)
        for sid, name in enumerate(train.names):
            mine = ids == sid
            windows[mine] = train.source(name).examples(draws[mine])
        maps = [np.memmap(os.path.join(tmp, f"{name}_text_document.bin"), np.uint16, mode="r") for name in train.names]

        def ours() -> None:
            for b in range(args.batches):
                train.get_batch(index[b * BATCH : (b + 1) * BATCH])

        def limit() -> None:
            for b in range(args.batches):
                rows = slice(b * BATCH, (b + 1) * BATCH)
                np.stack([maps[s][w * SEQ : (w + 1) * SEQ] for s, w in zip(ids[rows], windows[rows])]).astype(np.int32)

        for m in maps:  # the same bytes in the page cache for both
            np.asarray(m).sum()
        tokens = args.batches * BATCH * SEQ
        ours_s, limit_s = best_alternating(args.repeats, ours, limit)
        check = train.get_batch(index[:BATCH]).tokens
        assert np.array_equal(check, np.stack([maps[s][w * SEQ : (w + 1) * SEQ] for s, w in zip(ids[:BATCH], windows[:BATCH])]))
        print(f"shuffled mixture of the Megatron files, {args.batches} batches of {BATCH} x {SEQ}:")
        print(f"  tokenmix MixtureDataset.get_batch: {tokens / ours_s / 1e6:8.1f} M tokens/s")
        print(f"  raw np.memmap gather (limit):      {tokens / limit_s / 1e6:8.1f} M tokens/s")
        print(f"  ratio: {limit_s / ours_s:.2f}x")


if __name__ == "__main__":
    main()
