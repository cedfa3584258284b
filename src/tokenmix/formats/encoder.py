"""Raw records to token ids: the work a cache-building worker process does.

This module imports only ``tokenizers``, ``numpy`` and ``orjson`` so that worker processes start
fast. A chunk of raw records comes in; the concatenated token ids, one length per document, and an
account of every record that was skipped (position, reason, detail) come out.
"""

from __future__ import annotations

import logging
import os
import pickle
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from tokenmix.formats.long_docs import exact_split_supported, split_text
from tokenmix.formats.text import BadRecordError, LmDatasetFormatBase
from tokenmix.sources.shards import PlainText, RawChunk

logger = logging.getLogger(__name__)

PRETOKENIZED_KEY = "input_ids"
DEFAULT_LONG_DOC_CHARS = 100_000


@dataclass(frozen=True)
class EncoderSpec:
    """Everything a worker needs to encode records the same way as every other worker."""

    tokenizer_json: str
    format: LmDatasetFormatBase
    vocab_size: int
    bos_id: int | None
    """Token id put before every document, or None for none."""
    eos_id: int | None
    """Token id put after every document, or None for none."""
    dtype: str
    long_doc_chars: int = DEFAULT_LONG_DOC_CHARS


@dataclass
class EncodedChunk:
    """The tokens of one ``RawChunk``, with the account of its records."""

    start: int
    positions: int
    tokens: np.ndarray
    lengths: np.ndarray
    records: int = 0
    chars: int = 0
    utf8_bytes: int = 0
    skipped: list[tuple[int, str, str]] = field(default_factory=list)
    """(position, reason, detail) for each record that did not become a document."""
    consumed_bytes: int = 0


def token_dtype(vocab_size: int) -> str:
    """The narrowest unsigned dtype that holds every id of a vocabulary of this size."""
    return "uint16" if vocab_size <= 1 << 16 else "uint32"


