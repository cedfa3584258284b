"""Long documents are split before tokenizing only where the token ids provably stay the same."""

import dataclasses

from helpers import build, cache_bytes, demo_urls, encoder_for
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenmix import BuildOptions
from tokenmix.cache import CacheBuilder
from tokenmix.formats.long_docs import exact_split_supported, split_text
from tokenmix.sources import FileShard

ALPHABET = st.sampled_from(list("abcXYZ019 \n\t.,'-_()é漢😀") + [" ", " ", "  ", "'s", "'ll", "<|endoftext|>", "\u00a0"])


@given(st.lists(ALPHABET, max_size=400).map("".join), st.integers(min_value=1, max_value=60))
@settings(max_examples=300, deadline=None)
def test_split_pieces_concatenate_to_the_text_and_tokenize_identically(hf_tokenizer, text, max_chars):
    pieces = split_text(text, max_chars)
    assert "".join(pieces) == text
    backend = hf_tokenizer.backend_tokenizer
    whole = backend.encode(text, add_special_tokens=False).ids
    joined = [i for e in backend.encode_batch_fast(pieces, add_special_tokens=False) for i in e.ids]
    assert joined == whole


def test_real_documents_split_small_tokenize_identically(hf_tokenizer, demo_docs):
    backend = hf_tokenizer.backend_tokenizer
    for source, records in demo_docs.items():
        for record in records[:40]:
            pieces = split_text(record["text"], 200)
            assert len(pieces) > 1 or len(record["text"]) <= 200
            joined = [i for e in backend.encode_batch_fast(pieces, add_special_tokens=False) for i in e.ids]
            assert joined == backend.encode(record["text"], add_special_tokens=False).ids, source


def test_pieces_respect_the_limit_when_a_cut_exists():
    text = ("word " * 1000).strip()
    pieces = split_text(text, 100)
    assert all(len(p) <= 100 for p in pieces)
    assert split_text("x" * 500, 100) == ["x" * 500]


def test_only_tokenizers_where_splitting_is_exact_are_split(hf_tokenizer):
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

    assert exact_split_supported(hf_tokenizer.backend_tokenizer.to_str())
    metaspace = Tokenizer(models.BPE())
    metaspace.pre_tokenizer = pre_tokenizers.Metaspace()
    assert not exact_split_supported(metaspace.to_str())
    normalized = Tokenizer(models.BPE())
    normalized.normalizer = normalizers.Lowercase()
    normalized.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    assert not exact_split_supported(normalized.to_str())


def test_a_cache_built_with_aggressive_splitting_is_byte_identical(tmp_path):
    urls = demo_urls("python_doc")
    build(str(tmp_path / "plain"), urls)
    spec, identity = encoder_for()
    split_spec = dataclasses.replace(spec, long_doc_chars=300)
    CacheBuilder(str(tmp_path / "split"), [FileShard(u) for u in urls], split_spec, identity, BuildOptions(num_workers=0)).build()
    assert cache_bytes(str(tmp_path / "split")) == cache_bytes(str(tmp_path / "plain"))
