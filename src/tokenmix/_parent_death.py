"""Worker processes that exit when the process that started them dies.

A pool's worker blocks on its task queue, whose pipe every worker also holds open, so a driver killed without cleanup
(SIGKILL, the OOM killer) leaves its workers waiting for tasks forever, each holding its memory, and the
``multiprocessing`` resource tracker with them (it exits only once every process holding its pipe has exited). A
worker that calls ``exit_when_parent_dies`` at start watches for the driver's death and exits within about a second
of it, even in the middle of a task. The watch polls ``os.getppid()``: a process whose parent dies is handed to another
parent, on every POSIX system, whichever thread started it (``PR_SET_PDEATHSIG`` fires when the starting *thread*
exits, and a pool starts workers from whichever thread submits).
"""

from __future__ import annotations

import os
import threading
import time

POLL_S = 1.0
"""How often a worker checks that its parent is alive: the most a worker outlives it by, plus its own exit."""


def exit_when_parent_dies(parent_pid: int) -> None:
    """Exit this process (status 1, no cleanup: the parent's rerun redoes unfinished work) once ``parent_pid`` is no
    longer its parent. Call it first thing in a worker, with the parent's pid taken in the parent."""
    threading.Thread(target=_watch, args=(parent_pid,), name="tokenmix-parent-watch", daemon=True).start()


def _watch(parent_pid: int) -> None:
    while os.getppid() == parent_pid:
        time.sleep(POLL_S)
    os._exit(1)
