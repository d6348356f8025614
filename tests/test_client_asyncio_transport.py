"""AsyncioTransport (AsyncClient's default) against a scripted in-process HTTP server."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
import uvloop

from tidings.client.asyncio_transport import AsyncioTransport
from tidings.client.http1 import LARGE_BODY
from tidings.client.transports import Request
from tidings.errors import RequestTimeout, TidingsConnectionError

#: What the server does with one request: bytes to answer with, or None to hang up.
Script = Callable[[bytes], bytes | None]
#: The fixture: starts a server running a script.
Serve = Callable[[Script], Awaitable["Server"]]


def answer(body: bytes = b"ok", *headers: str, status: str = "200 OK") -> bytes:
    lines = [f"HTTP/1.1 {status}", f"Content-Length: {len(body)}", *headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


class Server:
    """Reads whole requests (headers and a Content-Length body) and answers per script."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.requests: list[bytes] = []
        self.connections = 0
        self.open = 0
        self.most_open = 0
        self.delay = 0.0
        #: Close each connection after answering (as an idle timeout would, unannounced).
        self.hang_up_after_answer = False
        self._server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)

    async def stop(self) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.open += 1
        self.most_open = max(self.most_open, self.open)
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except asyncio.IncompleteReadError:
                    return
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                request = head + await reader.readexactly(length)
                self.requests.append(request)
                if self.delay:
                    await asyncio.sleep(self.delay)
                reply = self.script(request)
                if reply is None:
                    return
                writer.write(reply)
                await writer.drain()
                if self.hang_up_after_answer or b"Connection: close" in reply:
                    return
        finally:
            self.open -= 1
            writer.close()


@pytest.fixture
async def serve() -> AsyncIterator[Serve]:
    servers: list[Server] = []

    async def start(script: Script) -> Server:
        server = Server(script)
        await server.start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        await server.stop()


def post(url: str, body: bytes = b"", timeout: float | None = 5.0) -> Request:
    return Request("POST", url + "/v1/x?a=1", body, "avro/binary", timeout)


