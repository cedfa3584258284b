"""tokenmix's Megatron and datatrove files against those projects' own readers and writers (run by check_interop.sh,
in a venv with torch, megatron-core and datatrove; not part of the default test suite).

1. A cache of the bundled corpus exported to Megatron is read by megatron-core's ``IndexedDataset``: every sequence,
   its length and the document index equal the cache's rows.
2. A dataset written by megatron-core's ``IndexedDatasetBuilder`` (int32 and uint16) is read by tokenmix as a source.
3. The cache exported to datatrove is read by datatrove's ``DatatroveFileDataset``: every window of seq_len + 1 tokens
   equals the cache's token stream at that place.
4. A file written by datatrove's own ``TokenizedFile`` (with loss values) is read by tokenmix: documents and loss.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

import tokenmix
from tokenmix.export import export_datatrove, export_megatron

REPO = Path(__file__).resolve().parents[2]
TOKENIZER = str(REPO / "data" / "tokenizer")
CORPUS = REPO / "data" / "demo" / "webster"


def build_cache(root: Path) -> tokenmix.TokenCache:
    config = tokenmix.load_data_config({"tokenizer": TOKENIZER, "cache_dir": str(root / "caches"),
                                        "configs": {"web": {"train_urls": [str(CORPUS / "train-0{0,1}-of-02.jsonl.zst")]}}})
    tokenmix.build_caches(config, progress=False)
    return tokenmix.open_cache(config, "web")


def source(root: Path, name: str, urls: list[str], **token_files) -> tokenmix.TokenCache:
    config = tokenmix.load_data_config({"tokenizer": TOKENIZER, "cache_dir": str(root / "caches"),
                                        "configs": {name: {"train_urls": urls, "token_files": token_files}}})
    return tokenmix.open_cache(config, name)


def check_megatron(root: Path, cache) -> None:
    from megatron.core.datasets.indexed_dataset import IndexedDataset, IndexedDatasetBuilder

    rows = [np.asarray(cache[i]) for i in range(cache.num_rows())]
    prefix = str(root / "ours_text_document")
    export_megatron(cache, prefix, progress=False)
    theirs = IndexedDataset(prefix)
    assert len(theirs) == len(rows), (len(theirs), len(rows))
    assert np.array_equal(theirs.sequence_lengths, [len(r) for r in rows])
    assert np.array_equal(theirs.document_indices, np.arange(len(rows) + 1))
    for i, row in enumerate(rows):
        assert np.array_equal(theirs[i], row), f"sequence {i} differs"
    print(f"megatron-core IndexedDataset reads tokenmix's export: {len(rows)} sequences, {sum(map(len, rows))} tokens, all equal")
    for dtype in (np.int32, np.uint16):
        prefix = str(root / f"theirs_{np.dtype(dtype).name}")
        builder = IndexedDatasetBuilder(prefix + ".bin", dtype=dtype)
        for row in rows:
            builder.add_item(torch.from_numpy(row.astype(np.int64)))
            builder.end_document()
        builder.finalize(prefix + ".idx")
        ours = source(root, f"meg_{np.dtype(dtype).name}", [prefix], kind="megatron")
        got = [np.asarray(ours[i]) for i in range(ours.num_rows())]
        assert len(got) == len(rows) and all(np.array_equal(a, b) for a, b in zip(got, rows))
        print(f"tokenmix reads megatron-core's IndexedDatasetBuilder output ({np.dtype(dtype).name}): all {len(rows)} sequences equal")


def check_datatrove(root: Path, cache) -> None:
    from datatrove.pipeline.tokens.tokenizer import TokenizedFile
    from datatrove.utils.dataset import DatatroveFileDataset

    path = str(root / "ours.ds")
    export_datatrove(cache, path, tokenizer=TOKENIZER, progress=False)
    stream = cache.read_tokens(0, cache.num_tokens())
    seq_len = 255
    theirs = DatatroveFileDataset(path, seq_len, token_size=2)
    assert len(theirs) == len(stream) // (seq_len + 1)
    for i in range(len(theirs)):
        window = theirs[i]["input_ids"].numpy()
        assert np.array_equal(window, stream[i * (seq_len + 1) : (i + 1) * (seq_len + 1)]), f"window {i} differs"
    print(f"datatrove DatatroveFileDataset reads tokenmix's .ds export: {len(theirs)} windows of {seq_len + 1} tokens, all equal")
    from datatrove.io import get_datafolder

    rows = [np.asarray(cache[i]) for i in range(cache.num_rows())]
    rng = np.random.default_rng(0)
    losses = [rng.integers(0, 2, len(r)).astype(bool) for r in rows]
    written = TokenizedFile(get_datafolder(str(root / "dt")), "theirs.ds", save_index=True, save_loss_metadata=True,
                            tokenizer_name_or_path="shared-tokenizer", save_final_metadata=True, token_size=2)
    for row, loss in zip(rows, losses):
        written.write(row.tolist(), loss)
    written.close()
    ours = source(root, "dt", [str(root / "dt")], kind="datatrove")
    got = [np.asarray(ours[i]) for i in range(ours.num_rows())]
    assert len(got) == len(rows) and all(np.array_equal(a, b) for a, b in zip(got, rows))
    row, begin, end = ours.loss_spans(0, ours.num_rows())
    bounds = ours.row_bounds(0, ours.num_rows())
    mask = np.zeros(ours.num_tokens(), bool)
    for r, b, e in zip(row, begin, end):
        mask[bounds[r] + b : bounds[r] + e] = True
    assert np.array_equal(mask, np.concatenate(losses)), "loss values differ"
    print(f"tokenmix reads datatrove's TokenizedFile output: {len(rows)} documents and their loss values, all equal")


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        cache = build_cache(root)
        check_megatron(root, cache)
        check_datatrove(root, cache)
    print("megatron-core and datatrove checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
