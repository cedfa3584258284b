"""Building many small sources straight into an object store: seconds and requests, a cache per source against packs.

    python scripts/bench_s3_build.py [--sources 100] [--latency_ms 0 30] [--corpus ../shared/corpus]

N sources are cut from the corpus as ``bench_many_sources.py`` cuts them (40 documents each, about 72 k tokens) and
built with ``build_caches`` into ``s3://`` on a real S3 server process on 127.0.0.1 (moto's, from the dev install),
through ``tests/s3_server.py``'s proxy, which holds each request ``--latency_ms`` before passing it on and counts them.
Each build is timed whole in this process (tokenizer libraries imported by the first), once with what a build on
object storage does by default (a cache per source: ``build.pack_below_bytes`` 0 there) and once with packs
(``pack_below_bytes`` 16 MiB, as a local cache_dir has it). moto answers each request with about 2 ms of CPU on the
machine's own cores, so at 0 ms the figure is mostly the server's; the requests per source are the store's own count.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_many_sources as many  # noqa: E402 - the same sources as the reads' benchmark

BUCKET = "tokenmix-bench-build"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sources", type=int, default=100)
    parser.add_argument("--latency_ms", type=float, nargs="+", default=[0.0, 30.0])
    parser.add_argument("--corpus", default=str(many.REPO.parent / "shared" / "corpus"))
    parser.add_argument("--tokenizer", default=str(many.REPO / "data" / "tokenizer"))
    args = parser.parse_args()
    from tokenmix import build_caches, load_data_config

    docs = many.corpus_documents(args.corpus)
    print(f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}; {args.sources} sources", flush=True)
    print("| latency | layout | build | tokens/s | requests | requests a source | most in flight |\n|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="tokenmix-bench-s3-build-") as scratch:
        server = many.S3Server(scratch, BUCKET)
        try:
            os.environ.update({"AWS_REGION": "us-east-1", **server.keys})
            for latency in args.latency_ms:
                proxy = many.LatencyProxy(server.port, latency / 1000)
                os.environ["AWS_ENDPOINT_URL"] = proxy.endpoint
                for layout, pack_below in (("a cache per source", 0), ("packs", 16 << 20)):
                    root = Path(scratch) / f"{latency:g}-{pack_below}"
                    config = many.write_sources(docs, args.sources, root, f"s3://{BUCKET}/{root.name}", args.tokenizer)
                    config["build"] = {"pack_below_bytes": pack_below}
                    before, proxy.most_held = proxy.requests, 0
                    started = time.perf_counter()
                    built = build_caches(load_data_config(config), progress=False)
                    seconds = time.perf_counter() - started
                    requests = proxy.requests - before
                    tokens = sum(int(stats["tokens"]) for stats in built.values())
                    print(f"| {latency:g} ms | {layout} | {seconds:.1f} s | {tokens / seconds / 1e6:.2f} M | {requests} | "
                          f"{requests / args.sources:.1f} | {proxy.most_held} |", flush=True)
        finally:
            server.stop()


if __name__ == "__main__":
    main()
