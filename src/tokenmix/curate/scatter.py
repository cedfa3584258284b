"""Where each record goes when a pipeline writes partitions: a bucket, and its place in the bucket. Pure index math.

Writing N partitions without the input's sharding is two passes with memory bounded by one bucket: each input shard
scatters its records into buckets, then each bucket is gathered and written in order. In order: a record's bucket is
the partition its index in the (blended) sequence falls in, and a gathered bucket is sorted by that index. Shuffled:
a record's bucket is a seeded hash of its index, the buckets of a partition are ``p, p + N, p + 2N, ...``, and each is
put in a seeded random order. Independent uniform buckets, each uniformly permuted and concatenated, make a uniform
permutation of the whole; the sizes are multinomial, so partitions differ in size by about a square root.
"""

from __future__ import annotations

import numpy as np

_MASK = np.uint64(0xFFFFFFFFFFFFFFFF)


def mix64(values: np.ndarray, seed: int) -> np.ndarray:
    """SplitMix64 of ``values`` under ``seed``: uniform, independent-looking 64-bit values, the same on every machine."""
    with np.errstate(over="ignore"):
        z = values.astype(np.uint64) + np.uint64((seed * 0x9E3779B97F4A7C15 + 0x632BE59BD9B4E019) & 0xFFFFFFFFFFFFFFFF)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return (z ^ (z >> np.uint64(31))) & _MASK


def ordered_buckets(indices: np.ndarray, total: int, partitions: int) -> np.ndarray:
    """In order: the partition of each index, contiguous ranges of about ``total / partitions`` records."""
    return (indices.astype(np.int64) * partitions // max(total, 1)).astype(np.int64)


def shuffled_buckets(indices: np.ndarray, seed: int, buckets: int) -> np.ndarray:
    """Shuffled: a seeded uniform bucket for each index."""
    return (mix64(indices, seed) % np.uint64(buckets)).astype(np.int64)


def buckets_of_partition(partition: int, partitions: int, buckets: int) -> list[int]:
    """The buckets a partition gathers, in the order it writes them."""
    return list(range(partition, buckets, partitions))


def bucket_order(indices: np.ndarray, seed: int | None, bucket: int) -> np.ndarray:
    """The order to write a gathered bucket's records in: by index, then (with a seed) a seeded permutation of that."""
    by_index = np.argsort(indices, kind="stable")
    if seed is None:
        return by_index
    return by_index[np.random.default_rng([seed, bucket]).permutation(len(indices))]


def bucket_count(total_bytes: int, partitions: int, buffer_bytes: int) -> int:
    """Buckets for a shuffle: a multiple of ``partitions`` such that one bucket is about ``buffer_bytes`` or less."""
    per_partition = -(-max(total_bytes, 1) // (partitions * max(buffer_bytes, 1)))
    return partitions * max(1, per_partition)
