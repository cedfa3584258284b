"""``tokenmix demo``: build the bundled demo mixture (config/demo.yaml) and print its statistics."""

from __future__ import annotations

import argparse
import logging
import os

from tqdm.contrib.logging import logging_redirect_tqdm

from tokenmix.cli.build_cache import load_data_config, summary_table
from tokenmix.cli.console import make_console
from tokenmix.config import build_caches

logger = logging.getLogger(__name__)

DEMO_CONFIG = os.path.join("config", "demo.yaml")


def run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="tokenmix demo", description=__doc__)
    parser.add_argument("--config_path", default=DEMO_CONFIG, help="the demo config (run from the repository root)")
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
    return 0
