""":class:`AsyncioTransport`, the default transport of :class:`~tidings.AsyncClient`.

HTTP/1.1 with keep-alive on asyncio's own sockets, answers parsed by httptools (the C
parser uvicorn uses, installed with it). A request is one ``write`` of bytes built in
one piece and one parse of the answer; aiohttp, the previous default, spends far more
client CPU around the same exchange (sessions, multidicts, URL objects, timeout and
payload machinery). Measured on this project's 2-core machines, a small POST to a
server that answers at once (uvloop, loopback): aiohttp 230-300 us round trip and
220-280 us of client CPU per request, this transport 110-120 us and 100-110 us. Where
client and server share the cores, that CPU is latency: in the W3 benchmark
(``benchmarks/workloads.py``, a publisher and a consumer in one process) the median
fell by ~0.1 ms with it (BENCHMARKS.md, "Where the time goes", Latency (W3), and the
"HTTP libraries for the client" row of its in-process table).
:class:`~tidings.client.transports.AiohttpTransport` remains available.

Each connection carries one request at a time; ``max_connections`` bounds the requests
in flight (and so the connections). A pooled connection idle for longer than
``max_idle`` is closed rather than used (the server would be about to close it); one
the server closed while it was idle is noticed (its end of stream arrives, or, where
the event loop has not run since, its socket reads as ready) and not used again. One
closed once a request was on its way fails that request with
:class:`TidingsConnectionError`, as with any client: the request is not resent here
(the client's retry policy decides, resending only what is safe to repeat).
"""

from __future__ import annotations

import asyncio
import select
import ssl
import time
from collections.abc import Mapping
from typing import cast

