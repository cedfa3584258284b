"""Raw records to token ids and loss-mask spans: the work a cache-building worker does.

This module imports only the tokenizer backends (``fastokens``, ``tokenizers``), ``numpy``, ``orjson`` and the
format definitions, so that worker processes start fast. A chunk of raw records comes in; the concatenated token ids, one length
per document, the loss-mask spans of formats that mask (``[start, end)`` token ranges relative to
each document: the tokens trained on), and an account of every record that was skipped (position,
reason, detail) come out.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tokenmix.formats.backends import FAST, char_offsets, fast_ids, load_fast, load_reference
from tokenmix.formats.base import BadRecordError, Rendered, token_ids
from tokenmix.formats.encoder_spec import PRETOKENIZED_KEY, EncoderSpec, format_context
from tokenmix.formats.long_docs import split_text
from tokenmix.formats.tokenizer_facts import tokenizer_facts
from tokenmix.sources.json_lines import JsonLineError, parse_json_line
from tokenmix.sources.shards import PlainText, RawChunk

LONG_DOC_BATCH_CHARS = 4_000_000
"""Characters of long-document pieces tokenized in one call. The tokenizer's ``Encoding``s cost about 100 bytes a token
while a call runs, so this bounds a long document's transient memory (about 100 MB) whatever its length, and still gives
the tokenizer's threads dozens of pieces at once."""


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


