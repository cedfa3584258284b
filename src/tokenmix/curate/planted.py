"""A larger corpus made from a real one by planting edited copies of its documents at known similarity, with the truth
of which documents are duplicates: to measure a fuzzy dedup's recall and precision on a user's own data, and its time
and memory as the corpus grows (``scripts/bench_dedup_scale.py``), without downloading anything.

``plant(sources, out_dir, config)`` writes ``config.copies`` times the input: round 0 is the input shards themselves,
copied byte for byte; each later round holds one edited copy of every input document, in a source drawn at random
(so copies cross sources, as Zyda-2's do). The originals are taken in blocks, one block a task, and a block's copies
are written family after family as ``<out>/<source>/planted-<block>.jsonl.zst`` (about ``shard_documents`` a shard,
so shards stay the same size as the corpus grows). A copy is

- a **duplicate** (``duplicate_share`` of copies): a document of its family, drawn in proportion to its cluster's size
  (so cluster sizes spread as on the web, a few large), edited until its shingle Jaccard with it lies in
  ``duplicate_band``, above ``threshold``: it joins that cluster;
- or a **variant**: the original edited until its Jaccard with it lies in ``variant_band``, below ``threshold``: a
  new document, the root of a cluster of its own that later duplicates may join.

Edits are typos (a letter substituted, deleted or inserted) at random places; the Jaccard of each copy with the
document it was made from is computed exactly (shingle sets as ``minhash`` shingles them, each shingle by its 61-bit
hash) and recorded. Copies of the same family are edited independently, so two copies far from each other's base
stay far from each other (``tests/test_curate_planted.py`` checks every pair of a planted corpus).

The input's own near-duplicates are part of the truth: the originals' clusters are the connected components of every
pair of originals whose Jaccard reaches ``threshold``, found exactly (all pairs, pruned by prefix filtering: two sets
of Jaccard ``>= t`` share one of the first ``|A| - ceil(t |A|) + 1`` shingles of each in one global order, the rarest first), so a duplicate of an
original joins the original's natural cluster.

The truth, ``<out>/truth.parquet``, has a row per output document: ``source``, ``shard`` (file name), ``row`` (its
line in the shard), ``doc`` (``round * originals + index``), ``cluster`` (the ``doc`` of its cluster's root: the
first original of a natural cluster, or a variant; a copy of a text without shingles is a cluster of its own),
``kind`` (``original``, ``duplicate``, ``variant``), ``base`` (the ``doc`` it was made from) and ``jaccard`` (with its
base; 1.0 for originals). ``pair_scores`` compares clusters found by a dedup with it.

Memory: the originals' texts (each worker holds them) and one original's family of copies at a time; copies are
written as they are made. Time: about two shingle hashings and sorts per copy (its Jaccard is computed exactly).
"""

from __future__ import annotations

import logging
import math
import multiprocessing
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import zstandard

from tokenmix.curate.minhash import MinHashConfig, set_jaccard, shingle_sets

logger = logging.getLogger(__name__)

TRUTH_FILE = "truth.parquet"
KINDS = ("original", "duplicate", "variant")
TRUTH_COLUMNS = ("source", "shard", "row", "doc", "cluster", "kind", "base", "jaccard")
_TYPO_LETTERS = "etaoinshrdlucmfwypvbgkqjxz"
_SEARCH_STEPS = 24
"""Edit counts tried for one copy before settling for the closest count on the side of the threshold its band is on."""
_ZSTD_LEVEL = 3
_FREQUENCY_SLOTS = 1 << 22
"""Slots counting how often shingles occur (by hash modulo), to put each set's rarest shingles in its prefix: any
order of shingles keeps the all-pairs check exact, and rarer ones first make fewer candidate pairs."""


