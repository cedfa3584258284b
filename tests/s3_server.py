"""A real S3-compatible server process on 127.0.0.1, and a proxy in front of it that delays every request and counts the
requests and the bytes returned: how the tests and the benchmarks (``scripts/bench_object_reads.py``,
``scripts/bench_many_sources.py``, which put this directory on their path) read caches from an object store with a
cloud bucket's latency, on loopback only.

The latency is made in the proxy: each burst of request bytes a client sends (an HTTP request; clients send one at a
time per connection) is held ``latency`` seconds before it is passed on, so every request costs at least that, and
requests on separate connections overlap as they would against a bucket.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import psutil

BUCKET = "tokenmix-test"
"""The bucket the tests' server (the ``s3`` fixture) holds."""
_PORT_TRIES = 5


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (for a server, or a coordinator the test's processes join)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class S3Server:
    """An S3 server process (moto's, from the dev install, or s3rver from npm) on 127.0.0.1 holding ``bucket``; ``keys``
    is the environment its clients need besides the endpoint."""

    def __init__(self, scratch: str, bucket: str, kind: str = "moto"):
        self.bucket = bucket
        self.log_path = os.path.join(scratch, f"{kind}.log")
        if kind == "moto":
            server = shutil.which("moto_server", path=os.path.dirname(sys.executable))
            if server is None:
                raise FileNotFoundError("moto_server is not installed: pip install 'tokenmix[dev]'")
            command = [server, "-H", "127.0.0.1", "-p"]
            self.keys = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test"}
        elif kind == "s3rver":
            server = shutil.which("s3rver") or shutil.which("s3rver", path="node_modules/.bin")
            if server is None:
                raise FileNotFoundError("s3rver is not installed: npm install s3rver@3 (here, or globally)")
            os.makedirs(os.path.join(scratch, "s3rver"), exist_ok=True)
            command = [server, "-d", os.path.join(scratch, "s3rver"), "-a", "127.0.0.1", "--silent", "-p"]
            self.keys = {"AWS_ACCESS_KEY_ID": "S3RVER", "AWS_SECRET_ACCESS_KEY": "S3RVER"}
        else:
            raise ValueError(f"S3 server kind must be moto or s3rver, got {kind!r}")
        self._log = open(self.log_path, "w")
        # the server binds a port found free a moment before: where another process took it since (a server of another
        # test worker, which would answer in its place), it starts again on another
        for _ in range(_PORT_TRIES):
            self.port = free_port()
            self.process = subprocess.Popen([*command, str(self.port)], stdout=self._log, stderr=subprocess.STDOUT)
            if self._serving():
                return
        self.stop()
        raise RuntimeError(f"the S3 server did not start on any of {_PORT_TRIES} ports; see {self.log_path}")

    def _serving(self) -> bool:
        """Wait until this server answers on ``port`` holding ``bucket``: True, or False (stopped) where it exited, or
        another process listens there."""
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(urllib.request.Request(f"{self.endpoint}/{self.bucket}", method="PUT"), timeout=2).read()
                if self._listening():
                    return True
            except OSError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"the S3 server did not start in 60 s; see {self.log_path}") from None
            if self.process.poll() is not None:
                return False
            time.sleep(0.1)

    def _listening(self) -> bool:
        """Whether this server's process (or a child of it) is the one listening on ``port``."""
        me = psutil.Process(self.process.pid)
        for process in [me, *me.children(recursive=True)]:
            try:
                if any(c.status == psutil.CONN_LISTEN and c.laddr.port == self.port for c in process.net_connections("tcp")):
                    return True
            except psutil.NoSuchProcess:
                continue
        return False

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)
        if not self._log.closed:
            self._log.close()


class LatencyProxy:
    """A TCP proxy on 127.0.0.1 in front of ``upstream_port`` that holds each burst of request bytes for ``latency``
    seconds before passing it on, and counts requests, the response bytes it returns, and the most requests it held at
    once (``most_held``: 1 where requests only ever come one after another)."""

    def __init__(self, upstream_port: int, latency: float):
        self.upstream_port, self.latency = upstream_port, latency
        self.port = 0  # the one the system gives the server, set before it is started
        self.requests = 0
        self.bytes_returned = 0
        self.most_held = 0
        self._held = 0
        self._loop = asyncio.new_event_loop()
        started = threading.Event()
        threading.Thread(target=self._serve, args=(started,), daemon=True, name="latency-proxy").start()
        started.wait()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def counts(self) -> tuple[int, int]:
        """Requests passed on and response bytes returned so far."""
        return self.requests, self.bytes_returned

    def _serve(self, started: threading.Event) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(asyncio.start_server(self._connection, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        started.set()
        self._loop.run_until_complete(server.serve_forever())

    async def _connection(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        up_r, up_w = await asyncio.open_connection("127.0.0.1", self.upstream_port)

        async def requests() -> None:
            while data := await client_r.read(1 << 16):
                self.requests += 1
                self._held += 1
                self.most_held = max(self.most_held, self._held)
                await asyncio.sleep(self.latency)
                self._held -= 1
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
