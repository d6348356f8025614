"""The peer workloads W1-W4 against a real ``tidings serve``, through the Python client.

    python -m benchmarks.workloads                    # starts its own server, 3 runs each
    python -m benchmarks.workloads --url http://127.0.0.1:8470 --repeat 1

W1  publish 200,000 x 100 B and 50,000 x 1 KiB in batches of 500, durable
W2  read all of it back (non-transactional and read-committed polls)
W3  end-to-end latency at 1,000 msg/s for 10 s: publish -> transactional consumer
W4  2,000 transactions, each: begin, 5 x 100 B to each of 2 topics, commit

Prints one line per run and the median of the runs. Every loop is bounded in count and
time; the server it starts listens on 127.0.0.1 and is stopped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx

from tidings import AsyncClient

BATCH = 500


def wait_healthy(url: str, timeout: float) -> bool:
    """Poll ``url``'s ``/healthz`` until it answers 200 (True) or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/healthz", timeout=0.5).status_code == 200:
                return True
        except httpx.HTTPError:
            time.sleep(0.05)
    return False


def user_system_seconds(pid: int) -> tuple[float, float]:
    """User and system CPU seconds process ``pid`` has used so far (from /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds process ``pid`` has used so far (from /proc)."""
    return sum(user_system_seconds(pid))


