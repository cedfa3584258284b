"""UL2R denoising examples with the meaning of marin's Levanter ``Ul2rDataset`` (``lib/levanter/.../data/ul2r.py``).

Each document of a text cache gets a task (R/X span corruption or S prefix continuation), drawn once for all documents
from the seed. Documents are packed greedily in cache order, by the length their denoised form will have, into
examples of ``seq_len`` tokens; each document in an example becomes

    [task token] inputs targets

where R/X inputs are the document with each noise span replaced by a sentinel and targets are the sentinels each
followed by their span, and S inputs are a prefix, then the first sentinel, and targets the rest. The loss is on the
targets only (position ``i`` is trained when token ``i + 1`` is a target of the same document and token ``i`` is not
padding); inputs are what Levanter's prefix-LM attention sees bidirectionally (``input_mask``).

Levanter's randomness is reproduced bit for bit by drawing from JAX's PRNG exactly as it does: the per-document tasks
are ``jax.random.choice`` of the first half of ``split(PRNGKey(seed))``; the spans of the ``k``-th document of an
example come from the ``k``-th key split off the second half, the same for every example (Levanter passes one key to
every example). The rest is integer arithmetic done here in numpy, including Levanter's quirks, which this module
keeps because they decide what is trained on: an input or target that holds token id 0 ends at it (Levanter finds
their lengths as the first 0), a document of fewer than 3 tokens is written as the example's whole token row OR-ed
in place, denoised content longer than the room left wraps to the example's start, and a token equal to the pad id
is never a loss position.

Levanter ties every example to every document before it (greedy packing over the whole cache), so the plan needs
the finished cache: it waits for it, as Levanter does.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from tokenmix.cache.reader import TokenCache
from tokenmix.datasets.base import DirectDataset, TokenBatch
from tokenmix.datasets.packing import next_fit

logger = logging.getLogger(__name__)

UL2R_PAD_ID = 0
"""The pad id a ``ul2r`` source's examples use. Levanter ORs each document's zero-padded row into the example, so any
other value would be OR-ed into the documents before it; marin's own caller passes ``tokenizer.pad_token_id or 0``,
which is 0 for the GPT-2 tokenizers its UL2R configs name."""

MIN_DENOISED_LENGTH = 3
"""Documents shorter than this are not denoised (Levanter's ``MIN_S_LENGTH``)."""


@dataclass(frozen=True)
class DenoisingTask:
    """One UL2R task: ``rx`` (span corruption with ``mask_prob`` and ``mean_span_length``) or ``s`` (prefix continuation)."""

    kind: Literal["rx", "s"]
    task_token_id: int
    mask_prob: float = 0.0
    mean_span_length: float = 0.0
    random_roll: bool = False


@dataclass(frozen=True)
class DenoisedExample:
    """One example as Levanter's ``LmExample``: tokens, loss mask, prefix-LM input mask, and each position's document
    (Levanter's segment ids: the cache row, -1 for padding)."""

    tokens: np.ndarray
    loss_mask: np.ndarray
    input_mask: np.ndarray
    documents: np.ndarray


def span_counts(length: np.ndarray, mask_prob: float, mean_span_length: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Noise tokens, noise spans and kept tokens of documents of ``length`` tokens (float32 arithmetic, as Levanter)."""
    adjusted = np.maximum(np.asarray(length, np.int64), 2)
    noise = np.round(adjusted.astype(np.float32) * np.float32(mask_prob)).astype(np.int64)
    noise = np.clip(noise, 1, adjusted - 1)
    spans = np.maximum(np.round(noise.astype(np.float32) / np.float32(mean_span_length)).astype(np.int64), 1)
    return noise, spans, adjusted - noise


def denoised_lengths(tasks: Sequence[DenoisingTask], task_of: np.ndarray, length: np.ndarray) -> np.ndarray:
    """The room each document takes in an example once denoised (what packing counts): task token, sentinels, tokens."""
    length = np.asarray(length, np.int64)
    out = np.empty(len(length), np.int64)
    for t, task in enumerate(tasks):
        mine = task_of == t
        n = length[mine]
        if task.kind == "s":
            out[mine] = np.where(n < MIN_DENOISED_LENGTH, n, n + 2)
        else:
            spans = span_counts(n, task.mask_prob, task.mean_span_length)[1] + int(task.random_roll)
            out[mine] = 1 + 2 * spans + n
    return out


class Ul2rDataset(DirectDataset):
    """UL2R denoising examples of ``seq_len`` tokens from a text cache (Levanter's ``Ul2rDataset``), a pure function of
    the example index, the cache and ``seed``."""

    def __init__(self, cache: TokenCache, seq_len: int, source_id: int = 0, *, tasks: Sequence[DenoisingTask],
                 task_probs: Sequence[float], seed: int, sentinel_ids: np.ndarray, pad_id: int,
                 max_segments_per_example: int = 64):
        if seq_len < 2:
            raise ValueError(f"ul2r: seq_len must be >= 2, got {seq_len}")
        if len(tasks) != len(task_probs) or not tasks:
            raise ValueError(f"ul2r: give one probability per task, got {len(task_probs)} for {len(tasks)} tasks")
        self.cache = cache
        self.seq_len = seq_len
        self.tokens_per_example = seq_len
        self.source_id = source_id
        self.tasks = tuple(tasks)
        self.seed = seed
        self.sentinel_ids = np.asarray(sentinel_ids, np.int64)
        self.pad_id = pad_id
        self.max_segments = max_segments_per_example
        logger.warning("%s: UL2R batches hold Levanter's tokens and loss mask, but no prefix-LM mask: a model trained on them "
                       "attends causally over the inputs, where Levanter attends bidirectionally; a trainer of your own finds "
                       "the mask in Ul2rDataset.example(i).input_mask", cache.location)
        if not cache.is_finished():
            logger.info("%s: waiting for the cache to finish: UL2R packs every document in order", cache.location)
            cache.wait_until_finished()
        self._bounds = cache.row_bounds(0, cache.num_rows())
        lengths = np.diff(self._bounds)
        if len(lengths) and int(lengths.min()) < 1:
            raise ValueError(f"{cache.location}: row {int(np.argmin(lengths))} is empty; a ul2r cache holds no empty documents "
                             "(rebuild it with format ul2r, which skips them)")
        self._keys = _Keys(seed, len(self.tasks), seq_len, max_segments_per_example)
        self.task_of = self._keys.tasks_of(len(lengths), task_probs)
        sizes = np.minimum(denoised_lengths(self.tasks, self.task_of, lengths), seq_len)
        starts, _ = next_fit(sizes, seq_len, max_segments_per_example, complete=True)
        self._packs = np.append(starts, len(lengths))

    def __repr__(self) -> str:
        return f"Ul2rDataset({self.cache.location}, seq_len={self.seq_len}, seed={self.seed})"

    def is_finite(self) -> bool:
        return True

    def current_len(self) -> int:
        return len(self._packs) - 1

    def final_len(self) -> int:
        return len(self._packs) - 1

    def example(self, index: int) -> DenoisedExample:
        """Example ``index`` with everything Levanter's ``LmExample`` holds."""
        first, stop = int(self._packs[index]), int(self._packs[index + 1])
        begin, end = int(self._bounds[first]), int(self._bounds[stop])
        row = np.zeros(self.seq_len, np.int64)
        tokens = self.cache.read_tokens(begin, min(end, begin + self.seq_len))
        row[: len(tokens)] = tokens
        lengths = np.minimum(np.diff(self._bounds[first : stop + 1]), self.seq_len)
        return self._denoise(row, np.arange(first, stop), lengths)

    def _write(self, idx: np.ndarray, out: TokenBatch, rows: np.ndarray) -> Callable[[], None]:
        def finish() -> None:
            for i, row in zip(idx.tolist(), rows.tolist()):
                ex = self.example(i)
                _, rank = np.unique(ex.documents, return_inverse=True)
                out.tokens[row] = ex.tokens
                out.loss_mask[row] = ex.loss_mask
                out.segment_ids[row] = np.where(ex.documents < 0, -1, rank - int(ex.documents.min() < 0))
                out.source_ids[row] = self.source_id

        return finish

    def _denoise(self, row: np.ndarray, documents: np.ndarray, lengths: np.ndarray) -> DenoisedExample:
        n = self.seq_len
        positions = np.arange(n)
        tokens = np.zeros(n, np.int64)
        input_mask = np.zeros(n, bool)
        owner = np.full(n, -1, np.int64)
        in_start, out_start = 0, 0
        room = denoised_lengths(self.tasks, self.task_of[documents], lengths)
        for slot, (doc, length, size) in enumerate(zip(documents.tolist(), lengths.tolist(), room.tolist())):
            source = np.roll(row, -in_start)
            inputs, content = self._document(slot, self.tasks[int(self.task_of[doc])], source, length)
            tokens |= np.roll(content, out_start)
            input_mask |= np.roll(positions < inputs, out_start)
            owner[(positions >= out_start) & (positions < out_start + size)] = doc
            in_start += length
            out_start += size
        following = np.append(owner[1:] == owner[:-1], True)
        loss = np.roll(~input_mask, -1) & following & (tokens != self.pad_id)
        return DenoisedExample(tokens.astype(np.int32), loss, input_mask, owner)

    def _document(self, slot: int, task: DenoisingTask, source: np.ndarray, length: int) -> tuple[int, np.ndarray]:
        """(input tokens, the document's ``seq_len`` tokens from its task token on) for the document at ``source[:length]``,
        ``slot``-th of its example."""
        if length < MIN_DENOISED_LENGTH:
            return length, source
        body = source[:-1]
        if task.kind == "s":
            inputs, out = self._continuation(slot, body, length)
        else:
            inputs, out = self._span_corruption(slot, task, body, length)
        return inputs + 1, np.concatenate([[task.task_token_id], out])

    def _continuation(self, slot: int, body: np.ndarray, length: int) -> tuple[int, np.ndarray]:
        pivot = int(self._keys.pivot(slot, length))
        kept = np.where(np.arange(len(body)) < length, body, 0)
        out = np.where(np.arange(len(body)) < pivot, kept, np.roll(kept, 1))
        out[pivot] = self.sentinel_ids[0]
        return pivot, out

    def _span_corruption(self, slot: int, task: DenoisingTask, body: np.ndarray, length: int) -> tuple[int, np.ndarray]:
        width = len(body)
        noise = self._noise_mask(slot, task, length, width)
        target_reach = int(np.max(np.where(noise, np.arange(width), 0))) + 1
        inputs = _sentinel_spans(body, length, noise, self.sentinel_ids, first_sentinel=False)
        targets = _sentinel_spans(body, target_reach, ~noise, self.sentinel_ids, first_sentinel=True)
        input_len, target_len = _first_zero(inputs), _first_zero(targets)
        total = input_len + target_len
        overflow = max(total - (self.seq_len - 1), 0)
        drop_inputs = overflow * input_len // max(total, 1) if total > 0 else 0
        keep_inputs = max(input_len - drop_inputs, 0)
        keep_targets = max(target_len - (overflow - drop_inputs), 0)
        targets = np.where(np.arange(width) < keep_targets, targets, self.pad_id)
        return keep_inputs, np.where(np.arange(width) < keep_inputs, inputs, np.roll(targets, keep_inputs))

    def _noise_mask(self, slot: int, task: DenoisingTask, length: int, width: int) -> np.ndarray:
        noise_tokens, spans, kept_tokens = (int(v[0]) for v in span_counts(np.array([length]), task.mask_prob, task.mean_span_length))
        noise_lengths = _split_lengths(noise_tokens, spans, self._keys.permutation(slot, 0))
        kept_lengths = _split_lengths(kept_tokens, spans, self._keys.permutation(slot, 1))
        runs = np.stack([kept_lengths, noise_lengths], axis=1).reshape(-1)[:width]
        starts = np.cumsum(runs)
        run_of = np.cumsum(np.bincount(starts[starts < width], minlength=width)[:width])
        positions = np.arange(width)
        mask = (run_of % 2 == 1) & (run_of < 2 * spans) & (positions < length)
        if not task.random_roll:
            return mask
        offset = int(self._keys.roll(slot, length))
        rolled = np.where(positions < offset, np.roll(mask, offset - length), np.roll(mask, offset))
        return rolled & (positions < length)


def _split_lengths(items: int, parts: int, permutation: np.ndarray) -> np.ndarray:
    """Levanter's random split of ``items`` into ``parts`` runs: cuts after the items whose place in ``permutation``
    is among the ``parts - 1`` lowest; run ``k``'s length at ``k``, the rest of the width after the last run."""
    width = len(permutation)
    if parts <= 1:
        out = np.zeros(width, np.int64)
        out[0] = items
        return out
    positions = np.arange(width)
    ranked = np.where(positions < items - 1, permutation, width)
    threshold = np.sort(ranked)[min(parts - 1, width - 1)]
    cut_before = np.roll((ranked < threshold).astype(np.int64), 1)
    if items < width:
        cut_before[items] = 1
    run = np.cumsum(cut_before)
    return np.bincount(run[run < width], minlength=width)[:width]


def _sentinel_spans(body: np.ndarray, length: int, spans: np.ndarray, sentinels: np.ndarray, first_sentinel: bool) -> np.ndarray:
    """``body[:length]`` with each run of ``spans`` replaced by the next sentinel (led by one when ``first_sentinel``
    and no run starts it), zero-filled to ``len(body)``; reads past the end repeat the last token, as Levanter's."""
    width = len(body)
    before = np.roll(spans, 1)
    before[0] = False
    opens = spans & ~before
    inside = spans & before
    lead = first_sentinel and not opens[0]
    read = np.minimum(np.arange(length), width - 1)
    written = ~inside[read]
    is_sentinel = opens[read][written]
    values = body[read][written]
    count = np.cumsum(is_sentinel) - 1 + int(lead)
    values = np.where(is_sentinel, sentinels[count % len(sentinels)], values)
    if lead:
        values = np.concatenate([sentinels[:1], values])
    out = np.zeros(width, np.int64)
    out[: min(len(values), width)] = values[:width]
    return out


def _first_zero(values: np.ndarray) -> int:
    zeros = np.flatnonzero(values == 0)
    return int(zeros[0]) if len(zeros) else len(values)


class _Keys:
    """JAX's draws as Levanter makes them from ``PRNGKey(seed)``: the tasks of documents, and for the document in each
    slot of an example its two span permutations, roll offsets and S pivots (tabled by document length)."""

    def __init__(self, seed: int, tasks: int, seq_len: int, slots: int):
        import jax

        self._seed, self._tasks, self._width, self._slots = seed, tasks, seq_len - 1, slots
        self._task_key, chain = jax.random.split(jax.random.PRNGKey(seed))
        keys = []
        for _ in range(slots):
            key, chain = jax.random.split(chain)
            keys.append(key)
        self._slot_keys = keys
        self._tables: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    def tasks_of(self, documents: int, probs: Sequence[float]) -> np.ndarray:
        import jax
        import jax.numpy as jnp

        p = jnp.asarray(np.asarray(probs, np.float32))
        return np.asarray(jax.random.choice(self._task_key, self._tasks, shape=(documents,), p=p))

    def permutation(self, slot: int, which: int) -> np.ndarray:
        return self._table()[0][slot, which]

    def roll(self, slot: int, length: int) -> int:
        return self._table()[1][slot, length]

    def pivot(self, slot: int, length: int) -> int:
        return self._table()[2][slot, length]

    def _table(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if self._tables is None:
            import jax
            import jax.numpy as jnp

            keys = jnp.stack(self._slot_keys)
            lengths = jnp.arange(self._width + 2, dtype=jnp.int32)

            def draws(key):  # noqa: ANN001, ANN202
                span_keys = jax.random.split(key, 3)
                perms = jax.vmap(lambda k: jax.random.permutation(k, jnp.arange(self._width)))(span_keys[:2])
                rolls = jax.vmap(lambda n: jax.random.randint(span_keys[2], (), 0, n, dtype=jnp.int32))(lengths)
                pivots = jax.vmap(lambda n: jax.random.randint(key, (), 1, n - 1))(lengths)
                return perms, rolls, pivots

            perms, rolls, pivots = jax.jit(jax.vmap(draws))(keys)
            self._tables = (np.asarray(perms), np.asarray(rolls), np.asarray(pivots))
        return self._tables
