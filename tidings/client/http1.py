"""HTTP/1.1 as both of the clients' own transports speak it: requests written in one
piece (a large body beside its head, in the same vectored write), answers parsed by
httptools (the C parser uvicorn uses, installed with it).

:class:`~tidings.client.asyncio_transport.AsyncioTransport` (AsyncClient) and
:class:`~tidings.client.socket_transport.SocketTransport` (Client) differ only in how
they wait: on the event loop, or on a blocking socket.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

import httptools

from tidings.client.transports import Request, Response
from tidings.errors import TidingsConnectionError

__all__ = [
    "AnswerParser",
    "MAX_IDLE",
    "ConnectionLost",
    "NothingSent",
    "Origin",
    "Wire",
    "extra_headers",
    "idle_limit",
    "origin_of",
    "request_bytes",
]

#: A request's bytes on the wire: head and body in one piece, or, for a large body,
#: the head and the body as they are (sent together with one vectored write).
Wire = bytes | tuple[bytes, bytes]
#: Bodies from this size on are not copied behind their head: joining a 500 KiB
#: publish body to its head cost 0.6-0.8 ms of client CPU per request, most of it
#: faulting in a fresh allocation (BENCHMARKS.md, "Large request bodies sent beside
#: their head, and kept on the server's heap").
LARGE_BODY = 64 * 1024

#: Seconds a pooled connection may sit idle before it is closed rather than used
#: again. The server (uvicorn) closes a connection idle for 5 s; one taken from the
#: pool just as that happens carries a request the server never reads, and a request
#: that is not idempotent cannot be resent on the chance that it did. A margin under
#: the server's limit keeps such connections from being used at all. Behind a proxy
#: with a shorter idle timeout, pass a smaller ``max_idle`` to the transport.
MAX_IDLE = 4.0

_USER_AGENT = "tidings-python"
#: Methods that carry no body when they have none (the others send Content-Length: 0).
_NO_BODY_METHODS = frozenset({"GET", "DELETE"})


@dataclass(frozen=True, slots=True)
class Origin:
    """Where requests of one base URL go, and the header lines common to all of them."""

    host: str
    port: int
    tls: bool
    headers: bytes  # Host, User-Agent and the transport's own, each ending in CRLF


class ConnectionLost(Exception):
    """A connection failed under a request (closed, or an answer that is not HTTP)."""


class NothingSent(ConnectionLost):
    """The connection failed before any byte of the request left: the server cannot
    have seen it, so it may go again on another connection whatever its method."""


def extra_headers(headers: Mapping[str, str] | None) -> bytes:
    """Header lines sent with every request (a bearer token's Authorization header)."""
    return "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items()).encode()


def idle_limit(max_idle: float | None) -> float:
    """A transport's ``max_idle`` in seconds (None: no limit); ValueError if negative."""
    if max_idle is None:
        return float("inf")
    if max_idle < 0:
        raise ValueError("max_idle must not be negative")
    return float(max_idle)


def origin_of(base: str, extra: bytes) -> Origin:
    """The origin of ``scheme://host[:port]``; TidingsConnectionError if not http(s)."""
    parts = urlsplit(base)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise TidingsConnectionError(f"not an http(s) URL: {base!r}")
    try:
        # The socket layer encodes the name so, and failed with a bare UnicodeError.
        parts.hostname.encode("idna")
    except UnicodeError:
        raise TidingsConnectionError(f"no DNS name can be the host of {base!r}") from None
    tls = parts.scheme == "https"
    port = parts.port or (443 if tls else 80)
    # Credentials (user:password@) are no part of the Host header: the server refuses
    # such a header (the clients refuse such URLs before they get here).
    host = parts.netloc.rpartition("@")[2]
    headers = f"Host: {host}\r\nUser-Agent: {_USER_AGENT}\r\n".encode() + extra
    return Origin(parts.hostname, port, tls, headers)


def split_url(url: str) -> tuple[str, str]:
    """``(scheme://host[:port], target)``: the target starts at the first "/" after the
    host (``/`` where there is none)."""
    split = url.find("/", url.find("//") + 2)
    return (url, "/") if split < 0 else (url[:split], url[split:])


def request_bytes(request: Request, target: str, origin: Origin) -> Wire:
    """The whole request: request line, headers and body, in one piece, or as head and
    body where the body is :data:`LARGE_BODY` or more."""
    body = request.body
    head = f"{request.method} {target} HTTP/1.1\r\n"
    if body or request.method not in _NO_BODY_METHODS:
        head += f"Content-Length: {len(body)}\r\n"
    if request.content_type is not None:
        head += f"Content-Type: {request.content_type}\r\n"
    if request.accept is not None:
        head += f"Accept: {request.accept}\r\n"
    for name, value in request.headers:
        head += f"{name}: {value}\r\n"
    if len(body) >= LARGE_BODY:
        return head.encode() + origin.headers + b"\r\n", body
    return head.encode() + origin.headers + b"\r\n" + body


class AnswerParser:
    """httptools' callbacks for one connection's answers: the status, the body, the
    content type and the ``Tidings-*`` headers (names in lower case) of each. A
    transport feeds it with :meth:`feed` and gets every whole answer through
    :meth:`answered`."""

    def __init__(self) -> None:
        self._parser = httptools.HttpResponseParser(self)
        self._body: list[bytes] = []
        self._content_type: str | None = None
        self._headers: dict[str, str] = {}
        # A body with neither Content-Length nor chunked encoding ends with the stream.
        self._framed = False
        self._headers_done = False
        #: The answer's Content-Length, where it has one (and is not chunked).
        self.length: int | None = None

    def feed(self, data: bytes) -> None:
        """Parse more of the stream; ConnectionLost if it is not HTTP."""
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            raise ConnectionLost(f"malformed HTTP answer: {exc}") from None

    def ended(self) -> None:
        """The stream ended: an answer that runs to the end of the stream is whole."""
        if self._headers_done and not self._framed:
            self._finish(keep_alive=False)

    def heading(self) -> bool:
        """Whether the head of an answer (not an interim 1xx) was fed and its body
        was not yet."""
        return self._headers_done and self._parser.get_status_code() >= 200

    def take_body(self, body: bytes) -> None:
        """The body of the answer whose head was fed, read by the transport itself
        (it knew the length): the answer is whole, and the parser starts afresh for
        the next one."""
        keep_alive = self._parser.should_keep_alive()
        status = self._parser.get_status_code()
        self._parser = httptools.HttpResponseParser(self)
        self._headers_done = False
        self.answered(Response(status, body, self._content_type, self._headers), keep_alive)

    def answered(self, response: Response, keep_alive: bool) -> None:
        """A whole answer (an interim 1xx is not passed on)."""
        raise NotImplementedError

    # --- httptools callbacks ---

    def on_message_begin(self) -> None:
        self._body = []
        self._content_type = None
        self._headers = {}
        self._framed = False
        self._headers_done = False
        self.length = None

    def on_header(self, name: bytes, value: bytes) -> None:
        lower = name.lower()
        if lower == b"content-type":
            self._content_type = value.decode("latin-1")
        elif lower.startswith(b"tidings-"):
            self._headers[lower.decode("latin-1")] = value.decode("latin-1")
        elif lower == b"content-length":
            self._framed = True
            if self.length is None and value.isdigit():
                self.length = int(value)
        elif lower == b"transfer-encoding":
            self._framed = True
            self.length = -1  # chunked: the parser takes the body

    def on_headers_complete(self) -> None:
        self._headers_done = True

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        self._finish(keep_alive=self._parser.should_keep_alive())

    def _finish(self, *, keep_alive: bool) -> None:
        self._headers_done = False
        status = self._parser.get_status_code()
        if 100 <= status < 200:
            return  # an interim answer; the real one follows
        body = self._body[0] if len(self._body) == 1 else b"".join(self._body)
        self.answered(Response(status, body, self._content_type, self._headers), keep_alive)
