"""A cache written as the token cache Levanter's trainer opens: ``load_lm_dataset_cache(path, TextLmDatasetFormat(),
tokenizer)``, which loads it with the exemplar and metadata of the ``BatchTokenizer`` it would have built it with.

That exemplar is what the tokenizer returns for a text without an attention mask, each field a list of Python ints, so
int64 arrays: ``input_ids`` and, for tokenizers that return them, ``token_type_ids`` (zeros for a single text). Which
tokenizers return them depends on the transformers release Levanter runs with (4.x's ``PreTrainedTokenizerFast`` does,
5.x's does not), so the export always writes both: Levanter opens only the arrays its exemplar names. The metadata is
the tokenizer's name, ``len(tokenizer)``, its ``model_max_length``, and whether Levanter's tokenizer appends BOS and
EOS to what the tokenizer gives on its own. Levanter's rows always start with BOS when the tokenizer has one (it is
asked to add it) and end with EOS when the tokenizer has one and ``enforce_eos`` is on; a cache whose rows are shaped
otherwise is refused rather than exported under metadata that would misdescribe it.

Our arrays cannot simply gain Levanter's ledger: Levanter opens each array with its own layout as a constraint (the
exemplar's dtype, stored objects of 2^27 elements holding blosc-compressed chunks of 2^18) and refuses any other. So
the export writes a copy in that layout, row after row, and ``shard_ledger.json`` last: until the ledger says the
cache is finished Levanter will not load it, so an interrupted export is never taken for a cache. Memory: one stored
object per array (1 GiB of int64) at most, since an object is compressed once, when it is complete.

The export holds the location's build lock while it writes, so a second export there (or a build) is refused rather
than interleaving its arrays with this one's under one ledger.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import tensorstore as ts

from tokenmix.cache.ledger import LEDGER_FILE
from tokenmix.cache.levanter import LEVANTER_LEDGER
from tokenmix.cache.lock import BuildLock, CacheLockedError, FlockUnsupportedError, build_lock
from tokenmix.cache.store import TOKENS_ARRAY, JsonDocuments, kvstore_spec, open_kvstore
from tokenmix.export.streaming import TokenSource, refuse_loss_spans, row_batches
from tokenmix.formats.tokenizer import describe_tokenizer, load_tokenizer
from tokenmix.sources.urls import join_location, local_path

logger = logging.getLogger(__name__)

LEVANTER_WRITE_CHUNK = 1 << 27
LEVANTER_READ_CHUNK = 1 << 18
LEVANTER_SHAPE = 1 << 54
LEVANTER_DTYPE = "int64"
"""The type of the lists of ints a Hugging Face tokenizer returns, as Levanter's cache stores them."""
LEVANTER_FIELDS = (TOKENS_ARRAY, "token_type_ids")


@dataclass(frozen=True)
class LevanterLayout:
    """What Levanter's ``BatchTokenizer`` for a tokenizer records as its metadata, and whether its rows hold BOS and EOS."""

    metadata: dict[str, Any]
    has_bos: bool
    has_eos: bool


def levanter_layout(tokenizer: str, enforce_eos: bool) -> LevanterLayout:
    """The layout Levanter's ``BatchTokenizer(tokenizer, enforce_bos=True, enforce_eos=enforce_eos)`` writes, as its
    trainer's ``load_lm_dataset_cache`` expects it."""
    tok = load_tokenizer(tokenizer)
    sample = tok("hi there", return_attention_mask=False, verbose=False)
    ids = list(sample["input_ids"])
    bos, eos = tok.bos_token_id, tok.eos_token_id
    append_bos = bos is not None and ids[0] != bos
    append_eos = enforce_eos and eos is not None and ids[-1] != eos
    metadata = {
        "tokenizer": tokenizer, "vocab_size": len(tok), "return_attention_mask": False, "padding": False,
        "max_length": tok.model_max_length, "append_bos": append_bos, "append_eos": append_eos,
    }
    has_eos = append_eos or (eos is not None and ids[-1] == eos)
    return LevanterLayout(metadata, bos is not None, has_eos)


def _levanter_array(location: str, field: str, name: str) -> ts.TensorStore:
    """A new array in the layout Levanter's ``JaggedArrayStore`` creates and demands when it opens one."""
    kvstore = kvstore_spec(join_location(location, field, name))
    spec = {
        "driver": "zarr3",
        "kvstore": kvstore,
        "metadata": {
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [LEVANTER_WRITE_CHUNK]}},
            "codecs": [{"name": "sharding_indexed", "configuration": {"chunk_shape": [LEVANTER_READ_CHUNK],
                                                                       "codecs": [{"name": "blosc", "configuration": {"clevel": 5}}]}}],
        },
    }
    return ts.open(spec, dtype=LEVANTER_DTYPE, shape=[LEVANTER_SHAPE], create=True, delete_existing=True).result()


class _ObjectWriter:
    """Appends values to a Levanter array one stored object at a time (a partial object would be compressed again on
    every append)."""

    def __init__(self, array: ts.TensorStore, start: int):
        self.array = array
        self.start = start
        self.waiting: list[np.ndarray] = []
        self.count = 0

    def append(self, values: np.ndarray) -> None:
        self.waiting.append(values)
        self.count += len(values)
        while self.count and (self.start + self.count) // LEVANTER_WRITE_CHUNK > self.start // LEVANTER_WRITE_CHUNK:
            data = np.concatenate(self.waiting)
            take = LEVANTER_WRITE_CHUNK - self.start % LEVANTER_WRITE_CHUNK
            self.array[self.start : self.start + take].write(data[:take]).result()
            self.start += take
            self.waiting, self.count = [data[take:]], len(data) - take

    def flush(self) -> None:
        if self.count:
            self.array[self.start : self.start + self.count].write(np.concatenate(self.waiting)).result()
            self.start += self.count
            self.waiting, self.count = [], 0