@dataclass(frozen=True)
class PlantConfig:
    """How many copies to plant, how similar, and what counts as a duplicate in the truth."""

    copies: int = 10
    """The output holds every input document this many times: itself and ``copies - 1`` edited copies."""
    duplicate_share: float = 0.5
    """Share of the copies that are duplicates; the rest are variants."""
    duplicate_band: tuple[float, float] = (0.9, 1.0)
    """Jaccard of a duplicate with the document it was made from (1.0: an exact copy)."""
    variant_band: tuple[float, float] = (0.3, 0.6)
    """Jaccard of a variant with its original."""
    threshold: float = 0.85
    """Two documents whose Jaccard reaches it are duplicates (the originals' natural clusters); the bands lie on either
    side of it."""
    minhash: MinHashConfig = field(default_factory=MinHashConfig)
    """How documents are shingled (its ``shingle``, ``ngram`` and ``short_documents``); Zyda-2's character 25-grams."""
    text_field: str = "text"
    seed: int = 0
    shard_documents: int = 2500
    """About how many copies each planted shard of a source holds."""
    workers: int = 1
    """Processes making copies at once."""

    def __post_init__(self) -> None:
        if self.copies < 1:
            raise ValueError(f"copies must be >= 1, got {self.copies}")
        if not 0.0 <= self.duplicate_share <= 1.0:
            raise ValueError(f"duplicate_share must be between 0 and 1, got {self.duplicate_share}")
        (dl, dh), (vl, vh) = self.duplicate_band, self.variant_band
        if not (0.0 <= vl <= vh < self.threshold < dl <= dh <= 1.0):
            raise ValueError(f"the bands must lie on either side of threshold {self.threshold}: variant_band {self.variant_band} below it, "
                             f"duplicate_band {self.duplicate_band} above it, both within [0, 1]")
        if self.workers < 1 or self.shard_documents < 1:
            raise ValueError(f"workers and shard_documents must be >= 1, got {self.workers} and {self.shard_documents}")


@dataclass(frozen=True)
class Original:
    """An input document: where it is and its record."""

    source: str
    shard: str
    row: int
    record: dict[str, Any]


def read_originals(sources: dict[str, list[str]], text_field: str = "text") -> list[Original]:
    """The records of every shard (JSON lines, plain or zstd), sources in order; a line that is not a JSON object with
    a string ``text_field`` is refused by file and line, since the truth names documents by their line."""
    originals = []
    for source, paths in sources.items():
        for path in paths:
            with open(path, "rb") as f:
                raw = zstandard.ZstdDecompressor().stream_reader(f).read() if path.endswith(".zst") else f.read()
            for row, line in enumerate(raw.split(b"\n")[: -1 if raw.endswith(b"\n") else None]):
                try:
                    record = orjson.loads(line) if line.strip() else None
                except orjson.JSONDecodeError:
                    record = None
                if not isinstance(record, dict) or not isinstance(record.get(text_field), str):
                    raise ValueError(f"{path}, line {row + 1}: not a JSON object with a string {text_field!r}; the truth names "
                                     "documents by their line, so every line must be a document: clean the shard or leave it out")
                originals.append(Original(source, os.path.basename(path), row, record))
    return originals


