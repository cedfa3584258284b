"""Raw records to token ids and loss-mask spans: the work a cache-building worker does.

This module imports only ``tokenizers``, ``numpy``, ``orjson`` and the format definitions, so that
worker processes start fast. A chunk of raw records comes in; the concatenated token ids, one length
per document, the loss-mask spans of formats that mask (``[start, end)`` token ranges relative to
each document: the tokens trained on), and an account of every record that was skipped (position,
reason, detail) come out.
"""

from __future__ import annotations

from collections.abc import Container, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from tokenmix.formats.base import BadRecordError, FormatContext, LmDatasetFormatBase, Rendered
from tokenmix.formats.long_docs import exact_split_supported, split_text
from tokenmix.sources.shards import PlainText, RawChunk

PRETOKENIZED_KEY = "input_ids"
DEFAULT_LONG_DOC_CHARS = 100_000
LONG_DOC_BATCH_CHARS = 4_000_000
"""Characters of long-document pieces tokenized in one call. The tokenizer's ``Encoding``s cost about 100 bytes a token
while a call runs, so this bounds a long document's transient memory (about 100 MB) whatever its length, and still gives
the tokenizer's threads dozens of pieces at once."""


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
    special_tokens: tuple[tuple[str, str], ...] = ()
    """The tokenizer's named special tokens (``bos_token``, ...), as a chat template sees them."""
    chat_template: str | None = None
    """The tokenizer's own chat template."""


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
    """(position, reason, detail) for each record that did not become a document, in position order."""
    consumed_bytes: int = 0
    spans: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    """Loss-mask spans, flat ``start, end`` pairs relative to their document (formats that mask only)."""
    span_counts: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    """Values in ``spans`` per document (twice its span count)."""
    loss_tokens: int = 0
    """Positions trained on: tokens that are targets and are not their document's first token."""
    source_digest: int = 0
    """``RawChunk.digest`` of the raw records: the ledger sums it per shard to recognise the input it read."""


def token_dtype(vocab_size: int) -> str:
    """The narrowest unsigned dtype that holds every id of a vocabulary of this size."""
    return "uint16" if vocab_size <= 1 << 16 else "uint32"


def format_context(spec: EncoderSpec, token_to_id: Any) -> FormatContext:
    """What the spec's format may ask of the tokenizer (``token_to_id`` is the backend tokenizer's)."""
    return FormatContext(token_to_id, spec.vocab_size, dict(spec.special_tokens), spec.chat_template)


