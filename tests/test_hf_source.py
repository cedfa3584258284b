"""The Hugging Face form of a source, on a local dataset directory (no hub access in tests)."""

import json

import pytest
from helpers import DEMO_CORPUS, TOKENIZER, read_jsonl_zst

from tokenmix import LMDatasetSourceConfig, LMMixtureDatasetConfig, build_caches, open_cache
from tokenmix.sources import HfDatasetShard, ShardReadError


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf_dataset")
    for split, name in (("train", "train-00-of-02"), ("validation", "validation")):
        records = read_jsonl_zst(DEMO_CORPUS / "webster" / f"{name}.jsonl.zst")
        (root / f"{split}.jsonl").write_text("".join(json.dumps({"text": r["text"]}) + "\n" for r in records))
    return root


@pytest.mark.parametrize("stream", [True, False])
def test_hf_split_reads_in_order_and_resumes(hf_dir, stream):
    records = [json.loads(line) for line in (hf_dir / "train.jsonl").read_text().splitlines()]
    shard = HfDatasetShard(str(hf_dir), None, "train", stream=stream)
    got = [r for chunk in shard.read(0, chunk_bytes=10_000) for r in chunk.records]
    assert [r["text"] for r in got] == [r["text"] for r in records]
    resumed = list(shard.read(100, chunk_bytes=10_000))
    assert resumed[0].start == 100
    assert [r["text"] for c in resumed for r in c.records] == [r["text"] for r in records[100:]]


def test_hf_source_builds_both_splits(hf_dir, tmp_path, hf_tokenizer):
    config = LMMixtureDatasetConfig(
        tokenizer=TOKENIZER, cache_dir=str(tmp_path), configs={"web": LMDatasetSourceConfig(id=str(hf_dir))}
    )
    results = build_caches(config, progress=False)
    assert set(results) == {("web", "train"), ("web", "validation")}
    first = json.loads((hf_dir / "validation.jsonl").read_text().splitlines()[0])["text"]
    cache = open_cache(config, "web", "validation")
    assert cache[0].tolist() == hf_tokenizer(first, add_special_tokens=False)["input_ids"] + [0]


def test_a_streamed_split_whose_data_breaks_mid_read_is_a_shard_error_naming_it(tmp_path):
    """Before, the error ``datasets`` raised while streaming (here pyarrow's) escaped ``read`` bare: no shard error, so the
    build's error policy never saw it and the message named no source."""
    lines = [json.dumps({"text": f"document {i}"}) for i in range(100)]
    lines[50] = '{"text": unquoted}'
    (tmp_path / "train.jsonl").write_text("\n".join(lines) + "\n")
    shard = HfDatasetShard(str(tmp_path), None, "train", stream=True)
    with pytest.raises(ShardReadError, match=rf"hf://{tmp_path}/train: unreadable_file after \d+ records: ArrowInvalid: JSON parse error"):
        for _ in shard.read(0, chunk_bytes=100):
            pass
