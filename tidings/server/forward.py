"""What an instance standing by serves: every request forwarded to the leader.

Several instances on one PostgreSQL store share one leader, which owns every topic, the
transaction log, groups and queues (:mod:`tidings.cluster.lease`). The others listen
all the same, so a load balancer may send any request to any of them: they pass it on
to the leader's advertised URL as it came (method, path, query, body, and the
``Authorization`` header, which the leader checks), and pass its answer back. Only
``/healthz``, ``/readyz`` and ``/metrics`` are answered here, about this instance,
``/metrics`` under the leader's rule: with an auth file and ``metrics_auth``, only to a
principal's token.
A browser's cross-site write, and a request for a ``Host`` this instance does not
answer (``allowed_hosts``), are refused here, as the leader would refuse them
(:mod:`tidings.server.origin`), before anything is forwarded. The hop to the leader
carries the leader's advertised host, which the leader always answers.

Where no leader is known or it cannot be reached (a takeover under way, or this
instance has not reached PostgreSQL for a whole lease), the answer is a retriable 503
``ServiceUnavailable`` with ``Retry-After: 1``, at once (the leader comes from the
lease's last poll, not from a query on the way): the clients retry, and by then this
instance or another leads. Where the leader got the request but its answer was lost
(a read timeout, the leader died while answering), the outcome is unknown and the
answer is 502 ``OutcomeUnknown``, as a lost connection would be to a client talking to
the leader itself: a 503 would say the request was not carried out, and a client
would then send a transaction that committed again, or roll it back; a plain
``ServerError`` (a bug's) would not say that it may have been carried out.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable

import httpx
import orjson
from starlette.types import Message, Receive, Scope, Send

from tidings.errors import (
    OutcomeUnknown,
    PayloadTooLarge,
    ServiceUnavailable,
    TidingsError,
    Unauthorized,
)
from tidings.server.auth import Authenticator
from tidings.server.origin import HostAllowlist, allowed_set, check_request

__all__ = ["Forwarder"]

log = logging.getLogger("tidings.server")

#: Headers that describe one connection, not the request (RFC 9110, 7.6.1), plus the
#: ones httpx sets again for the hop to the leader.
_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
        b"host",
        b"content-length",
    }
)
#: What is not passed on to the leader: the hop's headers, and ``Origin``, which this
#: instance has checked already (:meth:`Forwarder._check_origin` says why).
_NOT_PASSED = _HOP | {b"origin"}
#: The leader's answer headers not passed back: the hop's own, and ``Date``, which this
#: instance's HTTP server sets on every answer (a second one is a malformed answer).
_NOT_PASSED_BACK = _HOP | {b"date"}
#: Failures of the hop to the leader before the request left: it cannot have taken
#: effect, so the answer is a retriable 503. Any other failure may come after the leader
#: received the request (a read timeout, a connection closed while it answered).
_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)
#: The status of an answer lost on the hop (Bad Gateway), as an ``OutcomeUnknown``:
#: the outcome is unknown, as after a lost connection.
_ANSWER_LOST = 502
#: How long a looked-up leader URL is trusted before the lease is asked again.
_LEADER_TTL = 1.0


class Forwarder:
    """ASGI app forwarding to ``leader()`` (the leader's URL, or None when none is known).

    ``max_body`` bounds a forwarded body as the server's own limit would (413).
    ``timeout`` bounds the wait for the leader's answer; it must exceed the longest
    long-poll the leader allows. ``allowed_origins`` is the ``allowed_origins``
    setting: the origins whose pages may send writes besides this instance's own.
    ``auth`` (the auth file's principals, reloaded on SIGHUP as the leader's are) and
    ``metrics_auth`` decide who may read this instance's ``/metrics``, as they do at
    the leader. ``hosts`` is the ``Host`` check the leader makes of its own requests
    (None: any ``Host``), made here of the requests this instance is sent.
    """

    def __init__(
        self,
        leader: Callable[[], str | None],
        *,
        me: str,
        max_body: int,
        timeout: float,
        verify: bool | str = True,
        allowed_origins: Iterable[str] = (),
        auth: Authenticator | None = None,
        metrics_auth: bool = False,
        hosts: HostAllowlist | None = None,
    ) -> None:
        self._leader = leader
        self._hosts = hosts
        # Only with both: without an auth file there are no tokens to ask for.
        self._metrics_auth = auth if metrics_auth else None
        self._allowed = allowed_set(allowed_origins)
        self._me = me
        self._max_body = max_body
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(timeout, connect=2.0),
            verify=verify,
            limits=httpx.Limits(max_connections=200, max_keepalive_connections=50),
        )
        self._cached: tuple[float, str | None] = (0.0, None)

    async def aclose(self) -> None:
        """Close the connections to the leader."""
        await self._client.aclose()

    async def leader_url(self, *, fresh: bool = False) -> str | None:
        """The leader's URL as the lease row names it (cached for a second)."""
        at, url = self._cached
        if fresh or url is None or time.monotonic() - at > _LEADER_TTL:
            try:
                # A database query: off the loop, which keeps serving meanwhile.
                url = await asyncio.to_thread(self._leader)
            except Exception as exc:
                log.warning(f"cannot look up the leader: {exc}")
                url = None
            self._cached = (time.monotonic(), url)
        return url

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        path: str = scope["path"]
        if path in ("/healthz", "/readyz"):
            leader = await self.leader_url()
            body = {"status": "ok" if path == "/healthz" else "forwarding", "leader": leader}
            await _answer(send, 200 if path == "/healthz" or leader else 503, orjson.dumps(body))
            return
        try:
            if path == "/metrics":
                check_request("GET", scope["headers"], self._allowed, self._hosts)
                if self._metrics_auth is not None:
                    self._metrics_auth.authenticate(_header(scope, b"authorization"))
                text = b"# TYPE tidings_instance_leader gauge\ntidings_instance_leader 0\n"
                await _answer(send, 200, text, b"text/plain; version=0.0.4; charset=utf-8")
                return
            self._check_origin(scope)
            body_bytes = await self._body(receive)
            await self._forward(scope, body_bytes, send)
        except TidingsError as exc:
            headers = [(b"retry-after", b"1")] if exc.status == 503 else []
            if isinstance(exc, Unauthorized):
                headers.append((b"www-authenticate", b'Bearer realm="tidings"'))
            await _answer(send, exc.status, orjson.dumps(exc.to_json()), extra=headers)

    def _check_origin(self, scope: Scope) -> None:
        """Refuse a request for a ``Host`` this instance does not answer, and a
        browser's write from another origin, as the leader would.

        The check compares ``Origin`` with the ``Host`` the browser addressed, and only
        this instance sees that one: the hop to the leader carries the leader's own
        ``Host`` (httpx sets it), so the leader, given the ``Origin``, would refuse
        every browser write sent through a standby, the console's own included. So the
        decision is made here, with the same rule and this instance's
        ``allowed_origins``, and ``Origin`` is not passed on: what reaches the leader is
        a request already judged, which it serves like any client's that carries no
        ``Origin``. Passing the ``Host`` on instead (as ``X-Forwarded-Host``) would make
        the leader trust a header that any client sending to it directly may set.
        """
        check_request(scope["method"], scope["headers"], self._allowed, self._hosts)

    async def _body(self, receive: Receive) -> bytes:
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                break
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self._max_body:
                raise PayloadTooLarge(f"request body larger than {self._max_body} bytes")
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        return b"".join(chunks)

    async def _forward(self, scope: Scope, body: bytes, send: Send) -> None:
        leader = await self.leader_url()
        if leader is None or leader == self._me:
            leader = await self.leader_url(fresh=True)
        if leader is None or leader == self._me:
            raise ServiceUnavailable("no instance leads the cluster right now; retry shortly")
        query = scope.get("query_string", b"")
        url = leader.rstrip("/") + scope.get("raw_path", scope["path"].encode()).decode("latin-1")
        if query:
            url += "?" + query.decode("latin-1")
        headers = [(k, v) for k, v in scope["headers"] if k.lower() not in _NOT_PASSED]
        request = self._client.build_request(scope["method"], url, headers=headers, content=body)
        try:
            response = await self._client.send(request, stream=True)
            try:
                # Whole, then answered with its length: a leader that dies half-way
                # through an answer becomes a clean 502 here, not a truncated body.
                content = b"".join([chunk async for chunk in response.aiter_raw()])
            finally:
                await response.aclose()
        except _NOT_SENT as exc:
            self._cached = (0.0, None)  # look the leader up again next time
            raise ServiceUnavailable(
                f"the leader at {leader} cannot be reached ({type(exc).__name__}); retry shortly"
            ) from None
        except httpx.HTTPError as exc:
            # The request may have reached the leader and taken effect (a commit, a
            # transaction in one request): its outcome is unknown, which a 503 must not
            # say (clients read a 503 as "nothing was done", and a transaction context
            # then sends its transaction again, or rolls back one that committed).
            self._cached = (0.0, None)
            error = OutcomeUnknown(
                f"the leader at {leader} did not answer ({type(exc).__name__}): the "
                "request may or may not have taken effect"
            )
            await _answer(send, _ANSWER_LOST, orjson.dumps(error.to_json()))
            return
        if scope["method"] == "HEAD":
            # No body, but the length the leader would send for a GET (RFC 9110,
            # 9.3.2), as the leader itself answers.
            length = response.headers.get("content-length", str(len(content))).encode()
        else:
            length = str(len(content)).encode()
        out = [(k, v) for k, v in response.headers.raw if k.lower() not in _NOT_PASSED_BACK]
        out.append((b"content-length", length))
        await send({"type": "http.response.start", "status": response.status_code, "headers": out})
        await send({"type": "http.response.body", "body": content})


def _header(scope: Scope, name: bytes) -> str | None:
    """A request header's value (``name`` lower case), as Starlette would decode it."""
    for key, value in scope["headers"]:
        if key == name:
            return str(value.decode("latin-1"))
    return None


async def _answer(
    send: Send,
    status: int,
    body: bytes,
    media: bytes = b"application/json",
    extra: list[tuple[bytes, bytes]] | None = None,
) -> None:
    headers = [(b"content-type", media), (b"content-length", str(len(body)).encode())]
    if extra:
        headers.extend(extra)
    start: Message = {"type": "http.response.start", "status": status, "headers": headers}
    await send(start)
    await send({"type": "http.response.body", "body": body})