def _check_rows(cache: TokenSource, tokenizer: str, layout: LevanterLayout) -> None:
    """Refuse a cache of another tokenizer, or whose rows hold BOS/EOS otherwise than Levanter's for this tokenizer."""
    identity = cache.identity
    fingerprint = identity.get("tokenizer_fingerprint")
    if fingerprint is not None and fingerprint != describe_tokenizer(tokenizer).fingerprint:
        raise ValueError(f"{cache.location}: the cache was built with another tokenizer than {tokenizer!r} (fingerprint "
                         f"{fingerprint}); give --tokenizer the tokenizer the cache was built with")
    if "bos_id" not in identity:
        logger.warning("%s: the rows' BOS/EOS are not recorded; the metadata says what Levanter's tokenizer adds for %s",
                       cache.location, tokenizer)
        return
    for has, wanted, what, fix in ((identity["bos_id"] is not None, layout.has_bos, "BOS", "enforce_bos: true"),
                                   (identity.get("eos_id") is not None, layout.has_eos, "EOS", "enforce_eos: true")):
        if has != wanted:
            have = "starts with" if what == "BOS" else "ends with"
            raise ValueError(
                f"{cache.location}: every row Levanter's BatchTokenizer writes for {tokenizer!r} {have} {what} "
                f"{'' if wanted else 'only when the tokenizer itself adds it, '}but this cache's rows "
                f"{'do not' if wanted else 'do'}; rebuild the cache with {fix if wanted else fix.replace('true', 'false')} "
                "to export it to Levanter")


def export_levanter(cache: TokenSource, location: str, tokenizer: str, progress: bool = True) -> dict[str, Any]:
    """Write ``location`` (a path or URL) as a finished Levanter token cache of the cache's rows, opened by Levanter's
    ``load_lm_dataset_cache`` with ``tokenizer`` (a name or path Levanter loads; it is recorded in the metadata) and
    the text format. Levanter's ``enforce_eos`` must match whether the cache's rows end with EOS, as always."""
    refuse_loss_spans(cache, "Levanter's token caches")
    layout = levanter_layout(tokenizer, enforce_eos=cache.identity.get("eos_id", 0) is not None)
    _check_rows(cache, tokenizer, layout)
    path = local_path(location)
    if path is not None and os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"{location} is a file; a Levanter cache is a directory: give a directory path (a new one, or one "
                         "holding an earlier Levanter export to replace)")
    lock = build_lock(location, timeout=0)
    try:
        try:
            lock.acquire()
        except FlockUnsupportedError:  # a network filesystem: the lease a build there is told to use
            lock = build_lock(location, "lease", timeout=0)
            lock.acquire()
    except CacheLockedError:
        holder = lock.holder.describe() if lock.holder else "another process"
        raise CacheLockedError(f"{location} is being written by {holder} (another export there, or a build): two writers would "
                               "interleave their arrays under one ledger. Wait for it to finish, or export to another location") from None
    try:
        return _export_levanter(cache, location, layout, progress, lock)
    finally:
        lock.release()


def _export_levanter(cache: TokenSource, location: str, layout: LevanterLayout, progress: bool, lock: BuildLock) -> dict[str, Any]:
    store = open_kvstore(location)
    if store.read(LEDGER_FILE).result().state == "value":  # its arrays would be replaced, its ledger left to misdescribe them
        raise ValueError(f"{location} holds a tokenmix cache ({LEDGER_FILE}), whose arrays a Levanter export there would "
                         "replace; export to another location (a Levanter cache directory of its own)")
    store.write(LEVANTER_LEDGER, None).result()  # an earlier export's ledger must not vouch for this one's arrays
    writers = {field: (_ObjectWriter(_levanter_array(location, field, "data"), 0),
                       _ObjectWriter(_levanter_array(location, field, "offsets"), 1)) for field in LEVANTER_FIELDS}
    total = 0
    for batch in row_batches(cache, description=f"levanter {location}", progress=progress):
        ends = total + np.cumsum(batch.lengths, dtype=np.int64)
        for field, (data, offsets) in writers.items():
            values = batch.tokens.astype(np.int64) if field == TOKENS_ARRAY else np.zeros(len(batch.tokens), np.int64)
            data.append(values)
            offsets.append(ends)
        total += int(batch.lengths.sum())
    rows = cache.num_rows()
    for data, offsets in writers.values():
        data.flush()
        offsets.flush()
        offsets.array[0].write(np.int64(rows)).result()
    ledger = {
        "total_num_rows": rows,
        "shard_rows": {"tokenmix": rows},
        "is_finished": True,
        "finished_shards": ["tokenmix"],
        "field_counts": {},
        "metadata": {"preprocessor_metadata": layout.metadata},
    }
    lock.check()
    JsonDocuments(location).write(LEVANTER_LEDGER, ledger)
    return {"format": "levanter", "path": location, "documents": rows, "tokens": total, "dtype": LEVANTER_DTYPE}
