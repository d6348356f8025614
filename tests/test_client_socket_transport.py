"""SocketTransport (Client's default) against the scripted HTTP server of the asyncio
transport's tests, run on an event loop of its own thread."""

from __future__ import annotations

import asyncio
import gc
import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from tests.test_client_asyncio_transport import Script, Server, answer, post
from tidings.client.http1 import LARGE_BODY
from tidings.client.socket_transport import SocketTransport
from tidings.client.transports import Request
from tidings.errors import RequestTimeout, TidingsConnectionError

Serve = Callable[[Script], Server]


@pytest.fixture
def serve() -> Iterator[Serve]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    servers: list[Server] = []

    def start(script: Script) -> Server:
        server = Server(script)
        asyncio.run_coroutine_threadsafe(server.start(), loop).result(5)
        servers.append(server)
        return server

    yield start
    for server in servers:
        asyncio.run_coroutine_threadsafe(server.stop(), loop).result(5)

    async def finish_handlers() -> None:
        # Connections the transports left open keep their handlers waiting.
        others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in others:
            task.cancel()
        await asyncio.gather(*others, return_exceptions=True)

    asyncio.run_coroutine_threadsafe(finish_handlers(), loop).result(5)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)
    loop.close()


def test_one_exchange(serve: Serve) -> None:
    reply = answer(b"page", "Content-Type: avro/binary", "Tidings-Count: 3", "X-Other: y")
    server = serve(lambda request: reply)
    transport = SocketTransport(headers={"Authorization": "Bearer t"})
    response = transport.send(post(server.url, b"body"))
    transport.close()
    assert (response.status, response.body, response.content_type) == (200, b"page", "avro/binary")
    assert response.headers == {"tidings-count": "3"}
    head, body = server.requests[0].split(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    assert lines[0] == b"POST /v1/x?a=1 HTTP/1.1" and body == b"body"
    assert {b"Content-Length: 4", b"Content-Type: avro/binary", b"Authorization: Bearer t"} <= set(
        lines
    )
    assert any(line.startswith(b"Host: 127.0.0.1:") for line in lines)


def test_a_large_body_goes_whole_beside_its_head(serve: Serve) -> None:
    # Larger than a loopback socket takes at once, so the vectored send goes in parts.
    body = bytes(range(256)) * (48 * 1024)
    server = serve(lambda request: answer(b"ok"))
    transport = SocketTransport()
    for size in (LARGE_BODY - 1, LARGE_BODY, len(body)):
        assert transport.send(post(server.url, body[:size])).body == b"ok"
    transport.close()
    for request, size in zip(server.requests, (LARGE_BODY - 1, LARGE_BODY, len(body)), strict=True):
        head, sent = request.split(b"\r\n\r\n", 1)
        assert f"Content-Length: {size}".encode() in head.split(b"\r\n")
        assert sent == body[:size]


def test_connections_are_kept_alive(serve: Serve) -> None:
    server = serve(lambda request: answer())
    transport = SocketTransport()
    for _ in range(5):
        assert transport.send(post(server.url)).body == b"ok"
    transport.close()
    assert server.connections == 1


def test_chunked_interim_and_close_delimited_answers(serve: Serve) -> None:
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
    server = serve(lambda request: next(replies))
    transport = SocketTransport()
    bodies = [transport.send(post(server.url)).body for _ in range(4)]
    transport.close()
    assert bodies == [b"abcde", b"after interim", b"until the end", b"fresh"]
    assert server.connections == 2


def test_a_large_answer_in_many_reads(serve: Serve) -> None:
    big = bytes(range(256)) * 8192  # 2 MiB
    server = serve(lambda request: answer(big))
    transport = SocketTransport()
    assert transport.send(post(server.url)).body == big
    transport.close()


def test_hang_up_under_a_request(serve: Serve) -> None:
    server = serve(lambda request: None if request.startswith(b"GET") else answer())
    transport = SocketTransport()
    transport.send(post(server.url))
    with pytest.raises(TidingsConnectionError, match="cannot reach"):
        transport.send(Request("GET", server.url, timeout=5))
    assert transport.send(post(server.url)).body == b"ok"
    transport.close()
    assert server.connections == 2


def test_a_connection_closed_while_idle_is_not_reused(serve: Serve) -> None:
    server = serve(lambda request: answer())
    server.hang_up_after_answer = True
    transport = SocketTransport()
    transport.send(post(server.url))
    time.sleep(0.05)  # the end of stream arrives while the connection is idle
    assert transport.send(post(server.url)).body == b"ok"
    transport.close()
    assert server.connections == 2


def test_refused_connection() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(TidingsConnectionError, match="cannot connect"):
        SocketTransport().send(post(f"http://127.0.0.1:{port}"))


def test_malformed_answer(serve: Serve) -> None:
    server = serve(lambda request: b"SMTP ready\r\n\r\n")
    transport = SocketTransport()
    with pytest.raises(TidingsConnectionError, match="malformed"):
        transport.send(post(server.url))
    transport.close()


def test_timeout_drops_the_connection(serve: Serve) -> None:
    server = serve(lambda request: answer(b"late" if b"slow" in request else b"ok"))
    server.delay = 0.3
    transport = SocketTransport()
    started = time.monotonic()
    with pytest.raises(RequestTimeout):
        transport.send(post(server.url, b"slow", timeout=0.1))
    assert time.monotonic() - started < 0.25
    server.delay = 0
    # The late answer must not be taken for the next request's.
    assert transport.send(post(server.url)).body == b"ok"
    transport.close()
    assert server.connections == 2


def test_close_ends_requests_in_flight_and_allows_new_ones(serve: Serve) -> None:
    server = serve(lambda request: answer())
    server.delay = 0.3
    transport = SocketTransport()
    failed: list[BaseException] = []

    def pending() -> None:
        try:
            transport.send(post(server.url))
        except TidingsConnectionError as exc:
            failed.append(exc)

    thread = threading.Thread(target=pending)
    thread.start()
    time.sleep(0.05)
    transport.close()
    thread.join(5)
    assert len(failed) == 1
    server.delay = 0
    assert transport.send(post(server.url)).body == b"ok"
    transport.close()


def test_threads_share_it_within_max_connections(serve: Serve) -> None:
    server = serve(lambda request: answer(request.split(b"\r\n\r\n", 1)[1]))
    server.delay = 0.05
    transport = SocketTransport(max_connections=2)
    bodies: list[bytes] = []
    lock = threading.Lock()

    def send(i: int) -> None:
        body = transport.send(post(server.url, f"req-{i}".encode())).body
        with lock:
            bodies.append(body)

    threads = [threading.Thread(target=send, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    transport.close()
    assert sorted(bodies) == sorted(f"req-{i}".encode() for i in range(6))
    assert server.most_open == 2 and server.connections == 2


def test_waiting_for_a_slot_counts_against_the_timeout(serve: Serve) -> None:
    server = serve(lambda request: answer())
    server.delay = 0.3
    transport = SocketTransport(max_connections=1)
    first: list[bytes] = []
    thread = threading.Thread(target=lambda: first.append(transport.send(post(server.url)).body))
    thread.start()
    time.sleep(0.05)
    with pytest.raises(RequestTimeout):
        transport.send(post(server.url, timeout=0.1))
    thread.join(5)
    assert first == [b"ok"]
    transport.close()


def test_a_transport_dropped_unclosed_closes_its_sockets_quietly(serve: Serve) -> None:
    # Warnings are errors in this suite: an unclosed socket's ResourceWarning would fail
    # the test, as it would fail a user's suite that drops a Client without close().
    server = serve(lambda request: answer())
    transport = SocketTransport()
    transport.send(post(server.url))
    cycle: list[object] = [transport]
    cycle.append(cycle)  # held by a reference cycle, as a client often is
    del transport, cycle
    gc.collect()
    deadline = time.monotonic() + 5
    while server.open and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server.open == 0


def test_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError):
        SocketTransport(max_connections=0)


def test_a_head_split_between_its_last_two_line_ends() -> None:
    # The body holds a blank line too: found in the buffer after the first part of
    # the head went to the parser, it must not be taken for the head's end.
    body = b"a\r\n\r\nb"
    parts = [f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\n".encode(), b"\r\n" + body]
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port = listener.getsockname()[1]

        def serve_once() -> None:
            conn, _ = listener.accept()
            with conn:
                conn.recv(65536)
                for part in parts:
                    conn.sendall(part)
                    time.sleep(0.05)
                conn.recv(65536)  # until the client closes

        thread = threading.Thread(target=serve_once)
        thread.start()
        transport = SocketTransport()
        response = transport.send(post(f"http://127.0.0.1:{port}", timeout=2.0))
        transport.close()
        thread.join(5)
    assert (response.status, response.body) == (200, body)


def test_a_started_exchange_is_read_later_on_the_same_connection(serve: Serve) -> None:
    server = serve(lambda request: answer(request.split(b"\r\n\r\n", 1)[1]))
    transport = SocketTransport(max_connections=2)
    exchange = transport.start(post(server.url, b"first"))
    # The request is out before its answer is asked for: the server has it.
    deadline = time.monotonic() + 5
    while not server.requests and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server.requests and server.requests[0].endswith(b"first")
    # Meanwhile another request takes the other connection.
    assert transport.send(post(server.url, b"second")).body == b"second"
    assert exchange.result().body == b"first"
    # Both connections are back in the pool and carry the next requests.
    assert transport.send(post(server.url, b"third")).body == b"third"
    assert transport.start(post(server.url, b"fourth")).result().body == b"fourth"
    transport.close()
    assert server.connections == 2


def test_a_started_exchange_holds_a_slot_until_read_cancelled_or_dropped(serve: Serve) -> None:
    server = serve(lambda request: answer())
    transport = SocketTransport(max_connections=2)
    exchange = transport.start(post(server.url))
    # Its slot is held: no other exchange starts (that would take the last one) ...
    with pytest.raises(RequestTimeout, match="one connection left"):
        transport.start(post(server.url))
    exchange.cancel()
    # Cancelled: the slot is free; its connection, out of step, is not reused.
    assert transport.send(post(server.url)).body == b"ok"
    assert server.connections == 2
    with pytest.raises(TidingsConnectionError, match="cancelled"):
        exchange.result()
    exchange = transport.start(post(server.url))
    del exchange  # dropped unread, as by a consumer abandoned mid-page
    gc.collect()
    held = transport.start(post(server.url))  # the dropped one's slot came back
    assert transport.send(post(server.url, timeout=1)).body == b"ok"
    assert held.result().body == b"ok"
    with pytest.raises(TidingsConnectionError, match="cancelled"):
        held.result()  # read once only
    held.cancel()  # nothing left to cancel
    assert transport.send(post(server.url, timeout=1)).body == b"ok"
    transport.close()


def test_an_exchange_never_waits_for_nor_takes_the_last_connection(serve: Serve) -> None:
    # Answers read later hold their connections: were they allowed every one, a
    # thread taking several consumers in turn, each in the middle of a page, could
    # send nothing more (its next poll waits for a connection only it can free).
    server = serve(lambda request: answer())
    transport = SocketTransport(max_connections=3)
    held = [transport.start(post(server.url)), transport.start(post(server.url))]
    with pytest.raises(RequestTimeout, match="one connection left"):
        transport.start(post(server.url))
    began = time.monotonic()
    assert transport.send(post(server.url, timeout=5)).body == b"ok"  # the last one
    assert time.monotonic() - began < 1
    single = SocketTransport(max_connections=1)
    with pytest.raises(RequestTimeout, match="one connection left"):
        single.start(post(server.url))  # nothing is ever sent ahead on one connection
    assert single.send(post(server.url)).body == b"ok"
    single.close()
    for exchange in held:
        assert exchange.result().body == b"ok"
    transport.close()


def test_a_started_exchange_fails_as_send_does(serve: Serve) -> None:
    server = serve(lambda request: None if b"hang" in request else answer())
    transport = SocketTransport(max_connections=2)
    exchange = transport.start(post(server.url, b"hang"))
    with pytest.raises(TidingsConnectionError, match="cannot reach"):
        exchange.result()
    server.delay = 0.3
    exchange = transport.start(post(server.url, timeout=0.2))
    time.sleep(0.25)  # the timeout counts from the read, not from the send
    assert exchange.result().body == b"ok"
    exchange = transport.start(post(server.url, timeout=0.1))
    with pytest.raises(RequestTimeout):
        exchange.result()
    server.delay = 0
    assert transport.send(post(server.url)).body == b"ok"  # every slot came back
    transport.close()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(TidingsConnectionError, match="cannot connect"):
        SocketTransport(max_connections=2).start(post(f"http://127.0.0.1:{port}"))
