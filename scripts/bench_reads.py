"""Shuffled mixture reads when the corpus does not fit in the chunk cache, by cache layout, against a memmap gather.

    python scripts/bench_reads.py [--config_path config/shared_corpus.yaml] [--batches 200] [--repeats 3] [--copies 1]
                                  [--layouts zstd,lz4,none,legacy]

``--copies N`` builds each source from N copies of its train shards (links under new names), for a corpus of several
GiB of tokens: reads then touch far more shards and pages than the chunk cache, or the CPU caches, hold.

Builds the config's caches once per layout, into fresh directories: in today's layout (zarr3 shards of 2^20 tokens holding
chunks of 2^12, each chunk with its crc32c) with zstd chunks (``build.compression: zstd``, the default), LZ4 ones (``lz4``)
and uncompressed ones (``none``); each of those without the crc32c (``zstd-unchecked`` ...: what reading costs without
verification, printed as a ratio); and in the layout before shards (plain zstd chunks of 2^18 tokens, made by creating the arrays with that
layout first; the builder writes into the arrays it finds). For each, reads shuffled 64 x 2048 batches of the three-source mixture with
``MixtureDataset.get_batch``:

- chunk cache off (``max_bytes = 0``): every read decompresses what it touches, as with a corpus far larger than the
  cache (the default, 32 MiB, holds this corpus, a real one it does not);
- chunk cache on (the default): the corpus fits, repeated reads are memory copies.

In the same run, the very same windows are gathered from raw numpy memmaps of the same tokens (page cache warm):
the limit. Best of --repeats passes each. Also prints the build time and bytes on disk of each layout, and the
bytes each read decompresses per token it returns (the read amplification).
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import os
import tempfile
import time

import numpy as np
import tensorstore as ts
from braceexpand import braceexpand
from memmap_baseline import memmap_gather

from tokenmix import build_caches, load_data_config
from tokenmix.cache import chunk_cache, store
from tokenmix.cache.reader import TokenCache

LEGACY_CHUNK = 1 << 18
LAYOUTS = ("zstd", "lz4", "none", "zstd-unchecked", "lz4-unchecked", "none-unchecked", "legacy")


def legacy_arrays(config, dtype: str) -> None:
    """Create every train cache's arrays in the layout before shards: one zstd chunk of 2^18 values per object."""
    for name in config.configs:
        location = config.cache_location(name, "train")
        for sub, kind, chunk in (("input_ids/data", dtype, LEGACY_CHUNK), ("input_ids/offsets", "int64", 1 << 16)):
            ts.open({"driver": "zarr3", "kvstore": store._subspec(location, sub), "metadata": {
                "shape": [store.CAPACITY], "data_type": kind, "fill_value": 0,
                "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [chunk]}},
                "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "zstd", "configuration": {"level": 1}}]}},
                create=True).result()


def unchecked_arrays(config, dtype: str, compression: str) -> None:
    """Create every train cache's arrays in today's layout but without the crc32c of each chunk (as before checksums):
    the same reads, unverified, to measure what verification costs."""
    for name in config.configs:
        location = config.cache_location(name, "train")
        for sub, kind, shard, inner in (("input_ids/data", dtype, store.DATA_SHARD, store.DATA_INNER),
                                        ("input_ids/offsets", "int64", store.OFFSETS_SHARD, store.OFFSETS_INNER)):
            spec = store._array_spec(location, sub, kind, shard, inner, compression if sub.endswith("data") else "zstd")
            sharding = spec["metadata"]["codecs"][0]["configuration"]
            sharding["codecs"] = [c for c in sharding["codecs"] if c != store.CHECKSUM_CODEC]
            ts.open(spec, create=True).result()


def disk_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(root, f)) for root, _, files in os.walk(path) for f in files if "input_ids/data" in root)