async def test_one_exchange(serve: Serve) -> None:
    reply = answer(b"page", "Content-Type: avro/binary", "Tidings-Count: 3", "X-Other: y")
    server = await serve(lambda request: reply)
    transport = AsyncioTransport()
    response = await transport.send(post(server.url, b"body"))
    await transport.aclose()
    assert (response.status, response.body, response.content_type) == (200, b"page", "avro/binary")
    assert response.headers == {"tidings-count": "3"}
    head, body = server.requests[0].split(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    assert lines[0] == b"POST /v1/x?a=1 HTTP/1.1" and body == b"body"
    assert {b"Content-Length: 4", b"Content-Type: avro/binary"} <= set(lines)
    assert any(line.startswith(b"Host: 127.0.0.1:") for line in lines)


async def test_a_large_body_goes_whole_beside_its_head(serve: Serve) -> None:
    body = bytes(range(256)) * (48 * 1024)
    server = await serve(lambda request: answer(b"ok"))
    transport = AsyncioTransport()
    sizes = (LARGE_BODY - 1, LARGE_BODY, len(body))
    for size in sizes:
        assert (await transport.send(post(server.url, body[:size]))).body == b"ok"
    await transport.aclose()
    for request, size in zip(server.requests, sizes, strict=True):
        head, sent = request.split(b"\r\n\r\n", 1)
        assert f"Content-Length: {size}".encode() in head.split(b"\r\n")
        assert sent == body[:size]


async def test_get_without_body_sends_no_length(
    serve: Serve,
) -> None:
    server = await serve(lambda request: answer())
    transport = AsyncioTransport()
    await transport.send(Request("GET", server.url, timeout=5))
    await transport.aclose()
    assert server.requests[0].startswith(b"GET / HTTP/1.1\r\n")
    assert b"content-length" not in server.requests[0].lower()


async def test_connections_are_kept_alive(
    serve: Serve,
) -> None:
    server = await serve(lambda request: answer())
    transport = AsyncioTransport()
    for _ in range(5):
        assert (await transport.send(post(server.url))).body == b"ok"
    await transport.aclose()
    assert server.connections == 1


async def test_chunked_interim_and_close_delimited_answers(
    serve: Serve,
) -> None:
    replies = iter(
        [
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
            + b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n",
            b"HTTP/1.1 100 Continue\r\n\r\n" + answer(b"after interim"),
            # No length: the body ends with the connection.
            b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nuntil the end",
            answer(b"fresh"),
        ]
    )
    server = await serve(lambda request: next(replies))
    transport = AsyncioTransport()
    bodies = [(await transport.send(post(server.url))).body for _ in range(4)]
    await transport.aclose()
    assert bodies == [b"abcde", b"after interim", b"until the end", b"fresh"]
    assert server.connections == 2


async def test_hang_up_under_a_request(
    serve: Serve,
) -> None:
    server = await serve(lambda request: None if request.startswith(b"GET") else answer())
    transport = AsyncioTransport()
    await transport.send(post(server.url))
    with pytest.raises(TidingsConnectionError, match="cannot reach"):
        await transport.send(Request("GET", server.url, timeout=5))
    assert (await transport.send(post(server.url))).body == b"ok"
    await transport.aclose()
    assert server.connections == 2


async def test_a_connection_closed_while_idle_is_not_reused(
    serve: Serve,
) -> None:
    server = await serve(lambda request: answer())
    server.hang_up_after_answer = True
    transport = AsyncioTransport()
    await transport.send(post(server.url))
    await asyncio.sleep(0.05)  # the end of stream arrives while the connection is idle
    assert (await transport.send(post(server.url))).body == b"ok"
    await transport.aclose()
    assert server.connections == 2


async def test_refused_connection() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    transport = AsyncioTransport()
    with pytest.raises(TidingsConnectionError, match="cannot connect"):
        await transport.send(post(f"http://127.0.0.1:{port}"))


async def test_malformed_answer(serve: Serve) -> None:
    server = await serve(lambda request: b"SMTP ready\r\n\r\n")
    transport = AsyncioTransport()
    with pytest.raises(TidingsConnectionError, match="malformed"):
        await transport.send(post(server.url))
    await transport.aclose()


async def test_timeout_drops_the_connection(
    serve: Serve,
) -> None:
    server = await serve(lambda request: answer(b"late" if b"slow" in request else b"ok"))
    server.delay = 0.3
    transport = AsyncioTransport()
    with pytest.raises(RequestTimeout):
        await transport.send(post(server.url, b"slow", timeout=0.1))
    server.delay = 0
    # The late answer must not be taken for the next request's.
    assert (await transport.send(post(server.url))).body == b"ok"
    await transport.aclose()
    assert server.connections == 2


async def test_cancelled_request_drops_the_connection(
    serve: Serve,
) -> None:
    server = await serve(lambda request: answer(b"late" if b"slow" in request else b"ok"))
    server.delay = 0.3
    transport = AsyncioTransport()
    task = asyncio.ensure_future(transport.send(post(server.url, b"slow")))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    server.delay = 0
    assert (await transport.send(post(server.url))).body == b"ok"
    await transport.aclose()
    assert server.connections == 2


async def test_close_ends_requests_in_flight_and_allows_new_ones(serve: Serve) -> None:
    server = await serve(lambda request: answer())
    server.delay = 0.3
    transport = AsyncioTransport()
    pending = asyncio.ensure_future(transport.send(post(server.url)))
    await asyncio.sleep(0.05)
    await transport.aclose()
    with pytest.raises(TidingsConnectionError, match="connection closed"):
        await pending
    server.delay = 0
    assert (await transport.send(post(server.url))).body == b"ok"
    await transport.aclose()


async def test_max_connections_bounds_requests_in_flight(
    serve: Serve,
) -> None:
    server = await serve(lambda request: answer())
    server.delay = 0.05
    transport = AsyncioTransport(max_connections=2)
    responses = await asyncio.gather(*(transport.send(post(server.url)) for _ in range(6)))
    await transport.aclose()
    assert [r.body for r in responses] == [b"ok"] * 6
    assert server.most_open == 2 and server.connections == 2


async def test_waiting_for_a_slot_counts_against_the_timeout(
    serve: Serve,
) -> None:
    server = await serve(lambda request: answer())
    server.delay = 0.3
    transport = AsyncioTransport(max_connections=1)
    first = asyncio.ensure_future(transport.send(post(server.url)))
    await asyncio.sleep(0.05)
    with pytest.raises(RequestTimeout):
        await transport.send(post(server.url, timeout=0.1))
    assert (await first).body == b"ok"
    await transport.aclose()


def test_runs_on_uvloop_and_on_a_new_loop_each_time() -> None:
    transport = AsyncioTransport()

    async def once(loop_name: str) -> bytes:
        server = Server(lambda request: answer(loop_name.encode()))
        await server.start()
        try:
            return (await transport.send(post(server.url))).body
        finally:
            await server.stop()

    # uvloop's transports are not asyncio.Transport subclasses; connections of a loop
    # that has ended must not be reused by the next one.
    assert uvloop.run(once("uvloop")) == b"uvloop"
    assert asyncio.run(once("asyncio")) == b"asyncio"
    assert uvloop.run(once("uvloop again")) == b"uvloop again"


def test_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError):
        AsyncioTransport(max_connections=0)
