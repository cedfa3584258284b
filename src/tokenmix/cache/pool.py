"""Tokenizing worker processes, shared by every cache built in one run.

Starting a worker costs about a second (a fresh interpreter, imports, the tokenizer), so a build
of many sources uses one pool: each worker holds an encoder per distinct ``EncoderSpec``, built
on first use.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from tokenmix.formats.encoder import (
    DocumentEncoder,
    EncoderSpec,
    encode_in_worker,
    init_worker,
)
from tokenmix.sources.shards import RawChunk


class Completed:
    """An already-finished stand-in for a future."""

    def __init__(self, value: Any):
        self._value = value

    def done(self) -> bool:
        return True

    def result(self) -> Any:
        return self._value


class EncoderPool:
    """``submit(spec, chunk)`` runs ``DocumentEncoder(spec).encode(chunk)`` in a worker process.

    ``num_workers=None`` uses one worker per core; ``0`` encodes in the calling process.
    """

    def __init__(self, specs: Sequence[EncoderSpec], num_workers: int | None = None):
        self.specs = list(dict.fromkeys(specs))
        self._index = {spec: i for i, spec in enumerate(self.specs)}
        self.num_workers = (os.cpu_count() or 1) if num_workers is None else num_workers
        self._local: dict[int, DocumentEncoder] = {}
        self._pool: ProcessPoolExecutor | None = None
        if self.num_workers > 0:
            threads = max(1, (os.cpu_count() or 1) // self.num_workers)
            self._pool = ProcessPoolExecutor(
                max_workers=self.num_workers,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=init_worker,
                initargs=(self.specs, os.getpid(), threads),
            )

    def submit(self, spec: EncoderSpec, chunk: RawChunk) -> Any:
        """Start encoding ``chunk``; returns a future (or a completed stand-in) of ``EncodedChunk``."""
        index = self._index[spec]
        if self._pool is None:
            if index not in self._local:
                self._local[index] = DocumentEncoder(spec)
            return Completed(self._local[index].encode(chunk))
        return self._pool.submit(encode_in_worker, index, chunk)

    def close(self, cancel: bool = False) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=not cancel, cancel_futures=cancel)
            self._pool = None

    def __enter__(self) -> EncoderPool:
        return self

    def __exit__(self, exc_type: object, *_: object) -> None:
        self.close(cancel=exc_type is not None)



