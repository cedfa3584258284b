"""Long documents are split before tokenizing only where the token ids provably stay the same."""

import dataclasses
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from helpers import TOKENIZER, build, cache_bytes, demo_urls, encoder_for
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenmix import BuildOptions
from tokenmix.cache import CacheBuilder
from tokenmix.formats import encoder as encoder_module
from tokenmix.formats.encoder import DocumentEncoder
from tokenmix.formats.long_docs import split_text
from tokenmix.formats.tokenizer_facts import tokenizer_facts
from tokenmix.sources import FileShard
from tokenmix.sources.shards import RawChunk

ALPHABET = st.sampled_from(list("abcXYZ019 \n\t.,'-_()é漢😀") + [" ", " ", "  ", "'s", "'ll", "<|endoftext|>", "\u00a0"])


@given(st.lists(ALPHABET, max_size=400).map("".join), st.integers(min_value=1, max_value=60))
@settings(max_examples=300, deadline=None)
def test_split_pieces_concatenate_to_the_text_and_tokenize_identically(hf_tokenizer, text, max_chars):
    pieces = list(split_text(text, max_chars))
    assert "".join(pieces) == text
    backend = hf_tokenizer.backend_tokenizer
    whole = backend.encode(text, add_special_tokens=False).ids
    joined = [i for e in backend.encode_batch_fast(pieces, add_special_tokens=False) for i in e.ids]
    assert joined == whole


def test_real_documents_split_small_tokenize_identically(hf_tokenizer, demo_docs):
    backend = hf_tokenizer.backend_tokenizer
    for source, records in demo_docs.items():
        for record in records[:40]:
            pieces = list(split_text(record["text"], 200))
            assert len(pieces) > 1 or len(record["text"]) <= 200
            joined = [i for e in backend.encode_batch_fast(pieces, add_special_tokens=False) for i in e.ids]
            assert joined == backend.encode(record["text"], add_special_tokens=False).ids, source


def test_pieces_respect_the_limit_when_a_cut_exists():
    text = ("word " * 1000).strip()
    pieces = list(split_text(text, 100))
    assert all(len(p) <= 100 for p in pieces)
    assert list(split_text("x" * 500, 100)) == ["x" * 500]


def test_only_tokenizers_where_splitting_is_exact_are_split(hf_tokenizer):
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

    assert tokenizer_facts(hf_tokenizer.backend_tokenizer.to_str()).exact_split
    metaspace = Tokenizer(models.BPE())
    metaspace.pre_tokenizer = pre_tokenizers.Metaspace()
    assert not tokenizer_facts(metaspace.to_str()).exact_split
    normalized = Tokenizer(models.BPE())
    normalized.normalizer = normalizers.Lowercase()
    normalized.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    assert not tokenizer_facts(normalized.to_str()).exact_split


def test_a_cache_built_with_aggressive_splitting_is_byte_identical(tmp_path):
    urls = demo_urls("python_doc")
    build(str(tmp_path / "plain"), urls)
    spec, identity = encoder_for()
    split_spec = dataclasses.replace(spec, long_doc_chars=300)
    CacheBuilder(str(tmp_path / "split"), [FileShard(u) for u in urls], split_spec, identity, BuildOptions(num_workers=0),
                 info={"tokenizer": TOKENIZER}).build()  # as build() records it
    assert cache_bytes(str(tmp_path / "split")) == cache_bytes(str(tmp_path / "plain"))


class _RecordingTokenizer:
    """A tokenizer that notes the length of every text of every batch it is given, and passes everything on."""

    def __init__(self, tokenizer):
        self._tokenizer = tokenizer
        self.batches: list[list[int]] = []

    def encode_batch_fast(self, texts, **kwargs):
        self.batches.append([len(t) for t in texts])
        return self._tokenizer.encode_batch_fast(texts, **kwargs)

    def __getattr__(self, name):
        return getattr(self._tokenizer, name)


def _long_document(demo_docs, chars: int | None = None) -> str:
    """The demo corpus' training texts as one document, repeated to ``chars`` characters when given."""
    text = "\n\n".join(r["text"] for records in demo_docs.values() for r in records)
    return text if chars is None else (text * (chars // len(text) + 1))[:chars]


def test_a_long_real_document_is_tokenized_in_bounded_batches_to_the_unsplit_ids(hf_tokenizer, demo_docs, monkeypatch):
    text = _long_document(demo_docs)
    short = demo_docs["webster"][0]["text"]
    bound = 400_000
    monkeypatch.setattr(encoder_module, "LONG_DOC_BATCH_CHARS", bound)
    spec, _ = encoder_for()
    encoder = DocumentEncoder(spec)
    recording = _RecordingTokenizer(encoder.tokenizer)
    encoder.tokenizer = recording
    out = encoder.encode(RawChunk(0, [orjson.dumps({"text": text}), orjson.dumps({"text": short})]))
    backend = hf_tokenizer.backend_tokenizer
    whole = [backend.encode(t, add_special_tokens=False).ids + [spec.eos_id] for t in (text, short)]
    assert out.lengths.tolist() == [len(ids) for ids in whole]
    assert out.tokens.tolist() == whole[0] + whole[1]
    assert sum(map(sum, recording.batches)) == len(text) + len(short)
    assert len(recording.batches) >= len(text) // bound
    assert all(sum(batch) <= bound for batch in recording.batches)
    assert recording.batches[-1][-1] == len(short)


_PEAK_RSS_GROWTH = """
import sys
from helpers import encoder_for
from tokenmix.formats.encoder import DocumentEncoder
from tokenmix.sources.shards import RawChunk

def peak_rss_kib():
    # VmHWM belongs to this process image; getrusage's ru_maxrss carries the parent's peak across fork and exec
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))

encoder = DocumentEncoder(encoder_for()[0])
encoder.encode(RawChunk(0, [b'{"text": "warm up"}']))
line = open(sys.argv[1], "rb").read()
before = peak_rss_kib()
encoder.encode(RawChunk(0, [line]))
print(peak_rss_kib() - before)
"""


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads the peak RSS from Linux's /proc")
def test_peak_memory_grows_sublinearly_with_a_long_documents_length(tmp_path, demo_docs):
    """Peak RSS growth encoding a 16 MB document against a 4 MB one, each in a fresh process: unbatched it is about 3.5x
    (the tokenizer's Encodings and Python ints of every token at once), batched about 1.3x (the text and its ids)."""
    growth = {}
    for chars in (4_000_000, 16_000_000):
        path = tmp_path / f"doc-{chars}.jsonl"
        path.write_bytes(orjson.dumps({"text": _long_document(demo_docs, chars)}) + b"\n")
        run = subprocess.run([sys.executable, "-c", _PEAK_RSS_GROWTH, str(path)], cwd=Path(__file__).parent, capture_output=True,
                             text=True, timeout=300)
        assert run.returncode == 0, run.stderr
        growth[chars] = int(run.stdout)
    assert 0 < growth[16_000_000] < 2.5 * growth[4_000_000], growth
