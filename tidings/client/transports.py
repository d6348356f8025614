"""How the clients move bytes: one request in, one response out, errors mapped.

The clients decide everything in :mod:`tidings.client.base` and hand a finished
:class:`Request` to a transport, which only does I/O. The defaults are the project's
own (:mod:`tidings.client.socket_transport` for :class:`~tidings.Client`,
:mod:`tidings.client.asyncio_transport` for :class:`~tidings.AsyncClient`), chosen by
measurement (``benchmarks/http_clients.py``, figures in docs/client.md): they spend
several times less client CPU per request than urllib3, aiohttp or httpx.
:class:`Urllib3Transport` and :class:`AiohttpTransport` remain for whoever passes
them. A transport never retries; the retry policy lives in the client, where it knows
which requests are idempotent.
"""

from __future__ import annotations

import os
import ssl
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from tidings.errors import RequestTimeout, TidingsConnectionError

if TYPE_CHECKING:
    import aiohttp

__all__ = [
    "AiohttpTransport",
    "AsyncTransport",
    "Cancellation",
    "Exchange",
    "Request",
    "Response",
    "StartingTransport",
    "SyncTransport",
    "Urllib3Transport",
    "tls_context",
]


class Cancellation:
    """Lets one party stop requests another sends (a publisher's close stopping its
    sender): :meth:`cancel` cuts the connection of the request on its way, if any, and
    every request carrying it from then on fails before a byte of it is sent.

    The project's transports honour it (``Request.cancel``); a transport that does
    not just sends the request as usual.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cancelled = False
        self._cut: Callable[[], None] | None = None

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    def cancel(self) -> None:
        """Cut the request on its way (it fails with TidingsConnectionError) and
        refuse the later ones; from any thread, or the event loop's."""
        with self._lock:
            self._cancelled = True
            cut, self._cut = self._cut, None
        if cut is not None:
            cut()

    def attach(self, cut: Callable[[], None]) -> bool:
        """A transport's request took a connection: ``cut`` closes it. False if
        cancelled already: the transport sends nothing."""
        with self._lock:
            if self._cancelled:
                return False
            self._cut = cut
            return True

    def detach(self) -> None:
        """The request ended: its connection is not its to cut any more."""
        with self._lock:
            self._cut = None


@dataclass(frozen=True, slots=True)
class Request:
    """One HTTP request, fully decided: ``url`` is absolute, ``timeout`` in seconds."""

    method: str
    url: str
    body: bytes = b""
    content_type: str | None = None
    timeout: float | None = None
    #: Safe to send again after a retriable failure (GET, poll, property replace).
    idempotent: bool = False
    #: The medium wanted for the answer (``Accept``), where it is not the body's own.
    accept: str | None = None
    #: Further request headers (``Tidings-*``: an idempotent publish's producer).
    headers: tuple[tuple[str, str], ...] = ()
    #: Stops the request from another party (:class:`Cancellation`).
    cancel: Cancellation | None = None


@dataclass(frozen=True, slots=True)
class Response:
    """What came back: the status, the media type of the body and the body.

    ``headers`` holds the ``Tidings-*`` response headers only, names in lower case.
    """

    status: int
    body: bytes = b""
    content_type: str | None = None
    headers: dict[str, str] = field(default_factory=dict)


class SyncTransport(Protocol):
    """Sends requests synchronously; safe to share between threads."""

    def send(self, request: Request) -> Response:
        """Send and read the whole answer.

        Raises :class:`TidingsConnectionError` when the server cannot be reached and
        :class:`RequestTimeout` when it does not answer in time; any HTTP status is a
        :class:`Response`.
        """
        ...

    def close(self) -> None:
        """Close pooled connections."""
        ...


class Exchange(Protocol):
    """A request sent whose answer is read later (see :class:`StartingTransport`)."""

    def result(self) -> Response:
        """Read the answer; raises as :meth:`SyncTransport.send` does."""
        ...

    def cancel(self) -> None:
        """Drop the answer unread."""
        ...


@runtime_checkable
class StartingTransport(SyncTransport, Protocol):
    """A sync transport that can send a request now and read its answer later, on
    the same thread: what a consumer's read-ahead uses instead of a thread when the
    transport offers it (:class:`~tidings.client.socket_transport.SocketTransport`)."""

    def start(self, request: Request) -> Exchange:
        """Send ``request``; raises as :meth:`SyncTransport.send` does if it cannot."""
        ...


class AsyncTransport(Protocol):
    """Sends requests on the running event loop."""

    async def send(self, request: Request) -> Response:
        """Like :meth:`SyncTransport.send`."""
        ...

    async def aclose(self) -> None:
        """Close pooled connections."""
        ...