class DocumentEncoder:
    """Encodes chunks of raw records with one tokenizer and one format."""

    def __init__(self, spec: EncoderSpec):
        self.spec = spec
        self.fast = load_fast(spec.tokenizer_json) if spec.backend == FAST else None
        facts = tokenizer_facts(spec.tokenizer_json)
        self.byte_lengths = facts.byte_lengths if self.fast is not None else None
        self.split_long = facts.exact_split
        self.dtype = np.dtype(spec.dtype)
        self.render = spec.format.bind(format_context(spec, (self.fast or self.tokenizer).token_to_id))
        self.masked = spec.format.masks_loss
        special = spec.format.adds_special_tokens
        self.bos = spec.bos_id if special else None
        self.eos = spec.eos_id if special else None
        self.min_len, self.max_len = spec.format.length_limits()

    @functools.cached_property
    def tokenizer(self) -> Any:
        """The Hugging Face ``tokenizers.Tokenizer``: the backend itself, or (with ``fastokens``) for character offsets."""
        return load_reference(self.spec.tokenizer_json)

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
            parts = doc if isinstance(doc, list) else [doc]  # a record may be several documents (a preference pair)
            docs.extend(parts)
            where.extend([chunk.start + offset] * len(parts))
        if not self.masked and all(isinstance(d, Rendered) and d.char_targets is None and len(d.pieces) == 1
                                   and isinstance(d.pieces[0], str) for d in docs):
            self._assemble_plain(out, docs, *self._tokenize([d.pieces[0] for d in docs]), where)  # type: ignore[arg-type, union-attr]
        else:
            self._assemble(out, docs, self._tokenize_documents(docs), where)
        out.skipped.sort(key=lambda s: s[0])
        return out

    def _document(self, raw: Any) -> Rendered | list[Rendered] | np.ndarray | None:
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
            try:
                raw = parse_json_line(raw)
            except JsonLineError as e:
                raise BadRecordError(e.reason, e.detail) from None
        if not isinstance(raw, dict):
            raise BadRecordError("wrong_type", f"record is a JSON {type(raw).__name__}, not an object")
        if PRETOKENIZED_KEY in raw and not self.spec.format.reads_token_ids:
            return self._pretokenized(raw[PRETOKENIZED_KEY])
        return self.render(raw)

    def _pretokenized(self, ids: Any) -> np.ndarray:
        return token_ids(ids, PRETOKENIZED_KEY, self.spec.vocab_size).astype(self.dtype)

    def _tokenize_documents(self, docs: list[Rendered | np.ndarray]) -> list[list[Any]]:
        """Every document's pieces as token ids; a document marked by characters (chat) gets its ids and their offsets."""
        texts = [p for d in docs if isinstance(d, Rendered) and d.char_targets is None for p in d.pieces if isinstance(p, str)]
        marked = [d.pieces[0] for d in docs if isinstance(d, Rendered) and d.char_targets is not None]
        flat, bounds = self._tokenize(texts)
        ends = iter(bounds[1:].tolist())
        start = 0
        with_offsets = iter(self._with_offsets(marked))
        bodies: list[list[Any]] = []
        for doc in docs:
            if not isinstance(doc, Rendered):
                bodies.append([doc])
            elif doc.char_targets is not None:
                bodies.append([next(with_offsets)])
            else:
                body: list[Any] = []
                for piece in doc.pieces:
                    if isinstance(piece, str):
                        end = next(ends)
                        body.append(flat[start:end])
                        start = end
                    else:
                        body.append(piece)
                bodies.append(body)
        return bodies

    def _with_offsets(self, texts: list[str]) -> list[tuple[np.ndarray, np.ndarray]]:
        """Each text's token ids and their ``[start, end)`` character offsets: from ``fastokens``' ids where every token
        is a byte sequence, else (and for a text whose bytes do not add up) from ``tokenizers``."""
        if not texts:
            return []
        if self.fast is None or self.byte_lengths is None:
            return [_ids_and_offsets(e) for e in self.tokenizer.encode_batch(texts, add_special_tokens=False)]
        flat, bounds = fast_ids(self.fast, texts)
        out = []
        for text, a, b in zip(texts, bounds[:-1].tolist(), bounds[1:].tolist()):
            offsets = char_offsets(flat[a:b], text, self.byte_lengths)
            out.append(_ids_and_offsets(self.tokenizer.encode(text, add_special_tokens=False)) if offsets is None else (flat[a:b], offsets))
        return out

    def _tokenize(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """The texts' token ids, one after another in an array of the spec's dtype, text ``i``'s at
        ``flat[bounds[i]:bounds[i + 1]]``. Texts longer than ``long_doc_chars`` are split where splitting is exact, and
        pieces are tokenized ``LONG_DOC_BATCH_CHARS`` at a time, so a long text costs the dtype's width a token, not a
        Python int and an ``Encoding``."""
        limit = self.spec.long_doc_chars
        if not self.split_long or all(len(t) <= limit for t in texts):
            return self._ids(texts)
        pieces = ((i, piece) for i, text in enumerate(texts) for piece in split_text(text, limit))
        arrays: list[np.ndarray] = []
        counts = np.zeros(len(texts), np.int64)
        for batch in _bounded_batches(pieces, LONG_DOC_BATCH_CHARS):
            flat, bounds = self._ids([piece for _, piece in batch])
            arrays.append(flat)
            np.add.at(counts, [i for i, _ in batch], np.diff(bounds))
        return (np.concatenate(arrays) if arrays else np.empty(0, self.dtype)), np.concatenate(([0], np.cumsum(counts)))

    def _ids(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """``_tokenize`` without splitting: one call of the spec's backend, special tokens in the text recognised, none
        added."""
        if self.fast is not None:
            ids, bounds = fast_ids(self.fast, texts)
            return ids.astype(self.dtype), bounds
        ids = [e.ids for e in self.tokenizer.encode_batch_fast(texts, add_special_tokens=False)]
        bounds = np.zeros(len(ids) + 1, np.int64)
        np.cumsum([len(i) for i in ids], out=bounds[1:])
        return np.fromiter(itertools.chain.from_iterable(ids), self.dtype, count=int(bounds[-1])), bounds

    def _assemble_plain(self, out: EncodedChunk, docs: list[Rendered], flat: np.ndarray, bounds: np.ndarray, where: list[int]) -> None:
        """``_assemble`` for documents of one text each and no loss masks (plain text, the bulk of most corpora), in a few
        array operations instead of a few per document."""
        body = np.diff(bounds)
        lengths = body + (self.bos is not None) + (self.eos is not None)
        keep = np.ones(len(docs), bool)
        if self.max_len is not None:
            keep &= lengths <= self.max_len
        if self.min_len is not None:
            keep &= lengths >= self.min_len
        if not keep.all():
            for n in np.flatnonzero(~keep).tolist():
                out.skipped.append((where[n], *self._length_problem(int(lengths[n]))))  # type: ignore[misc]
            flat, body, lengths = flat[np.repeat(keep, body)], body[keep], lengths[keep]
        ends = np.cumsum(lengths)
        out.lengths = lengths
        out.tokens = np.empty(int(ends[-1]) if len(ends) else 0, self.dtype)
        special = np.zeros(len(out.tokens), bool)
        if self.bos is not None:
            special[ends - lengths] = True
            out.tokens[ends - lengths] = self.bos
        if self.eos is not None:
            special[ends - 1] = True
            out.tokens[ends - 1] = self.eos
        out.tokens[~special] = flat
        kept = [d for d, k in zip(docs, keep.tolist()) if k]
        out.chars += sum(d.chars for d in kept)
        out.utf8_bytes += sum(d.utf8_bytes for d in kept)

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
            ids, offsets = body[0]
            return [ids], _token_spans(offsets, doc.char_targets) if self.masked else []
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


def _ids_and_offsets(encoding: Any) -> tuple[np.ndarray, np.ndarray]:
    """A ``tokenizers`` encoding's ids and ``[start, end)`` character offsets as arrays."""
    return np.asarray(encoding.ids, np.int64), np.asarray(encoding.offsets, np.int64).reshape(-1, 2)


def chunk_difference(reference: EncodedChunk, other: EncodedChunk) -> str | None:
    """Where two encodings of the same chunk first differ in what the cache would hold (documents, tokens, loss spans,
    skipped records), or None."""
    if reference.skipped != other.skipped:
        return f"the records skipped differ: {reference.skipped[:2]} with tokenizers, {other.skipped[:2]} with fastokens"
    for name in ("lengths", "tokens", "spans", "span_counts"):
        want, got = getattr(reference, name), getattr(other, name)
        if np.array_equal(want, got):
            continue
        n = min(len(want), len(got))
        unequal = np.flatnonzero(want[:n] != got[:n])
        at = int(unequal[0]) if len(unequal) else n
        where = f" (document {int(np.searchsorted(np.cumsum(reference.lengths), at, side='right'))})" if name == "tokens" else ""
        return f"{name} differ at {at}{where}: tokenizers gives {want[at:at + 3].tolist()}, fastokens {got[at:at + 3].tolist()}"
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


def _token_spans(bounds: np.ndarray, char_spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Token ranges overlapping character spans, merged where they touch (``bounds``: each token's ``[start, end)``
    characters, ascending, as a BPE's are)."""
    if not len(bounds):
        return []
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
