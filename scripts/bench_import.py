"""What `import tokenmix` costs, against the bare interpreter start it cannot go below.

Each case runs in a fresh interpreter (`python -c ...`), alternating cases, best of ``--repeats``:

- ``python``: ``pass``, the interpreter's own start (the limit);
- ``import tokenmix``: the public face alone;
- ``load a config``: ``tokenmix.load_data_config("config/demo.yaml")`` (the config layer, draccus, tensorstore);
- ``DataLoader``: touching ``tokenmix.DataLoader``, which imports JAX and haliax;
- ``transformers``: what importing ``transformers`` would add, for comparison.

Run from the repository root: ``.venv/bin/python scripts/bench_import.py``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

CASES = {
    "python": "pass",
    "import tokenmix": "import tokenmix",
    "load a config": "import tokenmix; tokenmix.load_data_config('config/demo.yaml')",
    "DataLoader": "import tokenmix; tokenmix.DataLoader",
    "transformers": "import transformers",
}
CHECK = "import sys, tokenmix; print(sorted(m for m in ('jax', 'transformers', 'torch') if m in sys.modules))"


def seconds(code: str) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    for code in CASES.values():  # warm the file cache and the .pyc files
        seconds(code)
    best = {name: min(seconds(code) for _ in range(args.repeats)) for name, code in CASES.items()}
    heavy = subprocess.run([sys.executable, "-c", CHECK], check=True, capture_output=True, text=True).stdout.strip()
    base = best["python"]
    print(f"heavy modules after `import tokenmix`: {heavy}")
    print(f"{'case':<16} {'best s':>8} {'over python':>12}")
    for name, value in best.items():
        print(f"{name:<16} {value:8.3f} {value - base:11.3f}s")


if __name__ == "__main__":
    main()