def _tidings_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The ``Tidings-*`` headers of a response (the poll's page extent), names lower-cased."""
    return {k.lower(): v for k, v in headers.items() if k[:8].lower() == "tidings-"}


def _headers(request: Request, extra: Mapping[str, str]) -> dict[str, str]:
    headers = dict(extra)
    if request.content_type is not None:
        headers["Content-Type"] = request.content_type
    if request.accept is not None:
        headers["Accept"] = request.accept
    headers.update(request.headers)
    return headers


class Urllib3Transport:
    """:class:`SyncTransport` on a urllib3 ``PoolManager`` (thread-safe, keep-alive)."""

    def __init__(
        self,
        *,
        max_connections: int = 10,
        connect_timeout: float = 10.0,
        headers: Mapping[str, str] | None = None,
        verify: bool | str = True,
    ) -> None:
        # Imported here: only this transport uses urllib3, and importing it took about a
        # fifth of ``import tidings`` (~70 ms of every client process's start).
        import urllib3

        tls: dict[str, Any] = {"cert_reqs": "CERT_NONE" if verify is False else "CERT_REQUIRED"}
        if isinstance(verify, str):
            tls["ca_cert_dir" if os.path.isdir(verify) else "ca_certs"] = verify
        self._pool = urllib3.PoolManager(maxsize=max_connections, retries=False, **tls)
        self._connect_timeout = connect_timeout
        #: Sent with every request (a bearer token's Authorization header).
        self._extra = dict(headers or {})

    def send(self, request: Request) -> Response:
        import urllib3

        timeout = urllib3.Timeout(
            connect=min(self._connect_timeout, request.timeout or self._connect_timeout),
            read=request.timeout,
        )
        try:
            resp = self._pool.request(
                request.method,
                request.url,
                body=request.body or None,
                headers=_headers(request, self._extra),
                timeout=timeout,
                retries=False,
                redirect=False,
            )
        except urllib3.exceptions.ConnectTimeoutError as exc:
            raise TidingsConnectionError(f"cannot connect to {request.url}: {exc}") from exc
        except urllib3.exceptions.TimeoutError as exc:
            raise RequestTimeout(f"no answer from {request.url} in time: {exc}") from exc
        except urllib3.exceptions.HTTPError as exc:
            raise TidingsConnectionError(f"cannot reach {request.url}: {exc}") from exc
        headers = resp.headers
        return Response(
            resp.status, resp.data, headers.get("Content-Type"), _tidings_headers(headers)
        )

    def close(self) -> None:
        self._pool.clear()


def tls_context(verify: bool | str) -> ssl.SSLContext:
    """The TLS context of ``verify`` (as httpx takes it): True, the system's CAs; a
    path, that CA file (or directory); False, no verification at all."""
    if verify is False:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        return context
    if verify is True:
        return ssl.create_default_context()
    if os.path.isdir(verify):
        return ssl.create_default_context(capath=verify)
    return ssl.create_default_context(cafile=verify)


def _aiohttp_ssl(verify: bool | str) -> Any:
    if verify is True:
        return True
    if verify is False:
        return False
    return tls_context(verify)


class AiohttpTransport:
    """:class:`AsyncTransport` on an aiohttp ``ClientSession``.

    The session is made on the first request, inside the running loop (aiohttp requires
    it), and belongs to that loop.
    """

    def __init__(
        self,
        *,
        max_connections: int = 10,
        connect_timeout: float = 10.0,
        headers: Mapping[str, str] | None = None,
        verify: bool | str = True,
    ) -> None:
        self._max_connections = max_connections
        self._connect_timeout = connect_timeout
        self._session: aiohttp.ClientSession | None = None
        self._extra = dict(headers or {})
        self._verify = verify

    def _get_session(self) -> aiohttp.ClientSession:
        import aiohttp  # imported when first needed: it costs ~0.1 s to import

        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(
                    limit=self._max_connections, ssl=_aiohttp_ssl(self._verify)
                ),
                cookie_jar=aiohttp.DummyCookieJar(),
                auto_decompress=False,
            )
        return self._session

    async def send(self, request: Request) -> Response:
        import aiohttp

        timeout = aiohttp.ClientTimeout(
            total=request.timeout,
            connect=min(self._connect_timeout, request.timeout or self._connect_timeout),
        )
        try:
            async with self._get_session().request(
                request.method,
                request.url,
                data=request.body or None,
                headers=_headers(request, self._extra),
                # Without a body aiohttp would claim application/octet-stream.
                skip_auto_headers=() if request.content_type else ("Content-Type",),
                timeout=timeout,
                allow_redirects=False,
            ) as resp:
                body = await resp.read()
                headers = resp.headers
                return Response(
                    resp.status, body, headers.get("Content-Type"), _tidings_headers(headers)
                )
        except (aiohttp.ConnectionTimeoutError, aiohttp.ClientConnectorError) as exc:
            raise TidingsConnectionError(f"cannot connect to {request.url}: {exc}") from exc
        except TimeoutError as exc:
            raise RequestTimeout(f"no answer from {request.url} in time") from exc
        except aiohttp.ClientError as exc:
            raise TidingsConnectionError(f"cannot reach {request.url}: {exc}") from exc

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
