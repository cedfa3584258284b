"""``tokenmix demo``: build the bundled demo mixture (config/demo.yaml), print its statistics, then
stream shuffled training batches of the mixture through the DataLoader onto a mesh of 8 fake CPU
devices and print the proportions seen against the weights, the throughput and batch fingerprints."""

from __future__ import annotations

import logging
import os
import time

import numpy as np
from rich.console import Console
from tqdm.contrib.logging import logging_redirect_tqdm

from tokenmix import LMMixtureDatasetConfig, build_caches, load_data_config
from tokenmix.cli.build_cache import summary_table
from tokenmix.cli.console import make_console
from tokenmix.cli.parser import CommandParser, at_least
from tokenmix.loader.cpu_devices import use_fake_cpu_devices

logger = logging.getLogger(__name__)

DEMO_CONFIG = os.path.join("config", "demo.yaml")
DEMO_DEVICES = 8


def run(argv: list[str]) -> int:
    parser = CommandParser("demo", __doc__)
    parser.add_argument("--config_path", default=DEMO_CONFIG, help="the demo config (run from the repository root)")
    parser.add_argument("--seq_len", type=at_least(2, "tokens per example"), default=1024, help="tokens per example")
    parser.add_argument("--batch_size", type=at_least(DEMO_DEVICES, "examples per batch, split over the devices"), default=32,
                        help=f"examples per batch, split over the {DEMO_DEVICES} devices (a multiple of {DEMO_DEVICES})")
    parser.add_argument("--batches", type=at_least(1, "batches"), default=300, help="batches streamed through the DataLoader")
    args, overrides = parser.parse_known_args(argv)
    if args.batch_size % DEMO_DEVICES:
        parser.error(f"argument --batch_size: must be a multiple of {DEMO_DEVICES} (the batch is split over {DEMO_DEVICES} devices), "
                     f"got {args.batch_size}")
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
    """Stream the training mixture through the DataLoader on a CPU mesh; print proportions against the weights,
    tokens/s and fingerprints, and show that a resumed step has the same fingerprint."""
    use_fake_cpu_devices(DEMO_DEVICES)
    import jax

    from tokenmix import DataLoader

    devices = jax.devices("cpu")[:DEMO_DEVICES]
    mesh = jax.make_mesh((len(devices),), ("data",), devices=devices)
    start = time.perf_counter()
    train = config.train_set(seq_len)
    with DataLoader(train, batch_size, mesh, {"batch": "data"}, fingerprint=True) as loader:
        it = iter(loader)
        first = next(it)
        first_s = time.perf_counter() - start
        seen = np.bincount(np.asarray(first.batch.source_ids.array), minlength=len(train.names))
        fingerprints = [first.fingerprint]
        start = time.perf_counter()
        for sb, _ in zip(it, range(batches - 1)):
            seen += np.bincount(np.asarray(sb.batch.source_ids.array), minlength=len(train.names))
            fingerprints.append(sb.fingerprint)
        rate = (len(fingerprints) - 1) * batch_size * seq_len / (time.perf_counter() - start)
        middle = len(fingerprints) // 2
        resumed = loader.batch(middle).fingerprint
    weights = train.stages[0][1]
    total_weight = sum(weights.values())
    console.print(f"streamed {len(fingerprints)} shuffled batches of {batch_size} x {seq_len} tokens through the DataLoader onto a mesh of "
                  f"{len(devices)} CPU devices, batch split over 'data' (first batch after {first_s:.3f} s, then {rate / 1e6:.1f} M tokens/s)")
    usage = train.usage(len(fingerprints) * batch_size)
    for i, name in enumerate(train.names):
        console.print(f"  {name:<12} {seen[i] / seen.sum():6.1%} of examples, weight {weights.get(name, 0) / total_weight:6.1%}, "
                      f"epoch {usage[name].epoch} ({usage[name].epochs_completed:.2f} epochs read)")
    shown = sorted({min(step, len(fingerprints) - 1) for step in (0, 1, 2, len(fingerprints) - 1)})
    console.print("batch fingerprints: " + ", ".join(f"step {s} {fingerprints[s]}" for s in shown))
    console.print(f"step {middle} read again on its own: {resumed} ({'the same' if resumed == fingerprints[middle] else 'DIFFERENT'})")
