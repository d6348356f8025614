"""Which HTTP library should the clients use? Each one against the same real server.

Workloads (bodies encoded once, up front, so only the HTTP work is timed):

- ``small``: 2,000 small POSTs (a poll of an empty topic: about 40 bytes each way, no
  fsync on the server, so the client's per-request cost shows);
- ``publish``: 200 publishes of 500 messages of 100 bytes (about 52 KB per body, each
  answered once durable).

Sync libraries send one request at a time; async ones one at a time too (the per-request
cost), then ``--concurrency`` at once.
Then the Tidings client itself publishes and polls with each body encoding (JSON or
the Avro extension), which decides the default ``media``.

    PYTHONPATH=. python benchmarks/http_clients.py           # starts its own server
    PYTHONPATH=. python benchmarks/http_clients.py --url http://127.0.0.1:8470 --repeat 5

Prints the best of ``--repeat`` runs per case (less noise from the shared machine).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
import timeit
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import aiohttp
import httpx
import urllib3

from tidings.client import AVRO_EXT, JSON, AsyncClient, Client, Media
from tidings.client.asyncio_transport import AsyncioTransport
from tidings.client.socket_transport import SocketTransport
from tidings.client.transports import Request
from tidings.codec import wire
from tidings.structs import Message, MessageId, Record

SMALL_REQUESTS = 2_000
PUBLISHES = 200
BATCH = 500
MESSAGE = 100


@contextlib.contextmanager
def local_server() -> Iterator[str]:
    """A ``tidings serve`` on a free port with a throw-away data dir."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory(prefix="tidings-bench-") as tmp:
        cmd = [sys.executable, "-m", "tidings", "serve", "--port", str(port)]
        cmd += ["--data-dir", str(Path(tmp) / "data")]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{port}"
        try:
            for _ in range(200):
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(url + "/healthz").status_code == 200:
                        break
                time.sleep(0.05)
            yield url
        finally:
            proc.terminate()
            proc.wait(10)


class Workload:
    """The URLs and pre-encoded bodies of both workloads."""

    def __init__(self, url: str, namespace: str = "default") -> None:
        base = f"{url}/v1/namespaces/{namespace}/topics"
        self.empty_topic = "bench-empty-" + uuid.uuid4().hex[:8]
        self.topic = "bench-" + uuid.uuid4().hex[:8]
        with Client(url) as client:
            client.create_topic(self.empty_topic)
            client.create_topic(self.topic)
        self.poll_url = f"{base}/{self.empty_topic}/poll"
        self.publish_url = f"{base}/{self.topic}/publish"
        self.poll_body = wire.encode_consume_request(wire.ConsumeRequest(limit=10), AVRO_EXT)
        records = [Record(os.urandom(MESSAGE)) for _ in range(BATCH)]
        self.publish_body = wire.encode_publish_request(None, records, AVRO_EXT)
        self.headers = {"Content-Type": AVRO_EXT.value}

    def cases(self) -> list[tuple[str, str, bytes, int]]:
        return [
            ("small", self.poll_url, self.poll_body, SMALL_REQUESTS),
            ("publish", self.publish_url, self.publish_body, PUBLISHES),
        ]


Timing = tuple[float, float]  # wall seconds, this process's CPU seconds


def time_sync(send: Callable[[], int], n: int) -> Timing:
    started, cpu = time.perf_counter(), time.process_time()
    for _ in range(n):
        if send() != 200:
            raise RuntimeError("request failed")
    return time.perf_counter() - started, time.process_time() - cpu


async def time_async(send: Callable[[], Awaitable[int]], n: int, concurrency: int) -> Timing:
    left = n

    async def worker() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            if await send() != 200:
                raise RuntimeError("request failed")

    started, cpu = time.perf_counter(), time.process_time()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.perf_counter() - started, time.process_time() - cpu


def bench_urllib3(w: Workload, url: str, body: bytes, n: int) -> Timing:
    pool = urllib3.PoolManager(maxsize=4, retries=False)
    try:
        return time_sync(lambda: pool.request("POST", url, body=body, headers=w.headers).status, n)
    finally:
        pool.clear()


def bench_tidings_socket(w: Workload, url: str, body: bytes, n: int) -> Timing:
    """Client's own transport (``tidings.client.socket_transport``)."""
    transport = SocketTransport(max_connections=4)
    request = Request("POST", url, body, w.headers["Content-Type"], 30.0)
    try:
        return time_sync(lambda: transport.send(request).status, n)
    finally:
        transport.close()


def bench_httpx(w: Workload, url: str, body: bytes, n: int) -> Timing:
    with httpx.Client() as client:
        return time_sync(lambda: client.post(url, content=body, headers=w.headers).status_code, n)


async def bench_aiohttp(w: Workload, url: str, body: bytes, n: int, concurrency: int) -> Timing:
    async with aiohttp.ClientSession() as session:

        async def send() -> int:
            async with session.post(url, data=body, headers=w.headers) as resp:
                await resp.read()
                return resp.status

        return await time_async(send, n, concurrency)


async def bench_tidings_asyncio(
    w: Workload, url: str, body: bytes, n: int, concurrency: int
) -> Timing:
    """AsyncClient's own transport (``tidings.client.asyncio_transport``)."""
    transport = AsyncioTransport(max_connections=concurrency)
    request = Request("POST", url, body, w.headers["Content-Type"], 30.0)
    try:

        async def send() -> int:
            return (await transport.send(request)).status

        return await time_async(send, n, concurrency)
    finally:
        await transport.aclose()