def natural_clusters(sets: list[np.ndarray], threshold: float) -> np.ndarray:
    """The cluster of each set, numbered by its first member: connected components of every pair whose Jaccard
    reaches ``threshold``, all pairs checked exactly (candidates by prefix filtering, identical sets grouped first)."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    n = len(sets)
    keys: dict[bytes, int] = {}
    edges: list[tuple[int, int]] = []
    distinct = []
    for i, s in enumerate(sets):
        if not len(s):
            continue
        first = keys.setdefault(s.tobytes(), i)
        if first != i:
            edges.append((first, i))
        else:
            distinct.append(i)
    if distinct:
        seen = np.zeros(_FREQUENCY_SLOTS, dtype=np.int64)
        for some in range(0, len(distinct), 1024):
            slots = np.concatenate([sets[i] for i in distinct[some:some + 1024]]) % np.uint64(_FREQUENCY_SLOTS)
            seen += np.bincount(slots.astype(np.int64), minlength=_FREQUENCY_SLOTS)
        tokens, owners = [], []
        for k, i in enumerate(distinct):
            size = len(sets[i])
            prefix = size - math.ceil(threshold * size - 1e-9) + 1
            rarest = np.lexsort((sets[i], seen[(sets[i] % np.uint64(_FREQUENCY_SLOTS)).astype(np.int64)]))[:prefix]
            tokens.append(sets[i][rarest])
            owners.append(np.full(len(rarest), k, dtype=np.int64))
        token, owner = np.concatenate(tokens), np.concatenate(owners)
        order = np.lexsort((owner, token))
        token, owner = token[order], owner[order]
        starts = np.flatnonzero(np.r_[True, token[1:] != token[:-1]])
        ends = np.r_[starts[1:], len(token)]
        sizes = np.array([len(sets[i]) for i in distinct], dtype=np.int64)
        twos = starts[ends - starts == 2]
        found = [owner[twos] * len(distinct) + owner[twos + 1]]
        for s, e in zip(starts[ends - starts > 2].tolist(), ends[ends - starts > 2].tolist(), strict=True):
            x, y = np.triu_indices(e - s, 1)
            found.append(owner[s:e][x] * len(distinct) + owner[s:e][y])
        pairs = np.unique(np.concatenate(found))
        x, y = pairs // len(distinct), pairs % len(distinct)
        close = np.minimum(sizes[x], sizes[y]) >= threshold * np.maximum(sizes[x], sizes[y]) - 1e-9
        for a, b in zip(x[close].tolist(), y[close].tolist(), strict=True):
            if set_jaccard(sets[distinct[a]], sets[distinct[b]]) >= threshold:
                edges.append((distinct[a], distinct[b]))
    if not edges:
        return np.arange(n, dtype=np.int64)
    pairs = np.array(edges, dtype=np.int64)
    graph = coo_matrix((np.ones(len(pairs), dtype=np.int8), (pairs[:, 0], pairs[:, 1])), shape=(n, n))
    _, labels = connected_components(graph, directed=False)
    first = np.full(labels.max() + 1, n, dtype=np.int64)
    np.minimum.at(first, labels, np.arange(n))
    return first[labels]


def _family(i: int, config: PlantConfig, sources: int) -> Iterator[tuple[int, int, int, int]]:
    """Original ``i``'s copies, round by round: (round, kind as an index of ``KINDS``, source, round of its base). A
    duplicate's base is the root of a member drawn at random, so a cluster grows in proportion to its size."""
    rng = np.random.default_rng([config.seed, i])
    duplicate = rng.random(config.copies) < config.duplicate_share
    placed = rng.integers(0, sources, config.copies)
    member = rng.random(config.copies)
    roots = [0]
    for r in range(1, config.copies):
        if duplicate[r]:
            roots.append(roots[int(member[r] * r)])
            yield r, 1, int(placed[r]), roots[-1]
        else:
            roots.append(r)
            yield r, 2, int(placed[r]), 0


def _typos(text: str, count: int, seed: int) -> str:
    """``text`` with up to ``count`` typos (a letter substituted, deleted or inserted) at places drawn from ``seed``;
    the first ``count`` of the same draws, so fewer typos are a subset of more."""
    if count <= 0 or not text:
        return text
    places = np.random.default_rng([seed, 0]).integers(0, len(text), count)
    ops = np.random.default_rng([seed, 1]).integers(0, 3, count)
    letters = np.random.default_rng([seed, 2]).integers(0, len(_TYPO_LETTERS), count)
    _, first = np.unique(places, return_index=True)
    out, last = [], 0
    for k in first.tolist():
        at, op, letter = int(places[k]), int(ops[k]), _TYPO_LETTERS[int(letters[k])]
        out.append(text[last:at])
        if op == 0:
            out.append(letter if text[at] != letter else "q" if letter != "q" else "z")
        elif op == 2:
            out.append(letter + text[at])
        last = at + 1
    out.append(text[last:])
    return "".join(out)


