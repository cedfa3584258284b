"""A build that adds rows to a cache whose rows other libraries or code encoded (an upgrade between a build and its
extension, or a killed build and its resume) checks a sample of the rows already there, and refuses to go on where
they now encode otherwise, instead of mixing two encodings under one identity (cache/encoding_continuity.py)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import ftfy
import numpy as np
import pytest
from helpers import build, demo_urls, write_jsonl

import tokenmix.cache.builder as builder_module
import tokenmix.cache.encoding_continuity as continuity
from tokenmix import EncodingChangedError, SupervisedLmDatasetFormat, TextLmDatasetFormat, TokenCache
from tokenmix.cache.encoding_continuity import encoding_state
from tokenmix.cache.ledger import ENCODING_KEY

FTFY = TextLmDatasetFormat(use_ftfy=True)
"""A format whose text an ftfy upgrade could repair otherwise."""


def _upgraded(monkeypatch, repairs_otherwise: bool) -> dict[str, str]:
    """This process as after an upgrade of ftfy: another installation, which repairs text otherwise where asked."""
    state = {**encoding_state(), "ftfy": "9.9.9 0123456789ab"}
    monkeypatch.setattr(builder_module, "encoding_state", lambda: state)
    if repairs_otherwise:
        fix_text = ftfy.fix_text
        monkeypatch.setattr(ftfy, "fix_text", lambda text, config=None: fix_text(text, config).replace(" the ", " teh "))
    return state


def _rows(location: str) -> list[np.ndarray]:
    cache = TokenCache(location)
    return cache.get_rows(range(cache.num_rows()))


def test_an_extension_after_an_upgrade_that_encodes_otherwise_is_refused_and_adds_nothing(tmp_path, monkeypatch):
    first, both = demo_urls("webster")[:1], demo_urls("webster")
    location = str(tmp_path / "cache")
    build(location, first, FTFY)
    ledger_before = (tmp_path / "cache" / "ledger.json").read_bytes()
    rows_before = _rows(location)
    _upgraded(monkeypatch, repairs_otherwise=True)
    with pytest.raises(EncodingChangedError, match=rf"cache at {location}: ftfy changed since its rows were encoded, and they now encode "
                                                   r"otherwise \(the first [\d,]+ rows of .*train-00-of-02.jsonl.zst, from record 0, differ "
                                                   r".*Install what built the cache again .*or delete the cache"):
        build(location, both, FTFY)
    assert (tmp_path / "cache" / "ledger.json").read_bytes() == ledger_before
    assert all(np.array_equal(a, b) for a, b in zip(_rows(location), rows_before, strict=True))


def test_an_extension_after_an_upgrade_that_encodes_the_same_goes_on_and_records_the_new_installation(tmp_path, monkeypatch, caplog):
    first, both = demo_urls("webster")[:1], demo_urls("webster")
    location, whole = str(tmp_path / "cache"), str(tmp_path / "whole")
    build(location, first, FTFY)
    recorded = json.loads((tmp_path / "cache" / "ledger.json").read_text())["info"][ENCODING_KEY]
    assert recorded == encoding_state() and recorded["ftfy"].split()[0] == ftfy.__version__
    state = _upgraded(monkeypatch, repairs_otherwise=False)
    with caplog.at_level(logging.INFO, logger="tokenmix"):
        build(location, both, FTFY)
    assert "ftfy changed since the cache's rows were encoded; its first" in caplog.text
    assert json.loads((tmp_path / "cache" / "ledger.json").read_text())["info"][ENCODING_KEY] == state
    build(whole, both, FTFY)
    assert all(np.array_equal(a, b) for a, b in zip(_rows(location), _rows(whole), strict=True))


def test_a_cache_built_before_the_record_is_checked_once_then_recorded(tmp_path, monkeypatch):
    """A cache whose ledger names no encoding (built before it was recorded) is checked like a changed one."""
    first, both = demo_urls("webster")[:1], demo_urls("webster")
    location = str(tmp_path / "cache")
    build(location, first, FTFY)
    ledger_path = Path(location) / "ledger.json"
    ledger = json.loads(ledger_path.read_text())
    del ledger["info"][ENCODING_KEY]
    ledger_path.write_text(json.dumps(ledger))
    fix_text = ftfy.fix_text
    monkeypatch.setattr(ftfy, "fix_text", lambda text, config=None: fix_text(text, config).replace(" the ", " teh "))
    with pytest.raises(EncodingChangedError, match="the libraries and code that encoded it are not recorded"):
        build(location, both, FTFY)
    monkeypatch.setattr(ftfy, "fix_text", fix_text)
    build(location, both, FTFY)
    assert json.loads(ledger_path.read_text())["info"][ENCODING_KEY] == encoding_state()


def test_a_sample_that_now_encodes_to_no_rows_is_a_difference_not_a_pass(tmp_path, monkeypatch):
    """A change that drops the sample's records (every text now repaired to nothing) left no row to compare, and the
    check passed on nothing."""
    first, both = demo_urls("webster")[:1], demo_urls("webster")
    location = str(tmp_path / "cache")
    build(location, first, FTFY)
    _upgraded(monkeypatch, repairs_otherwise=False)
    monkeypatch.setattr(ftfy, "fix_text", lambda text, config=None: " ")
    with pytest.raises(EncodingChangedError, match=r"ftfy changed since its rows were encoded, and they now encode otherwise \(the first "):
        build(location, both, FTFY)


def test_the_loss_spans_of_the_sample_are_compared_too(tmp_path, monkeypatch):
    """Ids that stay the same while the loss masks move (a template or offsets change) are an encoding change too."""
    records = [{"prompt": f"Question {i}: what is {i} + {i}?", "response": f" It is {2 * i}." * (1 + i % 3)} for i in range(40)]
    first, second = write_jsonl(tmp_path / "a.jsonl", records[:20]), write_jsonl(tmp_path / "b.jsonl", records[20:])
    location = str(tmp_path / "cache")
    build(location, [first], SupervisedLmDatasetFormat())
    _upgraded(monkeypatch, repairs_otherwise=False)
    build(str(tmp_path / "same"), [first], SupervisedLmDatasetFormat())  # the spans compared equal: no refusal below
    encode = continuity.DocumentEncoder.encode

    def spans_moved(self, chunk):
        encoded = encode(self, chunk)
        encoded.spans = encoded.spans + 1
        return encoded

    monkeypatch.setattr(continuity.DocumentEncoder, "encode", spans_moved)
    with pytest.raises(EncodingChangedError, match="they now encode otherwise"):
        build(location, [first, second], SupervisedLmDatasetFormat())
    monkeypatch.undo()
    _upgraded(monkeypatch, repairs_otherwise=False)
    build(location, [first, second], SupervisedLmDatasetFormat())
    assert TokenCache(location).num_rows() == 40
