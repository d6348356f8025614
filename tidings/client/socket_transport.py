""":class:`SocketTransport`, the default transport of :class:`~tidings.Client`.

HTTP/1.1 with keep-alive on blocking sockets, spoken as
:class:`~tidings.client.asyncio_transport.AsyncioTransport` speaks it for AsyncClient
(:mod:`tidings.client.http1`): a request is one ``sendall`` of bytes built in one
piece (a large body goes beside its head in one ``sendmsg``), its answer one parse by
httptools. urllib3, the previous default, builds a
URL, header and response object per request and parses the answer's headers with the
standard library's email parser: measured on this project's 2-core machines against a
server that answers at once, it spent several times more client CPU per request
(figures in BENCHMARKS.md, "The sync client's own transport"). Where client and
server share the cores, that CPU is latency.
:class:`~tidings.client.transports.Urllib3Transport` remains available.

Thread-safe: each request takes an idle connection of the pool (or opens one), at
most ``max_connections`` at once. A pooled connection idle for longer than
``max_idle`` is closed rather than used (the server would be about to close it), and
one the server closed while it was idle is noticed before use (it reads as ready) and
dropped. Where the first write of a request on a pooled connection fails, no byte of
it left, so it goes again on a new connection, whatever its method. One closed once
the request was on its way fails that request with :class:`TidingsConnectionError`,
as with any client: the request is not resent here (the client's retry policy
decides, resending only what is safe to repeat).
"""

from __future__ import annotations

import contextlib
import io
import select
import socket
import ssl
import threading
import time
import weakref
from collections.abc import Mapping
from typing import cast

from tidings.client.http1 import (
    MAX_IDLE,
    AnswerParser,
    ConnectionLost,
    NothingSent,
    Origin,
    Wire,
    extra_headers,
    idle_limit,
    origin_of,
    request_bytes,
    split_url,
)
from tidings.client.transports import Request, Response, tls_context
from tidings.errors import RequestTimeout, TidingsConnectionError

__all__ = ["Exchange", "SocketTransport"]

_READ_SIZE = 256 * 1024


class _Connection(AnswerParser):
    """One keep-alive connection; one request at a time."""

    def __init__(self, sock: socket.socket) -> None:
        super().__init__()
        self.sock = sock
        # Reads through a buffer: a head found in it is taken exactly, and a body of
        # known length is then read into one allocation, as http.client does (fed
        # to the parser in pieces and joined, a 10 MB answer cost ~40 % more CPU).
        self._reader = cast(io.BufferedReader, sock.makefile("rb", buffering=_READ_SIZE))
        self._answer: Response | None = None
        self._keep_alive = True
        #: True once the connection cannot carry another request.
        self.closed = False
        #: Taken from the pool (it carried a request before this one).
        self.reused = False
        #: When it went back to the pool (monotonic time).
        self.idle_since = 0.0

    def exchange(self, data: Wire, deadline: float | None) -> Response:
        """Send one whole request and read its answer; TimeoutError past ``deadline``
        (monotonic time), ConnectionLost if the connection fails. Either leaves the
        connection closed."""
        self.write(data, deadline)
        return self.answer(deadline)

    def write(self, data: Wire, deadline: float | None) -> None:
        """Send one whole request (its answer is read by :meth:`answer`); fails as
        :meth:`exchange` does."""
        self._answer = None
        try:
            self.sock.settimeout(None if deadline is None else _left(deadline))
            _send(self.sock, data)
        except BaseException as exc:
            self.close()  # half a request sent: the connection is out of step
            if isinstance(exc, OSError) and not isinstance(exc, TimeoutError):
                raise ConnectionLost(str(exc) or type(exc).__name__) from None
            raise

    def answer(self, deadline: float | None) -> Response:
        """Read the answer to the request :meth:`write` sent; fails as :meth:`exchange`
        does."""
        sock, reader = self.sock, self._reader
        # Once part of an answer went to the parser piecemeal (a head split across
        # reads), the rest goes the same way: a head end found later in the buffer
        # could be bytes of the body.
        piecemeal = False
        try:
            if deadline is None:
                sock.settimeout(None)
            while self._answer is None:
                if deadline is not None:
                    sock.settimeout(_left(deadline))
                buffered = reader.peek(_READ_SIZE)
                end = buffered.find(b"\r\n\r\n")
                if piecemeal or end < 0 or self.heading():
                    # Inside a head, a chunked or a close-delimited body: as it comes.
                    piecemeal = True
                    chunk = reader.read1(_READ_SIZE)
                    if not chunk:
                        self.ended()  # an answer that runs to the end of the stream
                        self.closed = True
                        if self._answer is None:
                            raise ConnectionLost("connection closed")
                        break
                    self.feed(chunk)
                    continue
                self.feed(reader.read(end + 4))  # a whole head, and nothing after it
                length = self.length
                if self._answer is None and self.heading() and length is not None and length >= 0:
                    body = reader.read(length)
                    if len(body) < length:
                        raise ConnectionLost("connection closed in the middle of an answer")
                    self.take_body(body)
        except (TimeoutError, ConnectionLost):
            self.close()
            raise
        except OSError as exc:
            self.close()
            raise ConnectionLost(str(exc) or type(exc).__name__) from None
        except ValueError:
            # The reader was closed under this request (the transport's close()).
            self.close()
            raise ConnectionLost("connection closed") from None
        except BaseException:
            self.close()  # interrupted mid-answer: the connection is out of step
            raise
        if not self._keep_alive:
            self.close()
        return self._answer

    def answered(self, response: Response, keep_alive: bool) -> None:
        self._answer = response
        self._keep_alive = keep_alive

    def stale(self) -> bool:
        """Whether the server closed (or wrote to) this idle connection: it reads as
        ready, where a healthy idle one has nothing to say."""
        try:
            poller = select.poll()  # not select(): it fails on descriptors past 1023
            poller.register(self.sock, select.POLLIN)
            return bool(poller.poll(0))
        except (OSError, ValueError):
            return True

    def close(self) -> None:
        self.closed = True
        with contextlib.suppress(OSError):
            # Wakes a read blocked in another thread (close() alone would not: the
            # descriptor stays open while the reader holds it).
            self.sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self._reader.close()
        with contextlib.suppress(OSError):
            self.sock.close()


