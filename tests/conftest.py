"""Shared fixtures: the real bundled tokenizer, real corpus files, helpers to write shards and build caches."""

from __future__ import annotations

import dataclasses
import gzip
import json
import os
from pathlib import Path
from typing import Any

import pytest
import zstandard

from tokenmix import BuildOptions, LmDatasetFormatBase, TextLmDatasetFormat, TokenizationConfig
from tokenmix.cache import CacheBuilder
from tokenmix.sources import FileShard

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
# the mesh tests want 8 fake CPU devices; the flag only works before JAX starts, and conftest runs first
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

REPO = Path(__file__).resolve().parents[1]
TOKENIZER = str(REPO / "data" / "tokenizer")
DEMO_CORPUS = REPO / "data" / "demo"


def read_jsonl_zst(path: Path) -> list[dict[str, Any]]:
    raw = zstandard.ZstdDecompressor().stream_reader(open(path, "rb"), read_across_frames=True).read()
    return [json.loads(line) for line in raw.splitlines() if line.strip()]


def write_lines(path: Path, lines: list[bytes]) -> str:
    """Write raw lines (bytes, newline added) to path, compressed by its suffix."""
    data = b"".join(line + b"\n" for line in lines)
    if path.suffix == ".gz":
        data = gzip.compress(data)
    elif path.suffix == ".zst":
        data = zstandard.ZstdCompressor().compress(data)
    path.write_bytes(data)
    return str(path)


def write_jsonl(path: Path, records: list[Any]) -> str:
    return write_lines(path, [json.dumps(r).encode() for r in records])


def encoder_for(fmt: LmDatasetFormatBase | None = None, tokenizer: str = TOKENIZER, **kw: Any):
    return TokenizationConfig(tokenizer=tokenizer, **kw).encoder_spec(fmt or TextLmDatasetFormat(), "test")


def build(location: str, urls: list[str], fmt: LmDatasetFormatBase | None = None, tokenizer: str = TOKENIZER,
          tokenization: dict[str, Any] | None = None, **options: Any) -> dict[str, Any]:
    options.setdefault("num_workers", 0)
    spec, identity = encoder_for(fmt, tokenizer, **(tokenization or {}))
    builder = CacheBuilder(location, [FileShard(u) for u in urls], spec, identity, BuildOptions(**options))
    return builder.build()


def cache_bytes(location: str) -> dict[str, bytes]:
    """Every file of a local cache; stats.json without its timing section."""
    out = {}
    for root, _, files in os.walk(location):
        for name in files:
            path = os.path.join(root, name)
            data = Path(path).read_bytes()
            if name == "stats.json":
                doc = json.loads(data)
                doc.pop("build")
                data = json.dumps(doc, sort_keys=True).encode()
            out[os.path.relpath(path, location)] = data
    return out


class GatedShard:
    """A real file shard that holds back its records until released (to catch a build mid-way)."""

    def __init__(self, shard, gate):
        self._shard = shard
        self._gate = gate
        self.name = shard.name

    def size_bytes(self):
        return self._shard.size_bytes()

    def position_label(self, position):
        return self._shard.position_label(position)

    def read(self, start=0, chunk_bytes=1 << 20):
        if self._gate is not None:
            self._gate.wait()
        yield from self._shard.read(start, chunk_bytes)


@pytest.fixture(scope="session")
def demo_docs() -> dict[str, list[dict[str, Any]]]:
    """The bundled demo corpus' training records, per source, in shard order."""
    out = {}
    for source in ("linux_doc", "python_doc", "webster"):
        out[source] = [r for i in range(2) for r in read_jsonl_zst(DEMO_CORPUS / source / f"train-0{i}-of-02.jsonl.zst")]
    return out


@pytest.fixture(scope="session")
def hf_tokenizer():
    from tokenmix.formats import load_tokenizer

    return load_tokenizer(TOKENIZER)


def with_format(config: Any, source: str, fmt: LmDatasetFormatBase | None = None, **changes: Any) -> Any:
    """A copy of a mixture config whose source has another format (or its format with ``changes``)."""
    old = config.configs[source]
    new = dataclasses.replace(old, format=fmt or dataclasses.replace(old.format, **changes))
    return dataclasses.replace(config, configs={**config.configs, source: new})


def demo_urls(source: str) -> list[str]:
    return [str(DEMO_CORPUS / source / f"train-0{i}-of-02.jsonl.zst") for i in range(2)]