from tidings.client.http1 import (
    MAX_IDLE,
    AnswerParser,
    ConnectionLost,
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

__all__ = ["AsyncioTransport"]


class _Connection(asyncio.Protocol, AnswerParser):
    """One keep-alive connection: at most one request in flight, its answer parsed by
    httptools into a :class:`Response`."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        AnswerParser.__init__(self)
        self._loop = loop
        self._transport: asyncio.Transport | None = None
        self._waiter: asyncio.Future[Response] | None = None
        self._timer: asyncio.TimerHandle | None = None
        #: True once the connection cannot carry another request.
        self.closed = False
        #: When it went back to the pool (monotonic time).
        self.idle_since = 0.0
        self._fd = -1

    # --- asyncio.Protocol ---

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport, though uvloop's are not asyncio.Transport subclasses.
        self._transport = cast(asyncio.Transport, transport)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            self._fd = sock.fileno()

    def stale(self) -> bool:
        """Whether the server closed (or wrote to) this idle connection though the
        event loop has not said so yet (it has not run since): its socket reads as
        ready, where a healthy idle one has nothing to say."""
        if self._fd < 0:
            return False
        try:
            poller = select.poll()  # not select(): it fails on descriptors past 1023
            poller.register(self._fd, select.POLLIN)
            return bool(poller.poll(0))
        except (OSError, ValueError):
            return True

    def data_received(self, data: bytes) -> None:
        try:
            self.feed(data)
        except ConnectionLost as exc:
            self._fail(exc)
            self.close()

    def eof_received(self) -> bool:
        self.ended()
        self.closed = True
        return False  # let the transport close

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._fail(ConnectionLost(f"connection closed: {exc}" if exc else "connection closed"))

    # --- requests ---

    def exchange(self, data: Wire, deadline: float | None) -> asyncio.Future[Response]:
        """Send one whole request; the future resolves with its answer, or fails with
        TimeoutError at ``deadline`` (loop time), which also closes the connection."""
        assert self._transport is not None and self._waiter is None
        waiter = self._waiter = self._loop.create_future()
        if deadline is not None:
            # A plain timer: about a third of what asyncio.timeout() costs per request.
            self._timer = self._loop.call_at(deadline, self._expire)
        if isinstance(data, bytes):
            self._transport.write(data)
        else:
            # uvloop writes the parts with one writev, without joining them.
            self._transport.writelines(data)
        return waiter

    def close(self) -> None:
        self.closed = True
        if self._transport is not None:
            self._transport.close()

    def _expire(self) -> None:
        self._timer = None
        self._fail(TimeoutError())
        self.close()

    def answered(self, response: Response, keep_alive: bool) -> None:
        self._stop_timer()
        waiter, self._waiter = self._waiter, None
        if not keep_alive:
            self.close()
        if waiter is None:
            # An answer nobody asked for: the connection is out of step.
            self.close()
            return
        if not waiter.done():
            waiter.set_result(response)

    def _fail(self, exc: Exception) -> None:
        self._stop_timer()
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)

    def _stop_timer(self) -> None:
        timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()


class AsyncioTransport:
    """:class:`~tidings.client.transports.AsyncTransport` over asyncio connections.

    ``max_connections`` bounds the requests in flight at once, each on a connection of
    its own; finished connections are kept open for the next requests, for at most
    ``max_idle`` seconds idle (None: as long as the server keeps them). Use it from
    one event loop.
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
        self._max_idle = idle_limit(max_idle)
        self._max_connections = max_connections
        self._connect_timeout = connect_timeout
        self._loop: asyncio.AbstractEventLoop | None = None
        self._slots = asyncio.Semaphore(max_connections)
        self._idle: dict[Origin, list[_Connection]] = {}
        self._origins: dict[str, Origin] = {}
        self._tls: ssl.SSLContext | None = None
        self._busy: set[_Connection] = set()

    async def send(self, request: Request) -> Response:
        url = request.url
        base, target = split_url(url)
        origin = self._origins.get(base) or self._origin(base)
        data = request_bytes(request, target, origin)
        loop = asyncio.get_running_loop()
        slots = self._slots_of(loop)
        deadline = None if request.timeout is None else loop.time() + request.timeout
        try:
            if slots.locked():
                # Waiting for a slot counts against the timeout. A free slot is taken
                # without suspending, and without setting up a timeout for it.
                async with asyncio.timeout_at(deadline):
                    await slots.acquire()
            else:
                await slots.acquire()
            try:
                conn = self._idle_connection(origin) or await self._connect(origin, url, deadline)
                cancel = request.cancel
                if cancel is not None and not cancel.attach(conn.close):
                    conn.close()
                    raise ConnectionLost("cancelled before it was sent")
                self._busy.add(conn)
                try:
                    response = await conn.exchange(data, deadline)
                except BaseException:
                    conn.close()  # in an unknown state: an answer may still be coming
                    raise
                finally:
                    self._busy.discard(conn)
                    if cancel is not None:
                        cancel.detach()
                # Back to the pool before the slot is released, so that a request
                # waiting for the slot finds the connection.
                if not conn.closed:
                    conn.idle_since = time.monotonic()
                    self._idle.setdefault(origin, []).append(conn)
            finally:
                slots.release()
        except TimeoutError as exc:
            raise RequestTimeout(f"no answer from {url} in time") from exc
        except ConnectionLost as exc:
            raise TidingsConnectionError(f"cannot reach {url}: {exc}") from None
        return response

    async def aclose(self) -> None:
        """Close every connection; requests still waiting for an answer fail with
        TidingsConnectionError. The transport may be used again (new connections)."""
        for idle in self._idle.values():
            for conn in idle:
                conn.close()
        self._idle.clear()
        for conn in self._busy:
            conn.close()

    def _slots_of(self, loop: asyncio.AbstractEventLoop) -> asyncio.Semaphore:
        """The request slots, after forgetting what belonged to another event loop
        (connections and semaphore are bound to the loop that made them)."""
        if loop is not self._loop:
            self._loop = loop
            self._idle.clear()
            self._busy.clear()
            self._slots = asyncio.Semaphore(self._max_connections)
        return self._slots

    def _origin(self, base: str) -> Origin:
        origin = self._origins[base] = origin_of(base, self._extra)
        return origin

    def _idle_connection(self, origin: Origin) -> _Connection | None:
        """The most recently used idle connection to ``origin`` (the least likely to
        have been closed by the server meanwhile) that is still open, and was not
        idle so long that the server may be closing it right now."""
        idle = self._idle.get(origin)
        while idle:
            conn = idle.pop()
            fresh = time.monotonic() - conn.idle_since <= self._max_idle
            if fresh and not conn.closed and not conn.stale():
                return conn
            conn.close()
        return None

    async def _connect(self, origin: Origin, url: str, deadline: float | None) -> _Connection:
        loop = asyncio.get_running_loop()
        tls: ssl.SSLContext | None = None
        if origin.tls:
            if self._tls is None:
                self._tls = tls_context(self._verify)
            tls = self._tls
        connect_by = loop.time() + self._connect_timeout
        if deadline is not None:
            connect_by = min(connect_by, deadline)
        try:
            async with asyncio.timeout_at(connect_by):
                _, conn = await loop.create_connection(
                    lambda: _Connection(loop),
                    origin.host,
                    origin.port,
                    ssl=tls,
                    server_hostname=origin.host if tls else None,
                )
        except OSError as exc:  # TimeoutError included
            reason = str(exc) or type(exc).__name__
            raise TidingsConnectionError(f"cannot connect to {url}: {reason}") from None
        return conn
