"""Whether the rows a build adds to a cache are encoded as the rows already in it were.

A cache's identity (invariant 4) holds what a config names and what decides its ids: the tokenizer, the format and its
options, BOS and EOS. The installed libraries that encode the text (``fastokens``, ``tokenizers``), those that make
the text they encode (``orjson``, ``ftfy``, ``jinja2``, ``transformers``, ``numpy``) and tokenmix's own encoding
code (``tokenmix.formats``) decide the ids too, and can change between a killed build and its resume, or between a
build and the one that extends it (an upgrade, another checkout): the cache would then hold rows of two encodings
under one identity, silently. They are not in the identity, since a new release of any of them would then refuse
every cache built before, whose rows it nearly always encodes the same.

Instead each build records in the ledger's ``info`` which installations and code it encodes with
(``encoding_state``: each package's version, and a digest of its ``__init__`` and native extensions and of each encoding
module, by path, size and modification time, which an upgrade, a reinstall or an edit changes; all read without
importing them). A build that adds rows to a cache whose record differs (or that has
none: a cache built before the record) first encodes again the first records of the cache's first run, as much as
the backend check samples, with the backend its rows were encoded with, and compares them with the rows the cache
holds: the same ids, lengths and loss spans, and it goes on and records its own state; others (or none where the cache
holds rows), and it stops before adding a row (``EncodingChangedError``), naming what changed and the fixes. The
sample is a sample: a change that only shows on other text goes unseen, as with the backend check.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import logging
import os
from collections.abc import Sequence

import numpy as np

from tokenmix.cache.ledger import ENCODING_KEY, CacheLedger
from tokenmix.cache.store import LOSS_SPANS_ARRAY, TOKENS_ARRAY, JaggedArray
from tokenmix.formats.backends import REFERENCE
from tokenmix.formats.encoder import DocumentEncoder
from tokenmix.formats.encoder_spec import BACKEND_PACKAGES, TEXT_LIBRARIES, EncoderSpec, encoding_modules
from tokenmix.formats.tokenizer_identity import code_version, installed
from tokenmix.sources.shards import RawChunk, Shard, ShardReadError

logger = logging.getLogger(__name__)

CODE_KEY = "tokenmix.formats"
"""The entry of ``encoding_state`` for tokenmix's encoding code."""
SAMPLE_BYTES = 64 << 10
"""Input bytes of the cache's first run encoded again when the encoding state changed."""


class EncodingChangedError(RuntimeError):
    """A build would add rows to a cache encoded otherwise than its rows (a library or tokenmix upgraded since)."""


def encoding_state() -> dict[str, str]:
    """Which installations of the libraries that decide a cache's ids, and which version of tokenmix's encoding code,
    this process encodes with: each package's version and a digest of its files' paths, sizes and modification times
    (``absent`` where it is not installed), and a digest of the encoding modules'. Read once a process (what it loaded
    is what it encodes with), so that a run of a thousand builds pays for it once."""
    return dict(_encoding_state())


@functools.cache
def _encoding_state() -> tuple[tuple[str, str], ...]:
    state = [(package, _installation(package)) for package in (*BACKEND_PACKAGES, *TEXT_LIBRARIES)]
    return (*state, (CODE_KEY, _digest("\0".join(code_version(path) for path in encoding_modules()))))


def _installation(package: str) -> str:
    files = installed(package)
    if files == "absent":
        return files
    return f"{_versions(os.path.dirname(os.path.dirname(files.split(':', 1)[0]))).get(package, 'unknown version')} {_digest(files)}"


@functools.cache
def _versions(site: str) -> dict[str, str]:
    """The version of each distribution installed in the directory ``site``, from the names of its ``.dist-info``
    directories (``importlib.metadata`` costs about 30 ms a package)."""
    found = {}
    with contextlib.suppress(OSError):
        for entry in os.scandir(site):
            if entry.name.endswith(".dist-info") and "-" in entry.name:
                name, version = entry.name[: -len(".dist-info")].rsplit("-", 1)
                found[name.lower().replace("-", "_")] = version
    return found


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def check_encoding(location: str, ledger: CacheLedger, shards: Sequence[Shard], spec: EncoderSpec, state: dict[str, str],
                   chunk_bytes: int, backend: str = REFERENCE) -> bool:
    """Before a build adds rows to the cache at ``location`` (``ledger``: it holds rows), refuse if the rows in it were
    encoded with other libraries or code (``state``: this build's; ``backend``: the one its rows are encoded with) and a
    sample of them now encodes otherwise. Returns whether ``state`` may be recorded: False where the sample could not be
    read (the next build checks again)."""
    recorded = ledger.info.get(ENCODING_KEY)
    if recorded == state:
        return True
    changed = _changed(recorded, state)
    if not ledger.runs:
        logger.warning("%s: %s since the cache's rows were encoded, and its ledger does not say which records they came from "
                       "(a cache built before it did): going on unchecked", location, changed)
        return True
    first = ledger.run_extents()[0]
    shard = shards[first.shard]
    try:
        sample = next(iter(shard.read(first.position, min(SAMPLE_BYTES, chunk_bytes))), None)
    except ShardReadError as e:
        logger.warning("%s: %s since the cache's rows were encoded, and its first input cannot be read to check that they "
                       "encode the same (%s): going on unchecked", location, changed, e)
        return False
    if sample is None or first.stop_row == first.row:
        return True
    encoded = DocumentEncoder(dataclasses.replace(spec, backend=backend)).encode(RawChunk(sample.start, sample.records))
    rows = min(len(encoded.lengths), first.stop_row - first.row)
    same = rows > 0 and _same_rows(JaggedArray.open(location, TOKENS_ARRAY, spec.dtype), first.row, rows, encoded.lengths, encoded.tokens)
    if same and ledger.identity.get("loss_spans"):
        same = _same_rows(JaggedArray.open(location, LOSS_SPANS_ARRAY, "int64"), first.row, rows, encoded.span_counts, encoded.spans)
    if not same:
        raise EncodingChangedError(
            f"cache at {location}: {changed} since its rows were encoded, and they now encode otherwise (the first "
            f"{first.stop_row - first.row if rows == 0 else rows:,} rows of {shard.name}, from record {first.position:,}, differ "
            "from what the cache holds): the rows this build would add would not be encoded as those already in it. Install what "
            f"built the cache again (the ledger's info.{ENCODING_KEY} says which versions those were), or delete the cache (or "
            "use another cache_dir) to build it again with what is installed now.")
    logger.info("%s: %s since the cache's rows were encoded; its first %d rows encode the same, going on", location, changed, rows)
    return True


def _same_rows(array: JaggedArray, first: int, rows: int, lengths: np.ndarray, values: np.ndarray) -> bool:
    """Whether rows ``first`` to ``first + rows - 1`` of ``array`` hold the first ``rows`` of ``lengths`` and ``values``."""
    bounds = array.row_bounds(first, first + rows)
    stored = np.diff(bounds)
    return np.array_equal(stored, lengths[:rows]) and np.array_equal(
        array.read_tokens(int(bounds[0]), int(bounds[-1])), values[: int(stored.sum())])


def _changed(recorded: dict[str, str] | None, state: dict[str, str]) -> str:
    """What differs between the recorded encoding state and this one, in words."""
    if not isinstance(recorded, dict):
        return "the libraries and code that encoded it are not recorded (a cache built before they were)"
    names = [name for name in state if recorded.get(name) != state[name]]
    return f"{', '.join(names)} changed"