def _close_all(idle: dict[Origin, list[_Connection]], busy: set[_Connection]) -> None:
    conns = [c for pooled in idle.values() for c in pooled] + list(busy)
    idle.clear()
    for conn in conns:
        conn.close()


def _send(sock: socket.socket, data: Wire) -> None:
    """Send a whole request; a head and body in two parts without joining them, in
    vectored writes where the socket has them (TLS sockets cannot ``sendmsg``).
    :class:`NothingSent` where the first write fails: then no byte of it left (what
    ``sendall`` could not tell)."""
    views = [memoryview(data)] if isinstance(data, bytes) else [memoryview(p) for p in data]
    vectored = len(views) > 1 and not isinstance(sock, ssl.SSLSocket)
    first = True
    while views:
        try:
            sent = sock.sendmsg(views) if vectored else sock.send(views[0])
        except OSError as exc:
            if first and not isinstance(exc, TimeoutError):
                raise NothingSent(str(exc) or type(exc).__name__) from None
            raise
        first = False
        while views and sent >= len(views[0]):
            sent -= len(views.pop(0))
        if sent:
            views[0] = views[0][sent:]


def _left(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError
    return left


class Exchange:
    """A request :meth:`SocketTransport.start` sent, its answer not read yet. It holds
    a connection (and one of ``max_connections``) until :meth:`result` or
    :meth:`cancel`, or until it is dropped."""

    def __init__(
        self,
        transport: SocketTransport,
        origin: Origin,
        conn: _Connection,
        url: str,
        timeout: float | None,
    ) -> None:
        self._url = url
        self._timeout = timeout
        self._conn = conn
        self._origin = origin
        self._transport = transport
        # Dropped unread (a consumer abandoned mid-page): the connection is out of
        # step, so it is closed, and its slot given back.
        self._release = weakref.finalize(self, _abandon, transport._slots, transport._busy, conn)

    def result(self) -> Response:
        """Read the answer (once); fails as :meth:`SocketTransport.send` does."""
        if not self._release.detach():
            raise TidingsConnectionError(f"cannot reach {self._url}: the exchange was cancelled")
        conn, transport = self._conn, self._transport
        timeout = self._timeout
        try:
            try:
                return conn.answer(None if timeout is None else time.monotonic() + timeout)
            finally:
                transport._done(self._origin, conn)
        except TimeoutError as exc:
            raise RequestTimeout(f"no answer from {self._url} in time") from exc
        except ConnectionLost as exc:
            raise TidingsConnectionError(f"cannot reach {self._url}: {exc}") from None
        finally:
            transport._slots.release()

    def cancel(self) -> None:
        """Drop the answer: the connection is closed (it is out of step)."""
        if self._release.detach():
            _abandon(self._transport._slots, self._transport._busy, self._conn)


def _abandon(slots: threading.BoundedSemaphore, busy: set[_Connection], conn: _Connection) -> None:
    # Without the transport's lock: a finalizer may run inside any code of the thread
    # that drops the last reference, that code holding the lock included (one set
    # operation needs no lock of its own).
    busy.discard(conn)
    conn.close()
    slots.release()


class SocketTransport:
    """:class:`~tidings.client.transports.SyncTransport` over blocking sockets.

    ``max_connections`` bounds the requests in flight at once (from several threads),
    each on a connection of its own; finished connections are kept open for the next
    requests, for at most ``max_idle`` seconds idle (None: as long as the server keeps
    them).
    """

    def __init__(
        self,
        *,
        max_connections: int = 10,
        connect_timeout: float = 10.0,
        headers: Mapping[str, str] | None = None,
        verify: bool | str = True,
        max_idle: float | None = MAX_IDLE,
    ) -> None:
        if max_connections < 1:
            raise ValueError("max_connections must be at least 1")
        #: Sent with every request (a bearer token's Authorization header).
        self._extra = extra_headers(headers)
        self._verify = verify
        self._connect_timeout = connect_timeout
        self._max_idle = idle_limit(max_idle)
        self._slots = threading.BoundedSemaphore(max_connections)
        self._lock = threading.Lock()
        self._idle: dict[Origin, list[_Connection]] = {}
        self._busy: set[_Connection] = set()
        self._origins: dict[str, Origin] = {}
        self._tls: ssl.SSLContext | None = None
        # A client dropped without close(): its sockets are closed quietly when the
        # transport goes, as urllib3 closes its pools' (a ResourceWarning per socket
        # would fail test suites that run with -W error). A finalizer, not __del__:
        # it runs before the sockets' own finalizers even where a reference cycle
        # holds the client.
        weakref.finalize(self, _close_all, self._idle, self._busy)

    def send(self, request: Request) -> Response:
        origin, conn, data, deadline = self._checkout(request)
        cancel = request.cancel
        # Exchange.result() reads an answer with the same hand-back and errors, written
        # out in both: as a shared context manager it cost ~2 us more per request.
        try:
            try:
                if cancel is not None and not cancel.attach(conn.close):
                    raise ConnectionLost("cancelled before it was sent")
                try:
                    response = conn.exchange(data, deadline)
                except NothingSent:
                    if not conn.reused or (cancel is not None and cancel.cancelled):
                        raise
                    conn = self._again(origin, conn, request.url, deadline)
                    if cancel is not None and not cancel.attach(conn.close):
                        raise ConnectionLost("cancelled before it was sent") from None
                    response = conn.exchange(data, deadline)
            finally:
                if cancel is not None:
                    cancel.detach()
                self._done(origin, conn)
        except TimeoutError as exc:
            raise RequestTimeout(f"no answer from {request.url} in time") from exc
        except ConnectionLost as exc:
            raise TidingsConnectionError(f"cannot reach {request.url}: {exc}") from None
        finally:
            self._slots.release()
        return response

    def start(self, request: Request) -> Exchange:
        """Send ``request`` now; its answer is read when :meth:`Exchange.result` is
        called, on the caller's thread. A consumer sends its next poll this way before
        decoding a page: with a thread reading the answer instead, the request waited
        for the decoding thread to let go of the GIL (up to the 5 ms switch interval)
        before it left. Fails as :meth:`send` does; the answer's timeout counts from
        the call to ``result()``.

        It never waits for a connection, nor takes the last free one: then it fails at
        once with :class:`RequestTimeout` (a consumer then polls when it needs the
        page, as without reading ahead). An answer read only later holds its
        connection meanwhile; were every connection so held -- more consumers in
        the middle of a page than ``max_connections``, taken in turn by one thread --
        no other request could be sent until one of them is read, and none would be."""
        origin, conn, data, deadline = self._checkout(request, ahead=True)
        try:
            try:
                try:
                    conn.write(data, deadline)
                except NothingSent:
                    if not conn.reused:
                        raise
                    conn = self._again(origin, conn, request.url, deadline)
                    conn.write(data, deadline)
            except BaseException:
                self._done(origin, conn)
                raise
        except TimeoutError as exc:
            self._slots.release()
            raise RequestTimeout(f"no answer from {request.url} in time") from exc
        except ConnectionLost as exc:
            self._slots.release()
            raise TidingsConnectionError(f"cannot reach {request.url}: {exc}") from None
        except BaseException:
            self._slots.release()
            raise
        return Exchange(self, origin, conn, request.url, request.timeout)

    def _checkout(
        self, request: Request, ahead: bool = False
    ) -> tuple[Origin, _Connection, Wire, float | None]:
        """A slot of ``max_connections`` and a connection for ``request`` (marked busy),
        its bytes and its deadline; the caller gives the slot back. ``ahead`` (a
        request whose answer is read later): a slot now, and not the last one free,
        or RequestTimeout at once."""
        url = request.url
        base, target = split_url(url)
        origin = self._origins.get(base) or self._origin(base)
        data = request_bytes(request, target, origin)
        deadline = None if request.timeout is None else time.monotonic() + request.timeout
        if ahead:
            if not self._slots.acquire(blocking=False):
                raise RequestTimeout(f"not sent ahead to {url}: all connections busy")
            spare = self._slots.acquire(blocking=False)  # one more left for the others?
            if not spare:
                self._slots.release()
                raise RequestTimeout(f"not sent ahead to {url}: one connection left")
            self._slots.release()
        # Waiting for a slot counts against the timeout.
        elif not self._slots.acquire(timeout=-1 if request.timeout is None else request.timeout):
            raise RequestTimeout(f"no answer from {url} in time (all connections busy)")
        try:
            conn = self._idle_connection(origin) or self._connect(origin, url, deadline)
        except BaseException:
            self._slots.release()
            raise
        with self._lock:
            self._busy.add(conn)
        return origin, conn, data, deadline

    def _done(self, origin: Origin, conn: _Connection) -> None:
        """``conn`` finished a request: back to the pool if it can carry another."""
        with self._lock:
            self._busy.discard(conn)
            if not conn.closed:
                conn.idle_since = time.monotonic()
                self._idle.setdefault(origin, []).append(conn)

    def _again(
        self, origin: Origin, conn: _Connection, url: str, deadline: float | None
    ) -> _Connection:
        """A new connection (marked busy) for a request no byte of which left on the
        pooled ``conn``: the server closed it as it was taken, and never saw the
        request, so sending it again repeats nothing."""
        self._done(origin, conn)
        fresh = self._connect(origin, url, deadline)
        with self._lock:
            self._busy.add(fresh)
        return fresh

    def close(self) -> None:
        """Close every connection; requests still waiting for an answer fail with
        TidingsConnectionError. The transport may be used again (new connections)."""
        with self._lock:
            conns = [c for pooled in self._idle.values() for c in pooled] + list(self._busy)
            self._idle.clear()
        for conn in conns:  # outside the lock: a request it wakes takes the lock to end
            conn.close()

    def _origin(self, base: str) -> Origin:
        origin = origin_of(base, self._extra)
        with self._lock:
            self._origins[base] = origin
        return origin

    def _idle_connection(self, origin: Origin) -> _Connection | None:
        """The most recently used idle connection to ``origin`` (the least likely to
        have been closed by the server meanwhile) that is still open, and was not
        idle so long that the server may be closing it right now."""
        while True:
            with self._lock:
                idle = self._idle.get(origin)
                if not idle:
                    return None
                conn = idle.pop()
            fresh = time.monotonic() - conn.idle_since <= self._max_idle
            if fresh and not conn.closed and not conn.stale():
                conn.reused = True
                return conn
            conn.close()

    def _connect(self, origin: Origin, url: str, deadline: float | None) -> _Connection:
        timeout = self._connect_timeout
        if deadline is not None:
            timeout = min(timeout, max(0.0, deadline - time.monotonic()))
        try:
            sock = socket.create_connection((origin.host, origin.port), timeout=timeout)
        except OSError as exc:  # TimeoutError included
            reason = str(exc) or type(exc).__name__
            raise TidingsConnectionError(f"cannot connect to {url}: {reason}") from None
        try:
            # A request is one write and its answer is awaited: no Nagle delay.
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if origin.tls:
                if self._tls is None:
                    self._tls = tls_context(self._verify)
                sock = self._tls.wrap_socket(sock, server_hostname=origin.host)
        except OSError as exc:  # ssl.SSLError included
            sock.close()
            raise TidingsConnectionError(f"cannot connect to {url}: {exc}") from None
        return _Connection(sock)
