"""What every command does alike (``tokenmix ...`` and ``python -m tokenmix.train``): how it logs, and how it reports an
error a user can hit.

Logging: tokenmix's own messages from INFO up, other libraries' from WARNING up, so that what they say about themselves
at INFO (JAX probing for a TPU it does not find, for one) is not shown as if it were part of the run. Errors: one whose
message names the file or field and the fix is logged as that one line, and the command exits 1; anything else is a bug
and keeps its traceback. Ctrl-C (SIGINT) is one line too, and exit 130 as a shell gives a command killed by it: what a
command had committed stays, so the same command run again resumes. Output into a pipe whose reader has gone
(``tokenmix inspect CACHE --json | head``) ends the command quietly with exit 1, as Python's documentation advises and as
rich does for the tables.
"""

from __future__ import annotations

import logging
import os
import select
import sys
from collections.abc import Callable

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
INTERRUPTED = 130
"""The exit status of a command stopped by Ctrl-C: 128 + SIGINT, what a shell reports for a command the signal killed."""


def configure_command_logging() -> None:
    """Log to stderr: tokenmix's loggers from INFO, every other library's from WARNING."""
    logging.basicConfig(level=logging.WARNING, format=FORMAT, datefmt="%H:%M:%S")
    logging.getLogger("tokenmix").setLevel(logging.INFO)
    # Dask's distributed sets its own loggers to INFO when it is imported (its workers too, in processes of their own),
    # and logs a closing cluster's dropped connections there with a traceback: its configuration says WARNING instead
    os.environ.setdefault("DASK_LOGGING__DISTRIBUTED", "warning")


def is_user_error(error: BaseException) -> bool:
    """Whether ``error`` is one a user can hit, whose message names the file or field and the fix: tokenmix's own error
    types, and the ValueError, OSError and ImportError (a missing extra) the library raises with such a message."""
    return isinstance(error, ValueError | OSError | ImportError) or type(error).__module__.startswith("tokenmix.")


def run_command(logger_name: str, body: Callable[[], int | None]) -> int:
    """``body()``'s exit status; an error a user can hit is logged as one line (by ``logger_name``) and gives 1, Ctrl-C gives
    ``INTERRUPTED``."""
    try:
        return int(body() or 0)
    except KeyboardInterrupt:
        logging.getLogger(logger_name).error("interrupted (Ctrl-C): run the same command again; build-cache, curate and train "
                                             "resume from what they had committed")
        return INTERRUPTED
    except Exception as e:
        if isinstance(e, BrokenPipeError) and stdout_reader_gone():
            # the interpreter flushes stdout again at exit: into devnull, so that it raises no second BrokenPipeError
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 1
        if not is_user_error(e):
            raise
        logging.getLogger(logger_name).error("%s", e)
        return 1


def stdout_reader_gone() -> bool:
    """Whether standard output is a pipe that nothing reads any more (a BrokenPipeError from a worker's pipe or a socket
    is an error to report; this one is not)."""
    try:
        poll = select.poll()
        poll.register(sys.stdout.fileno(), 0)  # POLLERR is reported whatever the mask: a pipe's writer gets it with no reader
        return any(event & select.POLLERR for _, event in poll.poll(0))
    except (OSError, ValueError):
        return False
