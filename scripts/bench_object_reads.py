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
import asyncio
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import jax
import numpy as np

from tokenmix import DataLoader, build_caches, load_data_config
from tokenmix.cache import chunk_cache

BUCKET = "tokenmix-bench"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LatencyProxy:
    """A TCP proxy on 127.0.0.1 that holds each burst of request bytes for ``latency`` seconds before passing it on,
    and counts requests and the response bytes it returns."""

    def __init__(self, upstream_port: int, latency: float):
        self.upstream_port, self.latency = upstream_port, latency
        self.port = free_port()
        self.requests = 0
        self.bytes_returned = 0
        self._loop = asyncio.new_event_loop()
        started = threading.Event()
        threading.Thread(target=self._serve, args=(started,), daemon=True).start()
        started.wait()

    def _serve(self, started: threading.Event) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(asyncio.start_server(self._connection, "127.0.0.1", self.port))
        started.set()
        self._loop.run_until_complete(server.serve_forever())

    async def _connection(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        up_r, up_w = await asyncio.open_connection("127.0.0.1", self.upstream_port)

        async def requests() -> None:
            while data := await client_r.read(1 << 16):
                self.requests += 1
                await asyncio.sleep(self.latency)
                up_w.write(data)
                await up_w.drain()
            up_w.close()

        async def responses() -> None:
            while data := await up_r.read(1 << 16):
                self.bytes_returned += len(data)
                client_w.write(data)
                await client_w.drain()
            client_w.close()

        await asyncio.gather(requests(), responses(), return_exceptions=True)


def start_server(kind: str, scratch: str) -> tuple[subprocess.Popen, int, dict[str, str]]:
    """An S3 server process on 127.0.0.1 with the benchmark's bucket: its process, port and the keys it takes."""
    port = free_port()
    log_path = os.path.join(scratch, f"{kind}.log")
    if kind == "moto":
        server = shutil.which("moto_server", path=os.path.dirname(sys.executable))
        if server is None:
            raise SystemExit("moto_server is not installed: pip install 'tokenmix[dev]'")
        command, keys = [server, "-H", "127.0.0.1", "-p", str(port)], {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench"}
    else:
        server = shutil.which("s3rver") or shutil.which("s3rver", path="node_modules/.bin")
        if server is None:
            raise SystemExit("s3rver is not installed: npm install s3rver@3 (here, or globally)")
        os.makedirs(os.path.join(scratch, "s3rver"))
        command = [server, "-d", os.path.join(scratch, "s3rver"), "-a", "127.0.0.1", "-p", str(port), "--silent"]
        keys = {"AWS_ACCESS_KEY_ID": "S3RVER", "AWS_SECRET_ACCESS_KEY": "S3RVER"}
    proc = subprocess.Popen(command, stdout=open(log_path, "w"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{port}/{BUCKET}", method="PUT"), timeout=2).read()
            return proc, port, keys
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise SystemExit(f"the S3 server did not start; see {log_path}") from None
            time.sleep(0.1)


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
        server, server_port, keys = start_server(args.server, scratch)
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
            server.terminate()
            server.wait(timeout=30)
    limit = results["local disk"][0]
    print(f"{args.batches} shuffled batches of {batch} x {seq_len} from {args.server}, chunk cache off, compression {args.compression}, "
          f"prefetch {args.prefetch}, read_ahead {args.read_ahead}, {args.latency_ms:g} ms per request:")
    for label, (rate, opened, open_requests, per_token, per_batch) in results.items():
        remote_part = f", {per_token:.2f} bytes fetched per token read, {per_batch:.0f} requests per batch" if label != "local disk" else ""
        print(f"  {label:<24} {rate / 1e6:7.2f} M tokens/s ({rate / limit:.3f}x local disk); opened in {opened:.2f} s "
              f"({open_requests} requests){remote_part}")


if __name__ == "__main__":
    main()
