"""Benchmark the datasets stage: mixture start-up, time to first batch, and batch throughput.

1. Start-up: construct a MixtureDataset over 1,000 synthetic sources (no disk), with 10^6 and with
   10^10 examples each: time and traced memory must not depend on the sizes.
2. Throughput: build (or reuse) caches of ../shared/corpus, then read shuffled 64 x 2048 batches from
   the three-source mixture, and in the same run gather the very same windows from a raw numpy memmap
   of the same tokens. Reports tokens/s for both and the ratio, and the time to the first batch.

Run from the repository root:  .venv/bin/python scripts/bench_datasets.py
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import tracemalloc

import numpy as np
from memmap_baseline import memmap_gather

from tokenmix import Dataset, MixtureDataset, TokenBatch, build_caches, load_data_config
from tokenmix.datasets import Pending
from tokenmix.datasets.mixture_layout import BlockAllocator


class Synthetic(Dataset):
    """A source with a length and nothing behind it: start-up is pure index math."""

    tokens_per_example = 2048

    def __init__(self, n: int):
        self.n = n

    def is_finite(self) -> bool:
        return True

    def current_len(self) -> int:
        return self.n

    def final_len(self) -> int:
        return self.n

    def read(self, indices) -> Pending[TokenBatch]:
        raise NotImplementedError("synthetic sources are not read")


def bench_startup(sources: int = 1000) -> None:
    rng = np.random.default_rng(0)
    weights = dict(zip((f"s{i:04d}" for i in range(sources)), (rng.random(sources) + 0.5).tolist()))
    for size in (10**6, 10**10):
        datasets = {name: Synthetic(size) for name in weights}
        times = []
        for _ in range(5):
            start = time.perf_counter()
            MixtureDataset(datasets, weights)
            times.append(time.perf_counter() - start)
        tracemalloc.start()
        mix = MixtureDataset(datasets, weights)
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        start = time.perf_counter()
        mix.locate(np.arange(10**12, 10**12 + 2048))
        first_block = time.perf_counter() - start
        print(f"start-up, {sources} sources x {size:.0e} examples: construct median {statistics.median(times) * 1e3:.1f} ms, "
              f"traced peak {peak / 2**20:.2f} MiB; locating one block at index 1e12: {first_block * 1e3:.1f} ms")


def bench_tiny_weights() -> None:
    """First access to a far block when some weights give less than one example per block.

    Random access walks at most ``memory`` blocks (the longest window of a tiny source's example) and
    never past the layout period, so the cost depends on the weights, not on how far the block is.
    """
    rng = np.random.default_rng(0)
    skewed = rng.random(1000) ** 4
    cases = {"two 1e-5 sources + one large": [1e-5, 1e-5, 0.99998]}
    for low in (-5, -6, -7):
        cases[f"1,000 log-uniform weights 1e{low}..1e-1"] = (10.0 ** rng.uniform(low, -1, 1000)).tolist()
    cases["1,000 weights u**4 (smallest 6e-18)"] = skewed.tolist()
    for label, weights in cases.items():
        for block in (10_000, 10**9, 10**12):
            alloc = BlockAllocator(weights, 2048)
            if min(block % alloc.period, alloc.memory) > 10**6:
                print(f"tiny weights, {label}, block {block:.0e}: skipped (walk of {alloc.memory:.1e} blocks)")
                continue
            start = time.perf_counter()
            alloc.counts_after(block)
            first = time.perf_counter() - start
            start = time.perf_counter()
            alloc.counts_after(block + 1)
            tiny = sum(1 for w in alloc.weights if 0 < w * 2048 < 1)
            print(f"tiny weights, {label} ({tiny} tiny), block {block:.0e}: period {alloc.period:.2g}, memory {alloc.memory:.2g} "
                  f"blocks, first access {first * 1e3:.1f} ms, next block {(time.perf_counter() - start) * 1e3:.2f} ms")


def bench_throughput(config_path: str, batches: int, seq_len: int, batch: int) -> None:
    config = load_data_config(config_path, [])
    build_caches(config, progress=False)
    start = time.perf_counter()
    train = config.train_set(seq_len)
    first = train.get_batch(np.arange(batch))
    first_batch_s = time.perf_counter() - start
    print(f"time to first batch (open {len(train.names)} caches, build mixture, read {batch} x {seq_len}): {first_batch_s:.3f} s")

    index = np.arange(batch, batch * (batches + 1))
    with tempfile.TemporaryDirectory() as tmp:
        gather = memmap_gather(config, train, index, seq_len, tmp)

        def ours(step: int) -> np.ndarray:
            return train.get_batch(index[step * batch : (step + 1) * batch]).tokens

        def memmap(step: int) -> np.ndarray:
            return gather(index[step * batch : (step + 1) * batch])

        assert np.array_equal(ours(0), memmap(0)), "the benchmark must gather the same tokens"
        results = {}
        for label, fn in (("tokenmix", ours), ("memmap", memmap), ("tokenmix", ours), ("memmap", memmap)):
            start = time.perf_counter()
            for step in range(batches):
                fn(step)
            results[label] = batches * batch * seq_len / (time.perf_counter() - start)  # the second (warm) pass wins
    del first
    ratio = results["tokenmix"] / results["memmap"]
    print(f"throughput, {batches} shuffled batches of {batch} x {seq_len} from {train.names}: tokenmix {results['tokenmix'] / 1e6:.1f} M tok/s, "
          f"raw memmap gather {results['memmap'] / 1e6:.1f} M tok/s, ratio {ratio:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config_path", default="config/shared_corpus.yaml")
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--seq_len", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=64)
    args = parser.parse_args()
    bench_startup()
    bench_tiny_weights()
    bench_throughput(args.config_path, args.batches, args.seq_len, args.batch)


if __name__ == "__main__":
    main()
