"""HTTP/1.1 on a raw socket against a real server: the responses whose head the server
holds back to join it with the body (tidings/server/protocol.py) still arrive when no
body follows, and keep-alive, pipelining and ``Expect: 100-continue`` work."""

from __future__ import annotations

import base64
import socket
from collections.abc import Iterator

import orjson
import pytest

from tests.e2e.serverproc import ServerProcess

pytestmark = pytest.mark.e2e


@pytest.fixture
def conn(server: ServerProcess) -> Iterator[socket.socket]:
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        yield sock


def _read_response(sock: socket.socket, buffer: bytearray, has_body: bool = True) -> bytes:
    """One response (head and Content-Length body) from ``buffer`` + the socket."""
    while b"\r\n\r\n" not in buffer:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed mid-response: {bytes(buffer)!r}"
        buffer += chunk
    end = buffer.index(b"\r\n\r\n") + 4
    head = bytes(buffer[:end]).decode("latin-1")
    length = 0
    for line in head.split("\r\n")[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length" and has_body:
            length = int(value)
    while len(buffer) < end + length:
        chunk = sock.recv(65536)
        assert chunk, "connection closed mid-body"
        buffer += chunk
    response = bytes(buffer[: end + length])
    del buffer[: end + length]
    return response


def _request(
    method: str, path: str, body: bytes = b"", extra: str = "", length: int | None = None
) -> bytes:
    size = len(body) if length is None else length
    head = f"{method} {path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-length: {size}\r\n"
    return (head + extra + "\r\n").encode() + body


def test_head_request_then_keep_alive(conn: socket.socket) -> None:
    buffer = bytearray()
    conn.sendall(_request("HEAD", "/healthz"))
    head = _read_response(conn, buffer, has_body=False)
    assert head.startswith(b"HTTP/1.1 200 ")
    assert head.endswith(b"\r\n\r\n")
    conn.sendall(_request("GET", "/healthz"))
    response = _read_response(conn, buffer)
    assert response.startswith(b"HTTP/1.1 200 ")
    assert response.endswith(b'{"status":"ok"}')


def test_pipelined_requests_are_answered_in_order(conn: socket.socket, topic: str) -> None:
    path = f"/v1/namespaces/default/topics/{topic}"
    conn.sendall(_request("PUT", path) + _request("GET", path) + _request("GET", path + "/x"))
    buffer = bytearray()
    created, got, missing = (_read_response(conn, buffer) for _ in range(3))
    assert created.startswith(b"HTTP/1.1 200 ")
    assert got.startswith(b"HTTP/1.1 200 ") and topic.encode() in got
    assert missing.startswith(b"HTTP/1.1 404 ") and b'"error"' in missing


def test_expect_100_continue(conn: socket.socket, server: ServerProcess, topic: str) -> None:
    path = f"/v1/namespaces/default/topics/{topic}"
    buffer = bytearray()
    conn.sendall(_request("PUT", path))
    assert _read_response(conn, buffer).startswith(b"HTTP/1.1 200 ")
    body = orjson.dumps({"messages": [base64.b64encode(b"waited").decode()]})
    extra = "content-type: application/json\r\nexpect: 100-continue\r\n"
    conn.sendall(_request("POST", path + "/publish", extra=extra, length=len(body)))
    interim = _read_response(conn, buffer, has_body=False)
    assert interim.startswith(b"HTTP/1.1 100 ")
    conn.sendall(body)
    assert _read_response(conn, buffer).startswith(b"HTTP/1.1 200 ")
    poll = orjson.dumps({"limit": 10})
    conn.sendall(_request("POST", path + "/poll", poll, "content-type: application/json\r\n"))
    response = _read_response(conn, buffer)
    payloads = [m["payload"] for m in orjson.loads(response.split(b"\r\n\r\n", 1)[1])]
    assert payloads == [base64.b64encode(b"waited").decode()]
