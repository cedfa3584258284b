"""Benchmark packing: planning 10^7 documents from their lengths, and reading packed batches.

1. Plan: synthetic document lengths (log-normal, median ~400 tokens, with a tail past seq_len) are
   cut into pieces and packed by next fit (``datasets/packing.py``), for 10^6 and 10^7 documents, each
   long-document option; the same packing done by a plain Python loop over 10^6 documents is timed
   as the reference, and the two plans are checked equal.
2. Read: a ``PackedDataset`` over a real cache (the train split of one source of ../shared/corpus,
   built if missing): time to plan from the cache's offsets (no stored plan), time to open it again
   (stored plan), and random 64 x 2048 packed batches per second against gathering the same pieces
   from a raw numpy memmap of the cache's tokens (the limit) and against ``TokenSeqDataset`` windows.

Run from the repository root:  .venv/bin/python scripts/bench_packing.py
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time

import numpy as np

from tokenmix import PackedDataset, TokenCache, TokenSeqDataset, build_caches, load_data_config
from tokenmix.datasets.packing import document_pieces, next_fit


def python_next_fit(sizes: list[int], seq_len: int, cap: int) -> list[int]:
    """The reference: next fit one piece at a time."""
    starts, tokens, count = [], 0, 0
    for i, size in enumerate(sizes):
        if not starts or tokens + size > seq_len or count == cap:
            starts.append(i)
            tokens, count = 0, 0
        tokens += size
        count += 1
    return starts


def bench_plan(seq_len: int, cap: int) -> None:
    rng = np.random.default_rng(0)
    for n in (10**6, 10**7):
        lengths = np.maximum(1, rng.lognormal(6.0, 1.2, n)).astype(np.int64)
        for mode in ("truncate", "split"):
            best = float("inf")
            for _ in range(3):
                start = time.perf_counter()
                _, _, sizes = document_pieces(lengths, seq_len, mode)
                starts, _ = next_fit(sizes, seq_len, cap, complete=True)
                best = min(best, time.perf_counter() - start)
            efficiency = sizes.sum() / (len(starts) * seq_len)
            print(f"plan {n:.0e} documents ({lengths.sum() / 1e9:.2f} G tokens), {mode}, seq_len {seq_len}, cap {cap}: "
                  f"{best:.2f} s (best of 3), {len(starts):,} examples, packing efficiency {efficiency:.3f}")
            if n == 10**6 and mode == "truncate":
                start = time.perf_counter()
                reference = python_next_fit(sizes.tolist(), seq_len, cap)
                loop = time.perf_counter() - start
                assert reference == starts.tolist(), "vectorized and reference plans differ"
                print(f"  reference Python loop on the same 1e6 documents: {loop:.2f} s (plans identical)")


def bench_read(config_path: str, source: str, seq_len: int, batch: int, batches: int) -> None:
    config = load_data_config(config_path, [])
    build_caches(config, sources=[source], progress=False)
    location = config.cache_location(source, "train")
    cache = TokenCache(location)
    shutil.rmtree(f"{location}/packing", ignore_errors=True)
    start = time.perf_counter()
    packed = PackedDataset(cache, seq_len, pad_id=config.pad_id())
    planned = time.perf_counter() - start
    start = time.perf_counter()
    PackedDataset(TokenCache(location), seq_len, pad_id=config.pad_id())
    reopened = time.perf_counter() - start
    stats = packed.stats()
    print(f"{source}: {cache.num_rows():,} documents, {cache.num_tokens():,} tokens -> {stats['examples']:,} packed examples of {seq_len}, "
          f"efficiency {stats['packing_efficiency']:.3f}; plan from offsets {planned * 1e3:.0f} ms, reopen with stored plan {reopened * 1e3:.0f} ms")
    windows = TokenSeqDataset(cache, seq_len)
    rng = np.random.default_rng(0)
    picks = [rng.integers(0, len(packed), batch) for _ in range(batches)]
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "tokens.npy")
        np.save(path, cache.read_tokens(0, cache.num_tokens()))
        tokens = np.load(path, mmap_mode="r")
        pad = config.pad_id()

        def memmap(p: np.ndarray) -> np.ndarray:
            """The limit: the same packed examples gathered piece by piece from a raw memmap, tokens only."""
            out = np.full((len(p), seq_len), pad, np.int32)
            for row, e in enumerate(p.tolist()):
                column = 0
                for piece in range(packed._example_bounds[e], packed._example_bounds[e + 1]):
                    start, size = packed._piece_start[piece], packed._piece_size[piece]
                    out[row, column : column + size] = tokens[start : start + size]
                    column += size
            return out

        assert np.array_equal(packed.get_batch(picks[0]).tokens, memmap(picks[0])), "the benchmark must gather the same tokens"
        results = {}
        for label, fn in (("packed", packed.get_batch), ("memmap", memmap), ("token_seq", windows.get_batch)) * 2:
            chosen = picks if label != "token_seq" else [rng.integers(0, len(windows), batch) for _ in range(batches)]
            start = time.perf_counter()
            for p in chosen:
                fn(p)
            results[label] = batches * batch * seq_len / (time.perf_counter() - start)  # the second (warm) pass wins
    print(f"read {batches} random batches of {batch} x {seq_len}: packed {results['packed'] / 1e6:.1f} M tok/s, "
          f"raw memmap gather of the same pieces {results['memmap'] / 1e6:.1f} M tok/s, ratio {results['packed'] / results['memmap']:.2f}x; "
          f"token windows {results['token_seq'] / 1e6:.1f} M tok/s ({results['packed'] / results['token_seq']:.2f}x)")

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seq_len", type=int, default=4096, help="sequence length of the planning benchmark")
    parser.add_argument("--cap", type=int, default=64, help="max segments per example")
    parser.add_argument("--config_path", default="config/shared_corpus.yaml")
    parser.add_argument("--source", default="webster")
    parser.add_argument("--batches", type=int, default=100)
    args = parser.parse_args()
    bench_plan(args.seq_len, args.cap)
    bench_read(args.config_path, args.source, 2048, 64, args.batches)


if __name__ == "__main__":
    main()
