"""Process start to the first batch: a fresh interpreter imports tokenmix and JAX, opens the caches of a
three-source mixture, and takes its first 64 x 2048 batch through ``DataLoader`` on a (4, 2) mesh of fake CPU devices.

    python scripts/bench_cold_start.py [--config_path config/shared_corpus.yaml] [--repeats 5]

Each run is a new process (``python -c``), timed from just before it is spawned to the batch being on the devices
(the wall clock read by parent and child), in two conditions, alternating:

- ``remembered``: the tokenizer's description is in tokenmix's description cache (``TOKENMIX_CACHE_DIR``), as after
  any build or open on this machine: opening caches loads no tokenizer and imports no ``transformers``;
- ``first open``: an empty description cache, so opening describes the tokenizer through ``transformers`` once
  (what every open cost before descriptions were remembered);
- ``no bytecode``: remembered, but tokenmix's modules have no compiled bytecode, so each process compiles the
  seventy-odd modules it imports from source: an editable install under ``PYTHONDONTWRITEBYTECODE=1`` (common in
  containers, and set in this project's development machines).

The first two run as an installed package does: ``pip install`` compiles every module's bytecode, so the script
compiles tokenmix's (``compileall``, into the ``__pycache__`` folders Python itself would write) before them, and
removes it before each ``no bytecode`` run; the third party packages in the environment keep the bytecode pip wrote.

The child reports where its time went (interpreter and imports, JAX's first device array, opening the mixture, the
first batch). The caches are built first if missing. Prints a markdown row for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

CHILD = r"""
import os, sys, time, json
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
t_start = time.perf_counter()
since_spawn = time.time() - float(sys.argv[2])
import numpy as np
import jax
import tokenmix
t_imports = time.perf_counter()
devices = jax.devices()
mesh = jax.make_mesh((4, 2), ("data", "model"), devices=devices[:8])
jax.block_until_ready(jax.device_put(np.zeros(8), devices[0]))
t_jax = time.perf_counter()
config = tokenmix.load_data_config(sys.argv[1])
train = config.train_set(2048)
t_open = time.perf_counter()
loader = tokenmix.DataLoader(train, 64, mesh, {"batch": "data"})
first = next(iter(loader))
jax.block_until_ready(first.batch)
t_batch = time.perf_counter()
print(json.dumps({"to_batch": since_spawn + t_batch - t_start, "imports": since_spawn + t_imports - t_start,
                  "jax": t_jax - t_imports, "open": t_open - t_jax,
                  "batch": t_batch - t_open, "transformers": "transformers" in sys.modules}))
"""


def run(config: str, cache_dir: str, write_bytecode: bool = True) -> dict:
    env = {**os.environ, "TOKENMIX_CACHE_DIR": cache_dir}
    if not write_bytecode:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    out = subprocess.run([sys.executable, "-c", CHILD, config, repr(time.time())], cwd=REPO, env=env, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


PACKAGE = REPO / "src" / "tokenmix"


def compile_bytecode() -> None:
    """What ``pip install`` does for an installed package: every module's bytecode written beside it."""
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(PACKAGE)], check=True)


def remove_bytecode() -> None:
    for folder in PACKAGE.rglob("__pycache__"):
        shutil.rmtree(folder)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config_path", default="config/shared_corpus.yaml")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    subprocess.run([sys.executable, "-m", "tokenmix.cli.main", "build-cache", "--config_path", args.config_path], cwd=REPO,
                   check=True, capture_output=True)
    runs: dict[str, list[dict]] = {"remembered": [], "first open": [], "no bytecode": []}
    with tempfile.TemporaryDirectory(prefix="tokenmix-descriptions-") as kept:
        run(args.config_path, kept)  # describes the tokenizer once, as a build or an earlier open would have
        for _ in range(args.repeats):
            compile_bytecode()
            runs["remembered"].append(run(args.config_path, kept))
            with tempfile.TemporaryDirectory(prefix="tokenmix-descriptions-") as empty:
                runs["first open"].append(run(args.config_path, empty))
            remove_bytecode()
            runs["no bytecode"].append(run(args.config_path, kept, write_bytecode=False))
        compile_bytecode()
    print(f"config: {args.config_path}; each run a new process; best of {args.repeats}")
    for name, results in runs.items():
        best = min(results, key=lambda r: r["to_batch"])
        every = ", ".join(f"{r['to_batch']:.2f}" for r in results)
        print(f"{name:>10}: to the first batch {best['to_batch']:.2f} s (all: {every}); "
              f"interpreter start + imports {best['imports']:.2f} s, JAX devices {best['jax']:.2f} s, open mixture {best['open']:.3f} s, "
              f"first batch {best['batch']:.3f} s; transformers imported: {best['transformers']}")
    remembered = min(runs["remembered"], key=lambda r: r["to_batch"])
    first = min(runs["first open"], key=lambda r: r["to_batch"])
    source = min(runs["no bytecode"], key=lambda r: r["to_batch"])
    print(f"| {remembered['to_batch']:.2f} s | {remembered['open']:.3f} s | {first['to_batch']:.2f} s | {first['open']:.3f} s | "
          f"{source['to_batch']:.2f} s | {source['open']:.3f} s |")


if __name__ == "__main__":
    main()