def with_copies(config, copies: int, where: str):
    """The config with each source's train shards linked ``copies`` times under new names in ``where``."""
    configs = {}
    for name, source in config.configs.items():
        folder = os.path.join(where, name)
        os.makedirs(folder, exist_ok=True)
        shards = [path for url in source.train_urls for pattern in braceexpand(url) for path in sorted(glob.glob(pattern))]
        for k in range(copies):
            for path in shards:
                os.symlink(os.path.abspath(path), os.path.join(folder, f"copy{k:04d}-{os.path.basename(path)}"))
        configs[name] = dataclasses.replace(source, train_urls=[os.path.join(folder, "*.jsonl.zst")])
    return dataclasses.replace(config, configs=configs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config_path", default="config/shared_corpus.yaml")
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--copies", type=int, default=1)
    parser.add_argument("--layouts", default=",".join(LAYOUTS))
    args = parser.parse_args()
    layouts = args.layouts.split(",")
    batch, seq_len = 64, 2048
    index = np.arange(batch * args.batches)
    results: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="tokenmix-bench-reads-") as scratch:
        trains = {}
        for layout in layouts:
            compression = layout.removesuffix("-unchecked")
            extra = ["--build.compression", compression] if compression in ("lz4", "none") else []
            config = load_data_config(args.config_path, ["--cache_dir", os.path.join(scratch, layout), *extra])
            if args.copies > 1:
                config = with_copies(config, args.copies, os.path.join(scratch, "corpus", layout))
            if layout == "legacy":
                legacy_arrays(config, "uint16")
            if layout.endswith("-unchecked"):
                unchecked_arrays(config, "uint16", compression)
            started = time.perf_counter()
            build_caches(config, progress=False)
            built = time.perf_counter() - started
            trains[layout] = train = config.train_set(seq_len)
            stored = TokenCache(config.cache_location(train.names[0], "train"))._array.data.chunk_layout.read_chunk.shape[0]
            print(f"{layout}: built in {built:.2f} s (the first build includes importing transformers), "
                  f"{disk_bytes(os.path.join(scratch, layout)) / 1e6:.1f} MB of token data, stored chunks of {stored} tokens")
        gather = memmap_gather(config, trains[layouts[0]], index, seq_len, scratch)
        for train in trains.values():
            assert np.array_equal(train.get_batch(index[:batch]).tokens, gather(index[:batch]))
        steps = [index[i * batch : (i + 1) * batch] for i in range(args.batches)]
        runs = {f"{layout}, cache {state}": (layout, state) for layout in layouts for state in ("off", "on")}
        for _ in range(args.repeats):
            for label, (layout, state) in runs.items():
                chunk_cache.SHARED.max_bytes = 0 if state == "off" else chunk_cache.DEFAULT_BYTES
                with chunk_cache.SHARED._lock:
                    chunk_cache.SHARED._chunks.clear()
                    chunk_cache.SHARED._bytes = 0
                train = trains[layout]
                if state == "on":
                    for step in steps:  # the corpus fits: a pass fills the cache, as a long run's first epoch would
                        train.get_batch(step)
                started = time.perf_counter()
                for step in steps:
                    train.get_batch(step)
                results[label] = max(results.get(label, 0.0), len(index) * seq_len / (time.perf_counter() - started))
            started = time.perf_counter()
            for step in steps:
                gather(step)
            results["memmap"] = max(results.get("memmap", 0.0), len(index) * seq_len / (time.perf_counter() - started))
    memmap = results["memmap"]
    print(f"{args.batches} shuffled batches of {batch} x {seq_len}, best of {args.repeats}:")
    for label, rate in results.items():
        print(f"  {label:<20} {rate / 1e6:8.1f} M tokens/s  {rate / memmap:.3f}x memmap")
    print("| " + " | ".join(f"{results[k] / 1e6:.1f} M ({results[k] / memmap:.3f}x)" for k in runs) + f" | {memmap / 1e6:.0f} M |")
    for layout in layouts:
        if f"{layout}-unchecked" in layouts:
            cost = ", ".join(f"cache {state}: {results[f'{layout}, cache {state}'] / results[f'{layout}-unchecked, cache {state}']:.3f}x"
                             for state in ("off", "on"))
            print(f"  checksum verification, {layout}: {cost} the reads of the same layout without checksums")


if __name__ == "__main__":
    main()