def edit_to_band(text: str, base: np.ndarray, band: tuple[float, float], above: bool, rng: np.random.Generator,
                 config: MinHashConfig) -> tuple[str, float, np.ndarray]:
    """``text`` (whose shingle set is ``base``) with typos until its Jaccard with ``text`` lies in ``band`` (a target
    drawn in it): the copy, that Jaccard and the copy's shingle set. Where no number of typos lands in the band (a
    short text), the closest found on the band's side of the threshold (``above``: at least its low end, else at most
    its high end): no typos, or every character replaced. A text without shingles is copied as it is, at Jaccard 0
    (as ``minhash.jaccard``: it is nobody's duplicate)."""
    if not len(base):
        return text, 0.0, base
    low, high = band
    target = float(rng.uniform(low, high))
    draw = int(rng.integers(0, 2**63))
    tried: dict[int, tuple[str, float, np.ndarray]] = {}

    def attempt(count: int) -> float:
        if count not in tried:
            copy = _typos(text, count, draw) if count >= 0 else "".join("z" if c == "q" else "q" for c in text)
            shingles = shingle_sets([copy], config)[0]
            tried[count] = (copy, set_jaccard(base, shingles), shingles)
        return tried[count][1]

    fewer, more = 0, None  # counts known to leave the Jaccard above the band, and to take it below
    count = max(1, round(len(base) * (1 - target) / (config.ngram * (1 + target))))
    for _ in range(_SEARCH_STEPS):
        value = attempt(count)
        if low <= value <= high:
            return tried[count]
        if value > high:
            fewer = count
        else:
            more = count
        next_count = 2 * count if more is None else (fewer + more) // 2
        if next_count in (fewer, more) or next_count > 4 * len(text):
            break
        count = next_count
    attempt(0 if above else -1)
    fits = [c for c, found in tried.items() if (found[1] >= low if above else found[1] <= high)] or list(tried)
    return tried[min(fits, key=lambda c: abs(tried[c][1] - target))]


@dataclass(frozen=True)
class _Block:
    """Some originals' copies, written as ``<out>/<source>/planted-<index>.jsonl.zst``."""

    index: int
    first: int
    end: int
    out_dir: str


_STATE: dict[str, Any] = {}


def _init(originals: list[Original], names: list[str], config: PlantConfig, natural: np.ndarray) -> None:
    _STATE.update(originals=originals, names=names, config=config, natural=natural)


def _make_block(block: _Block) -> dict[str, list]:
    """A block of originals' copies, family by family, written per source; their rows of the truth."""
    originals, names, config, natural = _STATE["originals"], _STATE["names"], _STATE["config"], _STATE["natural"]
    count = len(originals)
    shard = f"planted-{block.index:05d}.jsonl.zst"
    writers: dict[int, Any] = {}
    files = []
    rows = [0] * len(names)
    truth: dict[str, list] = {k: [] for k in TRUTH_COLUMNS}
    try:
        for i in range(block.first, block.end):
            text = originals[i].record[config.text_field]
            made = {0: (text, shingle_sets([text], config.minhash)[0])}
            for r, kind, s, base_round in _family(i, config, len(names)):
                base_text, base_set = made[base_round]
                rng = np.random.default_rng([config.seed, i, r])
                band, above = (config.duplicate_band, True) if kind == 1 else (config.variant_band, False)
                copy, similarity, shingles = edit_to_band(base_text, base_set, band, above, rng, config.minhash)
                if kind == 2:
                    made[r] = (copy, shingles)
                if s not in writers:
                    files.append(open(os.path.join(block.out_dir, names[s], "." + shard + ".partial"), "wb"))
                    writers[s] = zstandard.ZstdCompressor(level=_ZSTD_LEVEL).stream_writer(files[-1])
                writers[s].write(orjson.dumps({**originals[i].record, config.text_field: copy}) + b"\n")
                root = r if kind == 2 or similarity < config.threshold else base_round
                for name, value in (("source", names[s]), ("shard", shard), ("row", rows[s]), ("doc", r * count + i),
                                    ("cluster", root * count + i if root else int(natural[i])), ("kind", KINDS[kind]),
                                    ("base", base_round * count + i), ("jaccard", similarity)):
                    truth[name].append(value)
                rows[s] += 1
    finally:
        for writer in writers.values():
            writer.close()
    for s in writers:
        os.replace(os.path.join(block.out_dir, names[s], "." + shard + ".partial"), os.path.join(block.out_dir, names[s], shard))
    return truth