def context_switches(pid: int) -> int:
    """Context switches (voluntary and not) of every thread of process ``pid`` so far
    (from /proc; threads that ended are not counted)."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/status") as f:
                for line in f:
                    if "ctxt_switches:" in line:  # voluntary and nonvoluntary
                        total += int(line.split()[1])
        except FileNotFoundError:
            continue  # the thread ended meanwhile
    return total


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """A throwaway ``tidings serve`` on 127.0.0.1 with its own data dir (or over
    ``data_dir``, which it then leaves in place)."""

    def __init__(
        self, extra: list[str], data_dir: Path | None = None, start_timeout: float = 20.0
    ) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="tidings-bench-"))
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        data = data_dir if data_dir is not None else self.dir / "data"
        cmd = [sys.executable, "-m", "tidings", "serve", "--port", str(self.port),
               "--data-dir", str(data), *extra]  # fmt: skip
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if not wait_healthy(self.url, start_timeout):
            self.stop()
            raise RuntimeError("server did not start")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


async def _gather_bounded(jobs: list[Callable[[], Awaitable[None]]], concurrency: int) -> None:
    queue = list(reversed(jobs))

    async def worker() -> None:
        while queue:
            await queue.pop()()

    await asyncio.gather(*(worker() for _ in range(concurrency)))


async def w1(client: AsyncClient, count: int, size: int, concurrency: int) -> tuple[str, float]:
    topic = _name(f"w1-{size}")
    await client.create_topic(topic)
    payload = os.urandom(size)
    batch = [payload] * BATCH

    def job() -> Callable[[], Awaitable[None]]:
        async def run() -> None:
            await client.publish(topic, batch)

        return run

    started = time.perf_counter()
    await _gather_bounded([job() for _ in range(count // BATCH)], concurrency)
    elapsed = time.perf_counter() - started
    return topic, elapsed


async def w2(client: AsyncClient, topic: str, expected: int, transactional: bool) -> float:
    # The user-facing way to read a topic: a consumer, page by page (it reads ahead).
    started = time.perf_counter()
    seen = 0
    consumer = client.consume(topic, transactional=transactional, follow=False, batch_size=10_000)
    deadline = time.monotonic() + 120
    while seen < expected and time.monotonic() < deadline:
        batch = await consumer.poll()
        if not batch:
            break
        seen += len(batch)
    consumer.close()
    elapsed = time.perf_counter() - started
    if seen != expected:
        raise RuntimeError(f"W2 read {seen} of {expected} messages")
    return elapsed


async def w3(client: AsyncClient, rate: int, seconds: float) -> list[float]:
    topic = _name("w3")
    await client.create_topic(topic)
    total = int(rate * seconds)
    latencies: list[float] = []
    sent: dict[bytes, int] = {}

    async def consume() -> None:
        consumer = client.consume(topic, "earliest", transactional=True, wait=1.0)
        deadline = time.monotonic() + seconds + 15
        async for message in consumer:
            now = time.perf_counter_ns()
            t0 = sent.get(message.payload)
            if t0 is not None:
                latencies.append((now - t0) / 1e6)
            if len(latencies) >= total or time.monotonic() > deadline:
                break

    consumer_task = asyncio.create_task(consume())
    await asyncio.sleep(0.2)  # let the consumer reach its first long-poll
    interval = 1.0 / rate
    next_at = time.perf_counter()
    for i in range(total):
        delay = next_at - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        payload = i.to_bytes(8, "big") + b"x" * 92
        sent[payload] = time.perf_counter_ns()
        await client.publish(topic, [payload])
        next_at += interval
    await asyncio.wait_for(consumer_task, timeout=seconds + 20)
    return latencies


async def w4(client: AsyncClient, count: int, concurrency: int) -> float:
    a, b = _name("w4a"), _name("w4b")
    await client.create_topic(a)
    await client.create_topic(b)
    payload = b"x" * 100

    def job() -> Callable[[], Awaitable[None]]:
        async def run() -> None:
            async with client.transaction() as tx:
                await tx.publish(a, [payload] * 5)
                await tx.publish(b, [payload] * 5)

        return run

    started = time.perf_counter()
    await _gather_bounded([job() for _ in range(count)], concurrency)
    return time.perf_counter() - started


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def run_once(url: str, args: argparse.Namespace) -> dict[str, float]:
    out: dict[str, float] = {}
    token = _AUTH_TOKEN if args.auth else None
    async with AsyncClient(url, max_connections=max(args.concurrency, 4), token=token) as client:
        if "W1" in args.workloads or "W2" in args.workloads:
            t100, e100 = await w1(client, args.w1_small, 100, args.concurrency)
            t1k, e1k = await w1(client, args.w1_large, 1024, args.concurrency)
            out["W1 100B msg/s"] = args.w1_small / e100
            out["W1 100B MB/s"] = args.w1_small * 100 / e100 / 1e6
            out["W1 1KiB msg/s"] = args.w1_large / e1k
            out["W1 1KiB MB/s"] = args.w1_large * 1024 / e1k / 1e6
            if "W2" in args.workloads:
                e = await w2(client, t100, args.w1_small, transactional=False)
                out["W2 100B msg/s"] = args.w1_small / e
                e = await w2(client, t100, args.w1_small, transactional=True)
                out["W2 100B read-committed msg/s"] = args.w1_small / e
                e = await w2(client, t1k, args.w1_large, transactional=False)
                out["W2 1KiB msg/s"] = args.w1_large / e
        if "W3" in args.workloads:
            lat = await w3(client, args.w3_rate, args.w3_seconds)
            out["W3 p50 ms"] = statistics.median(lat)
            out["W3 p99 ms"] = _pct(lat, 0.99)
            out["W3 max ms"] = max(lat)
            out["W3 received"] = len(lat)
        if "W4" in args.workloads:
            e = await w4(client, args.w4_count, args.concurrency)
            out["W4 tx/s"] = args.w4_count / e
    return out


_AUTH_TOKEN = "benchmark-token-0123456789"


def _auth_file() -> str:
    """An auth file admitting the benchmark's token (an admin: the workloads create
    topics); every request is authenticated and checked against the table."""
    digest = hashlib.sha256(_AUTH_TOKEN.encode()).hexdigest()
    path = Path(tempfile.mkdtemp(prefix="tidings-bench-auth-")) / "auth.toml"
    path.write_text(
        f'[[principal]]\nname = "bench"\ntoken_sha256 = "{digest}"\nadmin = true\n'
        'publish = ["*"]\nconsume = ["*"]\ntransactional_ids = ["*"]\n'
    )
    return str(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="an already running server (default: start one)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=8, help="requests in flight")
    parser.add_argument("--workloads", nargs="+", default=["W1", "W2", "W3", "W4"])
    parser.add_argument("--w1-small", type=int, default=200_000)
    parser.add_argument("--w1-large", type=int, default=50_000)
    parser.add_argument("--w3-rate", type=int, default=1000)
    parser.add_argument("--w3-seconds", type=float, default=10.0)
    parser.add_argument("--w4-count", type=int, default=2000)
    parser.add_argument("--server-arg", action="append", default=[], help="extra serve flag")
    parser.add_argument(
        "--auth", action="store_true", help="serve with an auth file; the client sends a token"
    )
    args = parser.parse_args()
    if args.auth and not args.url:
        args.server_arg += ["--auth-file", _auth_file()]

    runs: list[dict[str, float]] = []
    for i in range(args.repeat):
        server = None if args.url else Server(args.server_arg)
        try:
            url = args.url or (server.url if server else "")
            result = asyncio.run(run_once(url, args))
        finally:
            if server:
                server.stop()
        runs.append(result)
        print(f"run {i + 1}: " + ", ".join(f"{k} {v:,.2f}" for k, v in result.items()))
    print("median of", len(runs), "runs:")
    for key in runs[0]:
        print(f"  {key:32s} {statistics.median(r[key] for r in runs):>14,.2f}")


if __name__ == "__main__":
    main()