class DocumentEncoder:
    """Encodes chunks of raw records with one tokenizer and one format."""

    def __init__(self, spec: EncoderSpec):
        from tokenizers import Tokenizer

        self.spec = spec
        self.tokenizer = Tokenizer.from_str(spec.tokenizer_json)
        self.split_long = exact_split_supported(spec.tokenizer_json)
        self.dtype = np.dtype(spec.dtype)
        self.render = spec.format.bind(format_context(spec, self.tokenizer.token_to_id))
        self.masked = spec.format.masks_loss
        special = spec.format.adds_special_tokens
        self.bos = spec.bos_id if special else None
        self.eos = spec.eos_id if special else None
        self.min_len, self.max_len = spec.format.length_limits()

    def encode(self, chunk: RawChunk) -> EncodedChunk:
        out = EncodedChunk(chunk.start, len(chunk.records), np.empty(0, self.dtype), np.empty(0, np.int64))
        out.consumed_bytes = chunk.consumed_bytes
        out.source_digest = chunk.digest()
        docs: list[Rendered | np.ndarray] = []
        where: list[int] = []
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
            docs.append(doc)
            where.append(chunk.start + offset)
        bodies = self._tokenize_documents(docs)
        self._assemble(out, docs, bodies, where)
        out.skipped.sort(key=lambda s: s[0])
        return out

    def _document(self, raw: Any) -> Rendered | np.ndarray | None:
        if isinstance(raw, PlainText):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise BadRecordError("invalid_utf8", f"byte {e.start} is not valid UTF-8") from None
            if not text or text.isspace():
                raise BadRecordError("empty_document", "the text file is empty or only whitespace")
            return self.render(self.spec.format.plain_text_record(text))
        if isinstance(raw, bytes):
            if not raw or raw.isspace():
                return None
            raw = _parse_json_line(raw)
        if not isinstance(raw, dict):
            raise BadRecordError("wrong_type", f"record is a JSON {type(raw).__name__}, not an object")
        if PRETOKENIZED_KEY in raw:
            return self._pretokenized(raw[PRETOKENIZED_KEY])
        return self.render(raw)

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

    def _tokenize_documents(self, docs: list[Rendered | np.ndarray]) -> list[list[Any]]:
        """Every document's pieces as token ids; a document marked by characters (chat) also gets its token offsets."""
        texts = [p for d in docs if isinstance(d, Rendered) and d.char_targets is None for p in d.pieces if isinstance(p, str)]
        marked = [d.pieces[0] for d in docs if isinstance(d, Rendered) and d.char_targets is not None]
        plain = iter(self._tokenize(texts))
        with_offsets = iter(self.tokenizer.encode_batch(marked, add_special_tokens=False) if marked else [])
        bodies: list[list[Any]] = []
        for doc in docs:
            if not isinstance(doc, Rendered):
                bodies.append([doc])
            elif doc.char_targets is not None:
                bodies.append([next(with_offsets)])
            else:
                bodies.append([next(plain) if isinstance(p, str) else p for p in doc.pieces])
        return bodies

    def _tokenize(self, texts: list[str]) -> list[list[int] | np.ndarray]:
        """Each text's token ids: a list for a text of at most ``long_doc_chars`` characters, an array of the spec's dtype
        for a longer one when splitting is exact. Texts and pieces are tokenized together, ``LONG_DOC_BATCH_CHARS`` at a
        time, so a long text's memory grows by the dtype's width a token, not by a Python int and an ``Encoding``."""
        limit = self.spec.long_doc_chars
        if not self.split_long or all(len(t) <= limit for t in texts):
            return [e.ids for e in self.tokenizer.encode_batch_fast(texts, add_special_tokens=False)]
        parts: dict[int, list[np.ndarray]] = {i: [] for i, text in enumerate(texts) if len(text) > limit}
        ids: dict[int, list[int] | np.ndarray] = {}
        pieces = ((i, piece) for i, text in enumerate(texts) for piece in split_text(text, limit))
        for batch in _bounded_batches(pieces, LONG_DOC_BATCH_CHARS):
            for (i, _), piece_ids in zip(batch, self._batch_ids(batch, parts)):
                if i in parts:
                    parts[i].append(piece_ids)
                else:
                    ids[i] = piece_ids
        return [np.concatenate(parts[i]) if i in parts else ids[i] for i in range(len(texts))]

    def _batch_ids(self, batch: list[tuple[int, str]], long: Container[int]) -> list[list[int] | np.ndarray]:
        """Token ids of each ``(text index, piece)``: an array for a piece of a ``long`` text, else a list. The batch's
        ``Encoding``s are freed on return, before the next batch is tokenized."""
        encoded = self.tokenizer.encode_batch_fast([piece for _, piece in batch], add_special_tokens=False)
        return [np.asarray(e.ids, self.dtype) if i in long else e.ids for (i, _), e in zip(batch, encoded)]

    def _assemble(self, out: EncodedChunk, docs: list[Rendered | np.ndarray], bodies: list[list[Any]], where: list[int]) -> None:
        """Concatenate the kept documents' tokens (with BOS/EOS), their spans, and skip those the length limits refuse."""
        token_parts: list[Any] = []
        lengths: list[int] = []
        spans: list[int] = []
        span_counts: list[int] = []
        for doc, body, position in zip(docs, bodies, where):
            if not isinstance(doc, Rendered):  # pre-tokenized: stored as it is, every token a target
                parts, doc_spans = body, [(0, len(body[0]))]
            else:
                parts, doc_spans = self._document_parts(doc, body)
            length = sum(len(p) for p in parts)
            problem = self._length_problem(length)
            if problem is not None:
                out.skipped.append((position, *problem))
                continue
            token_parts.extend(parts)
            lengths.append(length)
            if isinstance(doc, Rendered):
                out.chars += doc.chars
                out.utf8_bytes += doc.utf8_bytes
            if self.masked:
                span_counts.append(2 * len(doc_spans))
                for a, b in doc_spans:
                    spans.extend((a, b))
                    out.loss_tokens += max(0, b - max(a, 1))
        out.lengths = np.asarray(lengths, np.int64)
        out.tokens = np.empty(int(out.lengths.sum()), self.dtype)
        pos = 0
        for part in token_parts:
            out.tokens[pos : pos + len(part)] = part
            pos += len(part)
        if self.masked:
            out.spans = np.asarray(spans, np.int64)
            out.span_counts = np.asarray(span_counts, np.int64)

    def _document_parts(self, doc: Rendered, body: list[Any]) -> tuple[list[Any], list[tuple[int, int]]]:
        """A rendered document's token parts in order (BOS, pieces, EOS) and its target spans (when masking)."""
        if doc.char_targets is not None:
            encoding = body[0]
            return [encoding.ids], _token_spans(encoding.offsets, doc.char_targets) if self.masked else []
        head = [[self.bos]] if self.bos is not None else []
        tail = [[self.eos]] if self.eos is not None else []
        parts = head + body + tail
        if not self.masked:
            return parts, []
        targets = doc.targets if doc.targets is not None else [True] * len(body)
        flags = [False] * len(head) + targets + targets[-1:] * len(tail)
        doc_spans: list[tuple[int, int]] = []
        pos = 0
        for part, flag in zip(parts, flags):
            end = pos + len(part)
            if flag and end > pos:
                if doc_spans and doc_spans[-1][1] == pos:
                    doc_spans[-1] = (doc_spans[-1][0], end)
                else:
                    doc_spans.append((pos, end))
            pos = end
        return parts, doc_spans

    def _length_problem(self, length: int) -> tuple[str, str] | None:
        if self.max_len is not None and length > self.max_len:
            return "too_long", f"{length} tokens, more than max_seq_length {self.max_len}"
        if self.min_len is not None and length < self.min_len:
            return "too_short", f"{length} tokens, fewer than min_sequence_len {self.min_len}"
        return None


