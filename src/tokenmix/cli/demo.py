"""``tokenmix demo``: build the bundled demo mixture (config/demo.yaml), print its statistics, then
stream shuffled training batches from the mixture and print the proportions seen and the throughput."""

from __future__ import annotations

import argparse
import logging
import os
import time

import numpy as np
from rich.console import Console
from tqdm.contrib.logging import logging_redirect_tqdm

from tokenmix.cli.build_cache import load_data_config, summary_table
from tokenmix.cli.console import make_console
from tokenmix.config import LMMixtureDatasetConfig, build_caches

logger = logging.getLogger(__name__)

DEMO_CONFIG = os.path.join("config", "demo.yaml")


def run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="tokenmix demo", description=__doc__)
    parser.add_argument("--config_path", default=DEMO_CONFIG, help="the demo config (run from the repository root)")
    parser.add_argument("--seq_len", type=int, default=1024)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--batches", type=int, default=300)
    args, overrides = parser.parse_known_args(argv)
    if not os.path.exists(args.config_path):
        logger.error("%s not found: run `tokenmix demo` from the tokenmix repository root", args.config_path)
        return 1
    config = load_data_config(args.config_path, overrides)
    with logging_redirect_tqdm():
        results = build_caches(config)
    console = make_console()
    console.print(summary_table(results))
    total_tokens = sum(st["tokens"] for (_, split), st in results.items() if split == "train")
    for (source, split), st in results.items():
        if split == "train":
            console.print(f"{source:<12} {st['tokens'] / total_tokens:6.1%} of training tokens, "
                          f"{st['raw_bytes'] / max(st['tokens'], 1):.2f} bytes of text per token")
    example = config.cache_location(next(iter(config.configs)), "train")
    console.print(f"caches are in {config.cache_dir}; look inside with `tokenmix inspect {example}`")
    if isinstance(config, LMMixtureDatasetConfig):
        stream_batches(config, args.seq_len, args.batch_size, args.batches, console)
    return 0


def stream_batches(config: LMMixtureDatasetConfig, seq_len: int, batch_size: int, batches: int, console: Console) -> None:
    """Read shuffled batches from the training mixture; print proportions against the weights and tokens/s."""
    start = time.perf_counter()
    train = config.train_set(seq_len)
    first = train.get_batch(np.arange(batch_size))
    first_s = time.perf_counter() - start
    seen = np.bincount(first.source_ids, minlength=len(train.names))
    start = time.perf_counter()
    for step in range(1, batches):
        seen += np.bincount(train.get_batch(np.arange(step * batch_size, (step + 1) * batch_size)).source_ids, minlength=len(train.names))
    rate = (batches - 1) * batch_size * seq_len / (time.perf_counter() - start)
    weights = train.stages[0][1]
    total_weight = sum(weights.values())
    console.print(f"streamed {batches} shuffled batches of {batch_size} x {seq_len} tokens from the mixture "
                  f"(first batch after {first_s:.3f} s, then {rate / 1e6:.1f} M tokens/s)")
    usage = train.usage(batches * batch_size)
    for i, name in enumerate(train.names):
        console.print(f"  {name:<12} {seen[i] / seen.sum():6.1%} of examples, weight {weights.get(name, 0) / total_weight:6.1%}, "
                      f"epoch {usage[name].epoch} ({usage[name].epochs_completed:.2f} epochs read)")
