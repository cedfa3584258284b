"""tokenmix and Levanter open each other's caches (run by check_interop.sh in a venv with Levanter installed; it
pulls in Ray, so it is not part of the default test suite).

1. Levanter builds a token cache itself (its ``BatchTokenizer`` and ``SerialCacheWriter``); a tokenmix mixture whose
   source's cache_dir points there builds nothing and reads every row token-exact, as Levanter's ``TreeCache`` does.
2. A tokenmix cache exported for Levanter is opened with Levanter's ``TreeCache.load`` and every row equals ours.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np
from levanter.data.text import BatchTokenizer
from levanter.store.cache import CacheMetadata, SerialCacheWriter, TreeCache
from transformers import AutoTokenizer

import tokenmix
from tokenmix.export import export_levanter
from tokenmix.sources import FileShard

REPO = Path(__file__).resolve().parents[2]
TOKENIZER = str(REPO / "data" / "tokenizer")
CORPUS = REPO / "data" / "demo" / "python_doc"
EXEMPLAR = {"input_ids": np.zeros((0,), dtype=np.int64)}


def texts() -> list[str]:
    import orjson

    out = []
    for chunk in FileShard(str(CORPUS / "train-00-of-02.jsonl.zst")).read():
        out.extend(orjson.loads(line)["text"] for line in chunk.records)
    return out


def levanter_builds_we_read(root: Path) -> None:
    processor = BatchTokenizer(AutoTokenizer.from_pretrained(TOKENIZER), enforce_bos=False, enforce_eos=True)
    location = root / "lev" / "train"
    docs = texts()
    with SerialCacheWriter(str(location), processor.output_exemplar, metadata=CacheMetadata(processor.metadata)) as writer:
        for i in range(0, len(docs), 16):
            writer.write_batch(processor([{"text": t} for t in docs[i : i + 16]]))
    theirs = TreeCache.load(str(location), processor.output_exemplar)
    expected = [np.asarray(r["input_ids"]) for r in theirs.get_batch_sync(list(range(len(docs))))]
    config = tokenmix.load_data_config({"tokenizer": TOKENIZER, "cache_dir": str(root / "ours"),
                                        "configs": {"python": {"train_urls": [str(CORPUS / "train-00-of-02.jsonl.zst")],
                                                                   "cache_dir": str(root / "lev")}}})
    tokenmix.build_caches(config, progress=False)
    ours = tokenmix.open_cache(config, "python")
    assert ours.num_rows() == len(expected), (ours.num_rows(), len(expected))
    for i, want in enumerate(expected):
        assert np.array_equal(ours[i], want), f"row {i} differs"
    batch = config.train_set(128).get_batch(range(32))
    assert batch.tokens.shape == (32, 128)
    print(f"tokenmix reads a cache Levanter built: {len(expected)} rows, {sum(map(len, expected))} tokens, all equal; mixture batches OK")


def levanter_reads_ours(root: Path) -> None:
    config = tokenmix.load_data_config({"tokenizer": TOKENIZER, "enforce_bos": True, "cache_dir": str(root / "built"),
                                        "configs": {"python": {"train_urls": [str(CORPUS / "train-01-of-02.jsonl.zst")]}}})
    tokenmix.build_caches(config, progress=False)
    cache = tokenmix.open_cache(config, "python")
    out = root / "export" / "train"
    export_levanter(cache, str(out), tokenizer=TOKENIZER, progress=False)
    theirs = TreeCache.load(str(out), EXEMPLAR)
    rows = theirs.get_batch_sync(list(range(cache.num_rows())))
    assert len(theirs) == cache.num_rows()
    for i, row in enumerate(rows):
        assert np.array_equal(np.asarray(row["input_ids"]), cache[i]), f"row {i} differs"
    print(f"Levanter's TreeCache.load opens tokenmix's export: {cache.num_rows()} rows, all equal")


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        levanter_builds_we_read(Path(tmp))
        levanter_reads_ours(Path(tmp))
    print("Levanter checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