def _truth_table(columns: dict[str, list]) -> pa.Table:
    return pa.table({"source": pa.array(columns["source"], pa.string()), "shard": pa.array(columns["shard"], pa.string()),
                     "row": pa.array(columns["row"], pa.int64()), "doc": pa.array(columns["doc"], pa.int64()),
                     "cluster": pa.array(columns["cluster"], pa.int64()), "kind": pa.array(columns["kind"], pa.string()),
                     "base": pa.array(columns["base"], pa.int64()), "jaccard": pa.array(columns["jaccard"], pa.float64())})


@dataclass(frozen=True)
class PlantSummary:
    """What ``plant`` wrote: documents in all, the originals, their natural clusters of two or more, and per kind."""

    documents: int
    originals: int
    natural_clusters: int
    documents_by_kind: dict[str, int]


def plant(sources: dict[str, list[str]], out_dir: str, config: PlantConfig) -> PlantSummary:
    """Write the planted corpus and its truth under ``out_dir`` (which must not exist: nothing is overwritten)."""
    names = list(sources)
    originals = read_originals(sources, config.text_field)
    if not originals:
        raise ValueError("no documents in the given shards: nothing to plant")
    os.makedirs(out_dir)
    for source in names:
        os.makedirs(os.path.join(out_dir, source))
    natural = natural_clusters(shingle_sets([o.record[config.text_field] for o in originals], config.minhash), config.threshold)
    for source, paths in sources.items():
        for path in paths:
            shutil.copyfile(path, os.path.join(out_dir, source, os.path.basename(path)))
    truth_path = os.path.join(out_dir, TRUTH_FILE)
    kinds = dict.fromkeys(KINDS, 0)
    kinds["original"] = len(originals)
    with pq.ParquetWriter(truth_path + ".partial", _truth_table({k: [] for k in TRUTH_COLUMNS}).schema) as writer:
        writer.write_table(_truth_table({"source": [o.source for o in originals], "shard": [o.shard for o in originals],
                                         "row": [o.row for o in originals], "doc": list(range(len(originals))),
                                         "cluster": natural.tolist(), "kind": ["original"] * len(originals),
                                         "base": list(range(len(originals))), "jaccard": [1.0] * len(originals)}))
        for columns in _blocks(originals, names, natural, config, out_dir):
            writer.write_table(_truth_table(columns))
            for kind in columns["kind"]:
                kinds[kind] += 1
    os.replace(truth_path + ".partial", truth_path)
    summary = PlantSummary(len(originals) * config.copies, len(originals), int((np.bincount(natural) > 1).sum()), kinds)
    logger.info("planted %s", summary)
    return summary


def _blocks(originals: list[Original], names: list[str], natural: np.ndarray, config: PlantConfig, out_dir: str) -> Iterator[dict[str, list]]:
    if config.copies == 1:
        return
    per_block = max(1, config.shard_documents * len(names) // (config.copies - 1))
    blocks = [_Block(b, first, min(first + per_block, len(originals)), out_dir)
              for b, first in enumerate(range(0, len(originals), per_block))]
    if config.workers == 1 or len(blocks) < 2:
        _init(originals, names, config, natural)
        yield from map(_make_block, blocks)
        return
    context = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn")
    with context.Pool(config.workers, initializer=_init, initargs=(originals, names, config, natural)) as pool:
        yield from pool.imap(_make_block, blocks)


def pair_scores(truth: np.ndarray, found: np.ndarray) -> tuple[float, float]:
    """Pairwise precision and recall of found clusters against true ones, over documents: of the pairs of documents
    put in one cluster, the share truly duplicates, and of the true pairs, the share put in one cluster. ``truth`` and
    ``found`` give each document's cluster; a document in no found cluster needs an id of its own. 1.0 where there are
    no pairs to count."""
    agreed = _pairs(np.unique(np.stack([truth, found], axis=1), axis=0, return_counts=True)[1])
    found_pairs, true_pairs = _pairs(np.unique(found, return_counts=True)[1]), _pairs(np.unique(truth, return_counts=True)[1])
    return (agreed / found_pairs if found_pairs else 1.0), (agreed / true_pairs if true_pairs else 1.0)


def _pairs(sizes: np.ndarray) -> int:
    sizes = sizes.astype(np.int64)
    return int((sizes * (sizes - 1) // 2).sum())