class DocumentEncoder:
    """Encodes chunks of raw records with one tokenizer and one format."""

    def __init__(self, spec: EncoderSpec):
        from tokenizers import Tokenizer

        self.spec = spec
        self.tokenizer = Tokenizer.from_str(spec.tokenizer_json)
        self.split_long = exact_split_supported(spec.tokenizer_json)
        self.dtype = np.dtype(spec.dtype)

    def encode(self, chunk: RawChunk) -> EncodedChunk:
        out = EncodedChunk(chunk.start, len(chunk.records), np.empty(0, self.dtype), np.empty(0, np.int64))
        out.consumed_bytes = chunk.consumed_bytes
        texts: list[str] = []
        docs: list[str | np.ndarray] = []
        for offset, raw in enumerate(chunk.records):
            try:
                doc = self._document(raw)
            except BadRecordError as e:
                out.records += 1
                out.skipped.append((chunk.start + offset, e.reason, e.detail))
                continue
            if doc is None:
                continue
            out.records += 1
            if isinstance(doc, str):
                out.chars += len(doc)
                out.utf8_bytes += len(doc.encode("utf-8", "surrogatepass"))
                texts.append(doc)
            docs.append(doc)
        token_lists = self._tokenize(texts)
        out.tokens, out.lengths = self._assemble(docs, token_lists)
        return out

    def _document(self, raw: Any) -> str | np.ndarray | None:
        if isinstance(raw, PlainText):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise BadRecordError("invalid_utf8", f"byte {e.start} is not valid UTF-8") from None
            if not text or text.isspace():
                raise BadRecordError("empty_document", "the text file is empty or only whitespace")
            return text
        if isinstance(raw, bytes):
            if not raw or raw.isspace():
                return None
            raw = _parse_json_line(raw)
        if not isinstance(raw, dict):
            raise BadRecordError("wrong_type", f"record is a JSON {type(raw).__name__}, not an object")
        if PRETOKENIZED_KEY in raw:
            return self._pretokenized(raw[PRETOKENIZED_KEY])
        return self.spec.format.extract_text(raw)

    def _pretokenized(self, ids: Any) -> np.ndarray:
        if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
            raise BadRecordError("wrong_type", f"{PRETOKENIZED_KEY!r} must be a list of integers")
        if not ids:
            raise BadRecordError("empty_document", f"{PRETOKENIZED_KEY!r} is empty")
        arr = np.asarray(ids, dtype=np.int64)
        if arr.min() < 0 or arr.max() >= self.spec.vocab_size:
            raise BadRecordError(
                "token_out_of_range",
                f"{PRETOKENIZED_KEY!r} holds ids outside [0, {self.spec.vocab_size}): min {arr.min()}, max {arr.max()}",
            )
        return arr.astype(self.dtype)

    def _tokenize(self, texts: list[str]) -> list[list[int]]:
        limit = self.spec.long_doc_chars
        if not self.split_long or all(len(t) <= limit for t in texts):
            return [e.ids for e in self.tokenizer.encode_batch_fast(texts, add_special_tokens=False)]
        pieces: list[str] = []
        counts: list[int] = []
        for text in texts:
            parts = split_text(text, limit)
            pieces.extend(parts)
            counts.append(len(parts))
        encoded = self.tokenizer.encode_batch_fast(pieces, add_special_tokens=False)
        out: list[list[int]] = []
        i = 0
        for n in counts:
            ids = encoded[i].ids
            for e in encoded[i + 1 : i + n]:
                ids.extend(e.ids)
            out.append(ids)
            i += n
        return out

    def _assemble(self, docs: list[str | np.ndarray], token_lists: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
        bos, eos = self.spec.bos_id, self.spec.eos_id
        extra = (bos is not None) + (eos is not None)
        lengths = np.empty(len(docs), dtype=np.int64)
        texts = iter(token_lists)
        bodies: list[Any] = []
        for i, doc in enumerate(docs):
            body = next(texts) if isinstance(doc, str) else doc
            bodies.append(body)
            lengths[i] = len(body) + (extra if isinstance(doc, str) else 0)
        tokens = np.empty(int(lengths.sum()), dtype=self.dtype)
        pos = 0
        for doc, body in zip(docs, bodies):
            is_text = isinstance(doc, str)
            if is_text and bos is not None:
                tokens[pos] = bos
                pos += 1
            tokens[pos : pos + len(body)] = body
            pos += len(body)
            if is_text and eos is not None:
                tokens[pos] = eos
                pos += 1
        return tokens, lengths


def _parse_json_line(line: bytes) -> Any:
    try:
        return orjson.loads(line)
    except orjson.JSONDecodeError as e:
        try:
            line.decode("utf-8")
        except UnicodeDecodeError as u:
            raise BadRecordError("invalid_utf8", f"byte {u.start} of the line is not valid UTF-8") from None
        raise BadRecordError("malformed_json", str(e)) from None


_worker_encoders: dict[int, DocumentEncoder] = {}


def init_worker(parent_pid: int, threads: int) -> None:
    """Process-pool initializer: cap the tokenizer's threads, and exit if the driver dies.

    ``threads`` caps the tokenizer's own thread pool so that workers do not oversubscribe cores.
    """
    os.environ["RAYON_NUM_THREADS"] = str(threads)
    threading.Thread(target=_exit_with_parent, args=(parent_pid,), daemon=True).start()


def warm_up() -> None:
    """A no-op task that makes the pool start its processes (and their imports) right away."""


def _exit_with_parent(parent_pid: int) -> None:
    while os.getppid() == parent_pid:
        time.sleep(1.0)
    os._exit(1)


def encode_in_worker(spec_dir: str, spec_index: int, chunk: RawChunk) -> EncodedChunk:
    """Process-pool task: encode a chunk with this worker's encoder for spec ``spec_index``."""
    encoder = _worker_encoders.get(spec_index)
    if encoder is None:
        with open(os.path.join(spec_dir, f"{spec_index}.pkl"), "rb") as f:
            encoder = _worker_encoders[spec_index] = DocumentEncoder(pickle.load(f))
    return encoder.encode(chunk)
