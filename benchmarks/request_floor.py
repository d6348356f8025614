"""What one small request costs end to end, from a bare TCP echo up to a durable publish.

W3 asks for p99 <= 1 ms from publish to a read-committed consumer. This measures the
floor under that figure, one request at a time with a 0.5 ms pause between requests
(W3's rhythm: every process goes idle between messages and must be woken), as round
trips through one kept-alive connection:

- ``tcp echo``: a uvloop server that answers each request with a fixed HTTP response
  from C callbacks (no HTTP parsing, no Python per request beyond one callback);
- ``uvicorn, trivial app``: uvicorn with the server's protocol and an ASGI app that
  answers ``{}`` at once (the HTTP framework alone);
- ``tidings /healthz``: the real server's cheapest endpoint (through Starlette);
- ``tidings empty poll``: a caught-up poll that finds nothing (JSON, no waiting);
- ``tidings publish, no fsync``: one 100 B message, server run with ``TIDINGS_SYNC=false``;
- ``tidings publish, durable``: the same with the default fsync before the answer;
- ``client publish, durable``: the same through ``AsyncClient.publish``.

The client side is a minimal asyncio reader that frames responses by Content-Length,
so the figures are the server's and the loopback's. For each case it prints the round
trip's p50/p99 and the server's CPU time per request (user + system, from /proc).
Rounds interleave the cases, since these machines drift from minute to minute.

    python -m benchmarks.request_floor --requests 2000 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

from benchmarks.workloads import Server, _free_port, _pct, cpu_seconds
from tidings import AsyncClient

_PAUSE = 0.0005
_RESPONSE = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"


def _serve_echo(port: int) -> None:
    import uvloop

    class Echo(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport: Any = transport

        def data_received(self, data: bytes) -> None:
            self.transport.write(_RESPONSE)

    async def run() -> None:
        server = await asyncio.get_running_loop().create_server(Echo, "127.0.0.1", port)
        async with server:
            await server.serve_forever()

    uvloop.run(run())


async def _trivial_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    headers = [(b"content-type", b"application/json"), (b"content-length", b"2")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": b"{}"})


def _serve_trivial(port: int) -> None:
    import uvicorn

    from tidings.server.protocol import HttpProtocol

    uvicorn.run(
        _trivial_app,
        host="127.0.0.1",
        port=port,
        http=HttpProtocol,
        loop="uvloop",
        log_level="error",
        access_log=False,
    )


class _Helper:
    """A server of this module (echo or trivial uvicorn) in a child process."""

    def __init__(self, kind: str) -> None:
        self.port = _free_port()
        cmd = [sys.executable, "-m", "benchmarks.request_floor", "--serve", kind, str(self.port)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.pid = self.proc.pid
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                asyncio.run(_probe(self.port))
                return
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"{kind} server did not start")

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)


async def _probe(port: int) -> None:
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.close()


class _Conn:
    """One kept-alive HTTP/1.1 connection that sends a request and reads its answer."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, port: int) -> _Conn:
        return cls(*await asyncio.open_connection("127.0.0.1", port))

    async def exchange(self, request: bytes) -> tuple[bytes, bytes]:
        self.writer.write(request)
        head = await self.reader.readuntil(b"\r\n\r\n")
        length = 0
        for line in head.lower().split(b"\r\n"):
            if line.startswith(b"content-length:"):
                length = int(line.split(b":", 1)[1])
        return head, await self.reader.readexactly(length)

    def close(self) -> None:
        self.writer.close()


def _request(method: str, path: str, body: bytes | None = None) -> bytes:
    head = f"{method} {path} HTTP/1.1\r\nhost: bench\r\n"
    if body is None:
        return (head + "\r\n").encode()
    head += f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
    return head.encode() + body


async def _timed(
    fn: Callable[[], Awaitable[object]], pid: int, count: int
) -> tuple[list[float], float]:
    for _ in range(50):  # warm up the connection and the server's code paths
        await fn()
        await asyncio.sleep(_PAUSE)
    times: list[float] = []
    cpu0 = cpu_seconds(pid)
    for _ in range(count):
        began = time.perf_counter()
        await fn()
        times.append((time.perf_counter() - began) * 1e3)
        await asyncio.sleep(_PAUSE)
    return times, (cpu_seconds(pid) - cpu0) / count * 1e6