async def bench_httpx_async(w: Workload, url: str, body: bytes, n: int, concurrency: int) -> Timing:
    async with httpx.AsyncClient() as client:

        async def send() -> int:
            return (await client.post(url, content=body, headers=w.headers)).status_code

        return await time_async(send, n, concurrency)


def bench_media_sync(url: str, media: Media, topic: str) -> tuple[float, float]:
    records = [Record(os.urandom(MESSAGE)) for _ in range(BATCH)]
    with Client(url, media=media) as client:
        started = time.perf_counter()
        for _ in range(PUBLISHES):
            client.publish(topic, records)
        published = time.perf_counter() - started
        started = time.perf_counter()
        got = 0
        for _ in client.consume(topic, transactional=False, batch_size=5000, follow=False):
            got += 1
        consumed = time.perf_counter() - started
    assert got == PUBLISHES * BATCH, got
    return published, consumed


async def bench_media_async(url: str, media: Media, topic: str, concurrency: int) -> float:
    records = [Record(os.urandom(MESSAGE)) for _ in range(BATCH)]
    async with AsyncClient(url, media=media) as client:

        async def send() -> int:
            await client.publish(topic, records)
            return 200

        wall, _ = await time_async(send, PUBLISHES, concurrency)
        return wall


def best(runs: list[float]) -> float:
    return min(runs)


def codec_costs() -> None:
    """CPU per 500-message body for each medium: what client plus server spend on it."""
    records = [Record(os.urandom(MESSAGE)) for _ in range(BATCH)]
    messages = [Message(MessageId(1_700_000_000_000, i), r.payload) for i, r in enumerate(records)]

    def cost(fn: Callable[[], object]) -> float:
        return min(timeit.repeat(fn, number=100, repeat=5)) / 100 * 1e6

    print(f"CPU per body of {BATCH}x{MESSAGE} B, µs (publish: client encodes, server decodes;")
    print("poll answer: server encodes, client decodes)")
    print(f"{'media':<10}{'publish B':>10}{'enc':>7}{'dec':>7}{'poll B':>9}{'enc':>7}{'dec':>7}")
    for media in (JSON, AVRO_EXT):
        pub = wire.encode_publish_request(None, records, media)
        ans = wire.encode_messages(messages, media)
        print(
            f"{media.name:<10}{len(pub):>10,}"
            f"{cost(lambda m=media: wire.encode_publish_request(None, records, m)):>7,.0f}"
            f"{cost(lambda m=media, b=pub: wire.decode_publish_request(b, m)):>7,.0f}"
            f"{len(ans):>9,}"
            f"{cost(lambda m=media: wire.encode_messages(messages, m)):>7,.0f}"
            f"{cost(lambda m=media, b=ans: wire.decode_messages(b, m)):>7,.0f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="a running server (default: start one)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        url = args.url or stack.enter_context(local_server())
        run(url, args.repeat, args.concurrency)


def run(url: str, repeat: int, concurrency: int) -> None:
    w = Workload(url)
    print(f"server {url}; best of {repeat}; async concurrency {concurrency}")
    print("wall: elapsed time; cpu: this (client) process's CPU time per request")
    print(f"{'library':<28}{'workload':<10}{'seconds':>9}{'req/s':>10}{'µs/req':>9}{'cpu µs':>8}")
    for name, target, body, n in w.cases():
        results: dict[str, list[Timing]] = {}
        for _ in range(repeat):
            for lib, fn in (
                ("tidings socket (sync)", bench_tidings_socket),
                ("urllib3 (sync)", bench_urllib3),
                ("httpx (sync)", bench_httpx),
            ):
                results.setdefault(lib, []).append(fn(w, target, body, n))
            for lib, afn in (
                ("tidings asyncio", bench_tidings_asyncio),
                ("aiohttp", bench_aiohttp),
                ("httpx", bench_httpx_async),
            ):
                for c in sorted({1, concurrency}):
                    elapsed = asyncio.run(afn(w, target, body, n, c))
                    results.setdefault(f"{lib} (async, {c})", []).append(elapsed)
        for lib, runs in results.items():
            t = best([wall for wall, _ in runs])
            cpu = best([c for _, c in runs])
            print(
                f"{lib:<28}{name:<10}{t:>9.3f}{n / t:>10,.0f}{t / n * 1e6:>9,.0f}"
                f"{cpu / n * 1e6:>8,.0f}"
            )
    print()
    codec_costs()
    print()
    print(f"Tidings client, {PUBLISHES} publishes of {BATCH}x{MESSAGE} B, then consume all")
    print(f"{'media':<12}{'publish s':>11}{'consume s':>11}{'async publish s':>17}")
    for media in (JSON, AVRO_EXT):
        sync_pub, sync_con, async_pub = [], [], []
        for _ in range(repeat):
            topic = f"bench-{media.name.lower()}-{uuid.uuid4().hex[:8]}"
            with Client(url) as client:
                client.create_topic(topic)
            p, c = bench_media_sync(url, media, topic)
            sync_pub.append(p)
            sync_con.append(c)
            async_pub.append(asyncio.run(bench_media_async(url, media, topic, concurrency)))
        print(
            f"{media.name:<12}{best(sync_pub):>11.3f}{best(sync_con):>11.3f}"
            f"{best(async_pub):>17.3f}"
        )


if __name__ == "__main__":
    main()
