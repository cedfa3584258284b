"""Shuffled mixture reads from caches on object storage, through the loader with prefetch, against the same caches on
local disk.

    python scripts/bench_object_reads.py [--config_path config/shared_corpus.yaml] [--latency_ms 20] [--batches 50]
                                         [--prefetch 8] [--read_ahead 0] [--compression zstd] [--server moto|s3rver]

Builds the config's caches on local disk, copies them to an S3-compatible server (a real server process on 127.0.0.1:
moto's from the dev install, or s3rver from npm, twice as fast here), and reads shuffled 64 x 2048 batches of the
three-source mixture through ``DataLoader`` (prefetch ``--prefetch`` batches, the reads of ``--read_ahead`` later steps
started early, one CPU device) with the chunk cache off,
as a corpus far larger than it would be read:

- from local disk (the limit);
- from s3:// through tensorstore's own s3 driver (``TOKENMIX_OBJECT_READS=tensorstore``, the default);
- from s3:// through s3fs (``TOKENMIX_OBJECT_READS=fsspec``).

Requests reach the server through a proxy on 127.0.0.1 that delays each request by ``--latency_ms`` (a cloud bucket's
first-byte latency) and counts the bytes it returns, so each remote run reports bytes fetched per token read and
requests per batch. Opening the mixture (ledgers, row ends) is timed apart from streaming.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import jax
import numpy as np

from tokenmix import DataLoader, build_caches, load_data_config
from tokenmix.cache import chunk_cache

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from s3_server import LatencyProxy, S3Server  # noqa: E402 - the tests' server and proxy, one copy

BUCKET = "tokenmix-bench"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config_path", default="config/shared_corpus.yaml")
    parser.add_argument("--latency_ms", type=float, default=20.0)
    parser.add_argument("--batches", type=int, default=50)
    parser.add_argument("--prefetch", type=int, default=8)
    parser.add_argument("--read_ahead", type=int, default=0)
    parser.add_argument("--compression", default="zstd", choices=("zstd", "none"))
    parser.add_argument("--server", default="moto", choices=("moto", "s3rver"),
                        help="moto (pip, ~300 small requests/s here) or s3rver (npm, ~600 small requests/s here)")
    args = parser.parse_args()
    batch, seq_len = 64, 2048
    chunk_cache.SHARED.max_bytes = 0
    mesh = jax.make_mesh((1,), ("data",), devices=jax.devices("cpu")[:1])
    with tempfile.TemporaryDirectory(prefix="tokenmix-bench-object-") as scratch:
        try:
            server = S3Server(scratch, BUCKET, args.server)
        except FileNotFoundError as e:
            raise SystemExit(str(e)) from None
        server_port, keys = server.port, server.keys
        try:
            local_dir = os.path.join(scratch, "caches")
            local = load_data_config(args.config_path, ["--cache_dir", local_dir, "--build.compression", args.compression])
            build_caches(local, progress=False)
            os.environ.update({**keys, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{server_port}"})
            import s3fs

            s3fs.S3FileSystem(skip_instance_cache=True).put(local_dir + "/", f"{BUCKET}/caches/", recursive=True)
            proxy = LatencyProxy(server_port, args.latency_ms / 1000)
            os.environ["AWS_ENDPOINT_URL"] = f"http://127.0.0.1:{proxy.port}"
            remote = load_data_config(args.config_path, ["--cache_dir", f"s3://{BUCKET}/caches", "--build.compression", args.compression])
            results = {}
            reference = None
            for label, config, reads in (("local disk", local, "tensorstore"), ("s3, tensorstore driver", remote, "tensorstore"),
                                         ("s3, fsspec (s3fs)", remote, "fsspec")):
                os.environ["TOKENMIX_OBJECT_READS"] = reads
                requests, fetched = proxy.requests, proxy.bytes_returned
                started = time.perf_counter()
                train = config.train_set(seq_len)
                opened = time.perf_counter() - started
                open_requests = proxy.requests - requests
                requests, fetched = proxy.requests, proxy.bytes_returned
                started = time.perf_counter()
                tokens = []
                with DataLoader(train, batch, mesh, {"batch": "data"}, prefetch=args.prefetch, read_ahead=args.read_ahead) as loader:
                    for step_batch, _ in zip(loader.iter_from_step(0), range(args.batches)):
                        tokens.append(np.asarray(step_batch.batch.tokens.array))
                elapsed = time.perf_counter() - started
                read = args.batches * batch * seq_len
                if reference is None:
                    reference = tokens
                assert all(np.array_equal(a, b) for a, b in zip(tokens, reference)), f"{label}: other tokens than from local disk"
                results[label] = (read / elapsed, opened, open_requests, (proxy.bytes_returned - fetched) / read,
                                  (proxy.requests - requests) / args.batches)
        finally:
            server.stop()
    limit = results["local disk"][0]
    print(f"{args.batches} shuffled batches of {batch} x {seq_len} from {args.server}, chunk cache off, compression {args.compression}, "
          f"prefetch {args.prefetch}, read_ahead {args.read_ahead}, {args.latency_ms:g} ms per request:")
    for label, (rate, opened, open_requests, per_token, per_batch) in results.items():
        remote_part = f", {per_token:.2f} bytes fetched per token read, {per_batch:.0f} requests per batch" if label != "local disk" else ""
        print(f"  {label:<24} {rate / 1e6:7.2f} M tokens/s ({rate / limit:.3f}x local disk); opened in {opened:.2f} s "
              f"({open_requests} requests){remote_part}")


if __name__ == "__main__":
    main()
