"""Idle BLAS threads that sleep instead of spinning: numpy's import costs a cold start no other core.

numpy's OpenBLAS starts a thread per core when numpy is imported, and each spins for ``2**28`` processor cycles (about
0.1 s) before it sleeps, whether or not a BLAS routine ever runs (numpy#29193, OpenBLAS#4365): on this project's 2-core
machine about 55 ms of CPU in the middle of a cold build's start-up, taken from the encoding and the imports (a
64-core host burns six core-seconds). tokenmix calls no BLAS routine. ``OPENBLAS_THREAD_TIMEOUT`` (read once, when
OpenBLAS loads; the log2 of the cycles to spin) shortens the spin to ``2**20`` cycles, under a millisecond: a thread
still spins between the calls of a BLAS loop, and results and thread counts are unchanged. It is set only where the
user has not set it and numpy is not imported yet (afterwards it would change nothing); processes started later
inherit it, as they would the user's own setting.
"""

from __future__ import annotations

import os
import sys

SPIN_LOG2_CYCLES = "20"


def shorten_idle_spin() -> None:
    """Set ``OPENBLAS_THREAD_TIMEOUT`` before numpy loads OpenBLAS, unless the user set it or numpy is loaded."""
    if "numpy" not in sys.modules:
        os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", SPIN_LOG2_CYCLES)
