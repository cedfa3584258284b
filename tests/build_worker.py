"""One builder process for tests/test_build_integrity.py and tests/test_build_on_s3.py:

    python tests/build_worker.py CONFIG_PATH GO [--overrides ...]

loads the data config with the overrides and its tokenizer, prints ``ready``, waits until the file GO exists (``-``:
starts at once), builds every cache, and exits 0, or 1 after printing the error's type and message. Racing builders
are started together by creating GO once each has said it is ready (``helpers.start_builders``), so they reach the
lock together however long their imports took.
"""

from __future__ import annotations

import logging
import os
import sys
import time

import tokenmix
from tokenmix.config import cache_targets

if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    config = tokenmix.load_data_config(sys.argv[1], sys.argv[3:])
    cache_targets(config)  # loads the tokenizer before the start line
    print("ready", flush=True)
    while sys.argv[2] != "-" and not os.path.exists(sys.argv[2]):
        time.sleep(0.001)
    try:
        tokenmix.build_caches(config, progress=False)
    except Exception as e:
        print(f"{type(e).__name__}: {e}", flush=True)
        sys.exit(1)
    print("built", flush=True)