async def _tidings_cases(server: Server, durable: bool, count: int) -> dict[str, Any]:
    topic = "floor"
    conn = await _Conn.open(server.port)
    pid = server.proc.pid
    base = f"/v1/namespaces/default/topics/{topic}"
    await conn.exchange(_request("PUT", base, b"{}"))
    payload = base64.b64encode(b"x" * 100).decode()
    publish = _request("POST", base + "/publish", b'{"messages": ["%s"]}' % payload.encode())
    await conn.exchange(publish)
    head, _ = await conn.exchange(_request("POST", base + "/poll", b'{"limit": 1}'))
    last_hex = head.split(b"tidings-last-id: ")[1].split(b"\r\n")[0].decode()
    last = base64.b64encode(bytes.fromhex(last_hex)).decode()
    # A publish moves the topic on, but a poll from this id stays caught up only if
    # nothing is published meanwhile: the empty polls run before the publishes.
    body = b'{"limit": 10, "startFrom": "%s", "inclusive": false}' % last.encode()
    poll = _request("POST", base + "/poll", body)
    out: dict[str, Any] = {}
    try:
        if not durable:
            healthz = _request("GET", "/healthz")
            out["tidings /healthz"] = await _timed(lambda: conn.exchange(healthz), pid, count)
            out["tidings empty poll"] = await _timed(lambda: _expect_empty(conn, poll), pid, count)
            out["tidings publish, no fsync"] = await _timed(
                lambda: conn.exchange(publish), pid, count
            )
        else:
            out["tidings publish, durable"] = await _timed(
                lambda: conn.exchange(publish), pid, count
            )
            async with AsyncClient(server.url) as client:
                out["client publish, durable"] = await _timed(
                    lambda: client.publish(topic, [b"x" * 100]), pid, count
                )
    finally:
        conn.close()
    return out


async def _expect_empty(conn: _Conn, poll: bytes) -> None:
    head, body = await conn.exchange(poll)
    if not head.startswith(b"HTTP/1.1 200") or body != b"[]":
        raise RuntimeError(f"the caught-up poll was not empty: {head!r} {body[:100]!r}")


async def _helper_case(helper: _Helper, count: int) -> tuple[list[float], float]:
    conn = await _Conn.open(helper.port)
    request = _request("GET", "/healthz")
    try:
        return await _timed(lambda: conn.exchange(request), helper.pid, count)
    finally:
        conn.close()


def _one_round(count: int) -> dict[str, tuple[list[float], float]]:
    results: dict[str, tuple[list[float], float]] = {}
    for kind, name in (("echo", "tcp echo"), ("trivial", "uvicorn, trivial app")):
        helper = _Helper(kind)
        try:
            results[name] = asyncio.run(_helper_case(helper, count))
        finally:
            helper.stop()
    for durable in (False, True):
        os.environ["TIDINGS_SYNC"] = "true" if durable else "false"
        try:
            server = Server([])
        finally:
            os.environ.pop("TIDINGS_SYNC", None)
        try:
            results.update(asyncio.run(_tidings_cases(server, durable, count)))
        finally:
            server.stop()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=2000, help="per case and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--serve", nargs=2, metavar=("KIND", "PORT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        kind, port = args.serve[0], int(args.serve[1])
        (_serve_echo if kind == "echo" else _serve_trivial)(port)
        return

    rounds: list[dict[str, tuple[list[float], float]]] = []
    for i in range(args.rounds):
        result = _one_round(args.requests)
        rounds.append(result)
        print(f"round {i + 1}:")
        for name, (times, cpu) in result.items():
            print(
                f"  {name:28s} p50 {statistics.median(times):.3f} ms"
                f"  p99 {_pct(times, 0.99):.3f} ms  server CPU {cpu:5.0f} us/request"
            )
    print(f"median of {len(rounds)} rounds:")
    for name in rounds[0]:
        p50 = statistics.median(statistics.median(r[name][0]) for r in rounds)
        p99 = statistics.median(_pct(r[name][0], 0.99) for r in rounds)
        cpu = statistics.median(r[name][1] for r in rounds)
        print(f"  {name:28s} p50 {p50:.3f} ms  p99 {p99:.3f} ms  server CPU {cpu:5.0f} us/request")


if __name__ == "__main__":
    main()