def _bounded_batches(pieces: Iterator[tuple[int, str]], max_chars: int) -> Iterator[list[tuple[int, str]]]:
    """Consecutive ``(text index, piece)`` pairs in lists of at most ``max_chars`` characters; a longer piece goes alone."""
    batch: list[tuple[int, str]] = []
    chars = 0
    for item in pieces:
        if batch and chars + len(item[1]) > max_chars:
            yield batch
            batch, chars = [], 0
        batch.append(item)
        chars += len(item[1])
    if batch:
        yield batch


def _token_spans(offsets: list[tuple[int, int]], char_spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Token ranges overlapping character spans, merged where they touch (offsets ascend, as a BPE's do)."""
    if not offsets:
        return []
    bounds = np.asarray(offsets, np.int64)
    out: list[tuple[int, int]] = []
    for a, b in sorted(char_spans):
        first = int(np.searchsorted(bounds[:, 1], a, side="right"))
        last = int(np.searchsorted(bounds[:, 0], b, side="left"))
        if last <= first:
            continue
        if out and out[-1][1] >= first:
            out[-1] = (out[-1][0], max(out[-1][1], last))
        else:
            out.append((first, last))
    return out


def _parse_json_line(line: bytes) -> Any:
    try:
        return orjson.loads(line)
    except orjson.JSONDecodeError as e:
        try:
            line.decode("utf-8")
        except UnicodeDecodeError as u:
            raise BadRecordError("invalid_utf8", f"byte {u.start} of the line is not valid UTF-8") from None
        raise BadRecordError("malformed_json", str(e)) from None
