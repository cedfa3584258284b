"""One builder process for tests/test_build_integrity.py:

    python tests/build_worker.py CONFIG_PATH START_AT [--overrides ...]

loads the data config with the overrides, waits until the wall-clock time START_AT (so that racing
builders reach the lock together, their imports and tokenizer loading done), builds every cache, and
exits 0, or 1 after printing the error's type and message.
"""

from __future__ import annotations

import logging
import sys
import time

import tokenmix
from tokenmix.config import cache_targets

if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    config = tokenmix.load_data_config(sys.argv[1], sys.argv[3:])
    cache_targets(config)  # loads the tokenizer before the start line
    time.sleep(max(0.0, float(sys.argv[2]) - time.time()))
    try:
        tokenmix.build_caches(config, progress=False)
    except Exception as e:
        print(f"{type(e).__name__}: {e}", flush=True)
        sys.exit(1)
    print("built", flush=True)
