"""Peak memory and time of tokenizing one very long document, against the raw tokenizer on the same text.

Builds a document of ``--mb`` megabytes from the corpus' texts (joined with blank lines), writes it as one
JSON-lines record, then in fresh processes, alternating, best of ``--repeats``:

- ``build``: ``DocumentEncoder.encode`` of the record's chunk, as a cache build runs it, with ``tokenizers``;
- ``build-fast``: the same with the ``fastokens`` backend;
- ``raw``: ``Tokenizer.encode_batch_fast([text])`` on the same text, the whole document at once (the limit).

Each process reports its peak resident memory (``VmHWM``) and its encode time. The ids are compared once.

    .venv/bin/python scripts/bench_long_docs.py --corpus ../shared/corpus --mb 50
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile

import zstandard

WORKER = r"""
import dataclasses, json, sys, time, numpy as np
from tokenmix import TextLmDatasetFormat, TokenizationConfig
from tokenmix.formats.encoder import DocumentEncoder
from tokenmix.sources import FileShard

mode, path, tokenizer, out = sys.argv[1:5]
if mode.startswith("build"):
    spec, _ = TokenizationConfig(tokenizer=tokenizer, enforce_eos=False).encoder_spec(TextLmDatasetFormat(), "bench")
    encoder = DocumentEncoder(dataclasses.replace(spec, backend="fastokens" if mode == "build-fast" else "tokenizers"))
    chunk = next(iter(FileShard(path).read()))
    started = time.perf_counter()
    ids = encoder.encode(chunk).tokens
else:
    from tokenizers import Tokenizer
    text = json.loads(open(path, "rb").read())["text"]
    tokenizer = Tokenizer.from_file(tokenizer + "/tokenizer.json")
    started = time.perf_counter()
    ids = np.asarray(tokenizer.encode_batch_fast([text], add_special_tokens=False)[0].ids, np.uint16)
seconds = time.perf_counter() - started
peak = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
np.save(out, ids)
print(json.dumps({"seconds": seconds, "peak_mib": peak / 1024, "tokens": len(ids)}))
"""


def make_document(corpus: str, megabytes: float, path: str) -> int:
    texts: list[str] = []
    size = 0
    while size < megabytes * 1e6:
        for shard in sorted(glob.glob(os.path.join(corpus, "*", "train-*.jsonl.zst"))):
            data = zstandard.ZstdDecompressor().stream_reader(open(shard, "rb"), read_across_frames=True).read()
            for line in data.splitlines():
                texts.append(json.loads(line)["text"])
                size += len(texts[-1].encode("utf-8"))
                if size >= megabytes * 1e6:
                    break
            if size >= megabytes * 1e6:
                break
    with open(path, "wb") as f:
        f.write(json.dumps({"text": "\n\n".join(texts)}).encode("utf-8") + b"\n")
    return size


def run(mode: str, path: str, tokenizer: str, out: str) -> dict:
    result = subprocess.run([sys.executable, "-c", WORKER, mode, path, tokenizer, out], check=True, capture_output=True, text=True)
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", default=os.path.join("..", "shared", "corpus"))
    parser.add_argument("--tokenizer", default=os.path.join("data", "tokenizer"))
    parser.add_argument("--mb", type=float, default=50.0)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    import numpy as np

    with tempfile.TemporaryDirectory() as scratch:
        doc = os.path.join(scratch, "doc.jsonl")
        size = make_document(args.corpus, args.mb, doc)
        print(f"document: {size / 1e6:.1f} MB of UTF-8 text")
        best: dict[str, dict] = {}
        for _ in range(args.repeats):
            for mode in ("build", "build-fast", "raw"):
                result = run(mode, doc, args.tokenizer, os.path.join(scratch, f"{mode}.npy"))
                print(f"  {mode:<10} {result['seconds']:6.1f} s  peak {result['peak_mib']:7.0f} MiB  {result['tokens']:,} tokens")
                if mode not in best or result["seconds"] < best[mode]["seconds"]:
                    best[mode] = {**result, "peak_mib": min(result["peak_mib"], best.get(mode, result)["peak_mib"])}
        raw_ids = np.load(os.path.join(scratch, "raw.npy"))
        same = {m: np.array_equal(np.load(os.path.join(scratch, f"{m}.npy")), raw_ids) for m in ("build", "build-fast")}
    raw = best["raw"]
    print(f"ids identical to raw: {same}")
    for mode in ("build", "build-fast"):
        build = best[mode]
        print(f"| {size / 1e6:.0f} MB | {mode} | {build['seconds']:.1f} s | {raw['seconds']:.1f} s | {raw['seconds'] / build['seconds']:.2f}x | "
              f"{build['peak_mib']:.0f} MiB | {raw['peak_mib']:.0f} MiB |")


if __name__ == "__main__":
    main()
