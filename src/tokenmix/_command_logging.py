"""How tokenmix's commands log (``tokenmix ...`` and ``python -m tokenmix.train``): tokenmix's own messages from INFO
up, other libraries' from WARNING up, so that what they say about themselves at INFO (JAX probing for a TPU it does
not find, for one) is not shown as if it were part of the run."""

from __future__ import annotations

import logging

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def configure_command_logging() -> None:
    """Log to stderr: tokenmix's loggers from INFO, every other library's from WARNING."""
    logging.basicConfig(level=logging.WARNING, format=FORMAT, datefmt="%H:%M:%S")
    logging.getLogger("tokenmix").setLevel(logging.INFO)
