"""A cache written as a cache Levanter opens: ``TreeCache.load(path, {"input_ids": int32 exemplar})``.

Our arrays cannot simply gain Levanter's ledger: Levanter opens each array with its own layout as a constraint (int32
values, stored objects of 2^27 elements holding blosc-compressed chunks of 2^18) and refuses any other. So the export
writes a copy in that layout, row after row, and ``shard_ledger.json`` last: until the ledger says the cache is
finished Levanter will not load it, so an interrupted export is never taken for a cache. Memory: one stored object
of tokens (512 MiB of int32) at most, since an object is compressed once, when it is complete.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorstore as ts

from tokenmix.cache.levanter import LEVANTER_LEDGER
from tokenmix.cache.store import TOKENS_ARRAY, JsonDocuments, join_location, kvstore_spec, open_kvstore
from tokenmix.export.streaming import TokenSource, row_batches

LEVANTER_WRITE_CHUNK = 1 << 27
LEVANTER_READ_CHUNK = 1 << 18
LEVANTER_SHAPE = 1 << 54


def _levanter_array(location: str, name: str, dtype: str) -> ts.TensorStore:
    """A new array in the layout Levanter's ``JaggedArrayStore`` creates and demands when it opens one."""
    kvstore = kvstore_spec(join_location(location, TOKENS_ARRAY, name))
    spec = {
        "driver": "zarr3",
        "kvstore": kvstore,
        "metadata": {
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [LEVANTER_WRITE_CHUNK]}},
            "codecs": [{"name": "sharding_indexed", "configuration": {"chunk_shape": [LEVANTER_READ_CHUNK],
                                                                       "codecs": [{"name": "blosc", "configuration": {"clevel": 5}}]}}],
        },
    }
    return ts.open(spec, dtype=dtype, shape=[LEVANTER_SHAPE], create=True, delete_existing=True).result()


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


def export_levanter(cache: TokenSource, location: str, tokenizer: str, progress: bool = True) -> dict[str, Any]:
    """Write ``location`` (a path or URL) as a finished Levanter token cache of the cache's rows; ``tokenizer`` is the
    name recorded in its metadata (Levanter compares it with its own config's, and warns when they differ)."""
    if cache.has_loss_spans:
        raise ValueError(f"{cache.location}: Levanter's token caches hold ids only, and this cache's format masks the loss; export "
                         "it to datatrove (.ds with .loss) or Cerebras HDF5 instead")
    open_kvstore(location).write(LEVANTER_LEDGER, None).result()  # an earlier export's ledger must not vouch for this one's arrays
    data = _ObjectWriter(_levanter_array(location, "data", "int32"), 0)
    ends = _ObjectWriter(_levanter_array(location, "offsets", "int64"), 1)
    total = 0
    for batch in row_batches(cache, description=f"levanter {location}", progress=progress):
        data.append(batch.tokens.astype(np.int32))
        ends.append(total + np.cumsum(batch.lengths, dtype=np.int64))
        total += int(batch.lengths.sum())
    data.flush()
    ends.flush()
    rows = cache.num_rows()
    ends.array[0].write(np.int64(rows)).result()
    identity = cache.identity
    ledger = {
        "total_num_rows": rows,
        "shard_rows": {"tokenmix": rows},
        "is_finished": True,
        "finished_shards": ["tokenmix"],
        "field_counts": {},
        "metadata": {"preprocessor_metadata": {
            "tokenizer": tokenizer, "vocab_size": identity["vocab_size"], "return_attention_mask": False, "padding": False,
            "max_length": None, "append_bos": identity.get("bos_id") is not None, "append_eos": identity.get("eos_id") is not None,
        }},
    }
    JsonDocuments(location).write(LEVANTER_LEDGER, ledger)
    return {"format": "levanter", "path": location, "documents": rows, "tokens": total, "dtype": "int32"}
