"""What every endpoint shares: the :class:`Api` state, responses, and the error boundary.

Starlette's exception middleware would also map errors, but it costs a handler
lookup per error and hides the status from the request counter; wrapping each
endpoint once (:meth:`Api.endpoint`) maps :class:`~tidings.errors.TidingsError` to its
status and ``{"error", "type"}`` body, turns anything else into a logged 500, and
counts the request, all in one ``try``.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import sys
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, ParamSpec, TypeVar

import orjson
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from tidings.consumers import GroupCoordinator, QueueCoordinator
from tidings.errors import (
    Forbidden,
    RoleUnavailable,
    ServerError,
    StoreUnavailable,
    TidingsError,
    TooManyTransactions,
    Unauthorized,
)
from tidings.messaging import MessagingService
from tidings.server import permissions
from tidings.server.auth import Authenticator, Principal
from tidings.server.config import ServerConfig
from tidings.server.inbox import LoopInbox
from tidings.server.longpoll import LongPolls
from tidings.server.metrics import Metrics
from tidings.server.origin import HostAllowlist, allowed_set, check_request, host_allowlist
from tidings.server.services import Services
from tidings.tx import TransactionManager

__all__ = [
    "PRINCIPAL",
    "UNCHECKED_HOSTS",
    "Api",
    "Endpoint",
    "error_response",
    "hosts_of",
    "json_response",
    "principal_of",
]

log = logging.getLogger("tidings.server")

Endpoint = Callable[[Request], Awaitable[Response]]
P = ParamSpec("P")
T = TypeVar("T")

JSON_TYPE = "application/json"
CLIENT_CLOSED = 499


def json_response(value: Any, status: int = 200) -> Response:
    """``value`` as a JSON response (orjson)."""
    return Response(orjson.dumps(value), status, media_type=JSON_TYPE)


#: Where the authenticated principal of a request is kept (in its ASGI scope).
PRINCIPAL = "tidings.principal"


def error_response(exc: TidingsError, headers: dict[str, str] | None = None) -> Response:
    """The error's status with ``{"error": ..., "type": ...}`` (and, for a 401, the
    ``WWW-Authenticate`` challenge; for a full transaction service, ``Retry-After``)."""
    if isinstance(exc, Unauthorized):
        headers = {**(headers or {}), "WWW-Authenticate": 'Bearer realm="tidings"'}
    elif isinstance(exc, TooManyTransactions):
        # A slot frees as a transaction ends, or at the next timeout sweep (1 s by
        # default), as a standby's 503 says while a new leader takes over.
        headers = {**(headers or {}), "Retry-After": "1"}
    return Response(orjson.dumps(exc.to_json()), exc.status, headers, media_type=JSON_TYPE)


def _unreachable_store(exc: BaseException) -> StoreUnavailable | None:
    """A retriable 503 for a PostgreSQL connection that failed under a request (the
    store's own reads and writes say so themselves; this covers the rest, such as the
    leader's cluster view), else None. Only what failed on its connection: that
    request did nothing. psycopg is looked up, not imported: without a PostgreSQL
    store it was never loaded, and nothing of it can have failed."""
    psycopg = sys.modules.get("psycopg")
    if (
        psycopg is None
        or not isinstance(exc, psycopg.OperationalError)
        # A program limit (class 54: a row too large for its index) fails each retry.
        or isinstance(exc, psycopg.errors.ProgramLimitExceeded)
    ):
        return None
    reason = " ".join(str(exc).split()) or type(exc).__name__
    return StoreUnavailable(f"the PostgreSQL store cannot be reached: {reason}")


def principal_of(request: Request) -> Principal | None:
    """The principal a request was authenticated as (None: the server has no auth
    file, everything is allowed)."""
    found: Principal | None = request.scope.get(PRINCIPAL)
    return found


#: The routes answered whatever the ``Host`` (:attr:`Api.hosts`).
UNCHECKED_HOSTS = frozenset({"/healthz", "/readyz"})


def hosts_of(config: ServerConfig) -> HostAllowlist | None:
    """The ``Host`` check ``config`` asks for (:func:`host_allowlist`)."""
    return host_allowlist(config.host, config.allowed_hosts, config.advertise_url)


@dataclass
class Api:
    """The state the routes close over: configuration, services, metrics, long-polls,
    and the inbox that brings results of other threads to the event loop."""

    config: ServerConfig
    services: Services
    metrics: Metrics
    longpolls: LongPolls
    inbox: LoopInbox
    #: The auth file's principals; None: no auth file, every request is allowed.
    auth: Authenticator | None = None
    #: The ``Host`` values answered (``allowed_hosts``); None: any.
    hosts: HostAllowlist | None = field(init=False)
    #: The store's reads wait on the network (PostgreSQL): the routes then make on the
    #: worker threads every read they make on the event loop over LMDB, where a read
    #: costs less than the hand-over to a thread. A read waiting there for a pooled
    #: connection (up to its pool timeout) would stall every request of the process,
    #: ``/healthz`` included.
    reads_block: bool = field(init=False)

    def __post_init__(self) -> None:
        self.hosts = hosts_of(self.config)
        store = self.services.store
        self.reads_block = store is not None and store.reads_block

    @property
    def messaging(self) -> MessagingService:
        """The messaging service, or 503 when this process does not run it."""
        service = self.services.messaging
        if service is None:
            raise RoleUnavailable(
                f"the messaging service does not run in this process (role={self.config.role})"
            )
        return service

    @property
    def tx(self) -> TransactionManager:
        """The transaction service, or 503 when this process does not run it."""
        service = self.services.tx
        if service is None:
            raise RoleUnavailable(
                f"the transaction service does not run in this process (role={self.config.role})"
            )
        return service

    @property
    def groups(self) -> GroupCoordinator:
        """Consumer groups, or 503 unless this process runs both services."""
        groups = self.services.groups
        if groups is None:
            raise RoleUnavailable(
                "consumer groups need the messaging and transaction services in one "
                f"process (role=all), this one runs role={self.config.role}"
            )
        return groups

    @property
    def queues(self) -> QueueCoordinator:
        """Queues, or 503 unless this process runs both services."""
        queues = self.services.queues
        if queues is None:
            raise RoleUnavailable(
                "queues need the messaging and transaction services in one "
                f"process (role=all), this one runs role={self.config.role}"
            )
        return queues

    def _authorize(self, request: Request, route: str) -> None:
        """Authenticate the request and check the route's need (docs/security.md)."""
        assert self.auth is not None
        need = permissions.need_of(request.method, route)
        if need is permissions.Need.OPEN or (
            need is permissions.Need.METRICS and not self.config.metrics_auth
        ):
            return
        principal = self.auth.authenticate(request.headers.get("authorization"))
        request.scope[PRINCIPAL] = principal
        permissions.check(need, principal, request.path_params)

    def require_writer(self, request: Request, write_pointer: int | None) -> None:
        """:class:`Forbidden` unless the request's principal may write under (or take
        back the writes of) transaction ``write_pointer``: one open under a
        transactional id takes that id, or admin, as ending it does
        (docs/security.md). A transaction begun without one, or no longer open, is
        anyone's who may use the topic; a process without the transaction service
        cannot tell, and lets it through."""
        if write_pointer is None:
            return
        principal = principal_of(request)
        tx = self.services.tx
        if principal is None or principal.admin or tx is None:
            return
        owner = tx.began_under(write_pointer)
        if owner is not None and not principal.may_use(owner):
            # The id is not named: a principal that may not use it need not learn it.
            raise Forbidden(
                f"principal {principal.name} may not write under transaction "
                f"{write_pointer}: it was begun under a transactional id the principal "
                "may not use"
            )

    async def blocking(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run a blocking call on the worker threads and await it."""
        loop = asyncio.get_running_loop()
        call = functools.partial(fn, *args, **kwargs) if kwargs else functools.partial(fn, *args)
        return await loop.run_in_executor(self.services.executor, call)

    async def known_topics(self, namespace: str, topics: Iterable[str]) -> None:
        """Where reads block: each topic that memory does not hold as live is read on a
        worker thread, so that the write queued next (a publish, store or rollback)
        reads nothing from the store on the event loop. Raises as that write would
        (TopicNotFound)."""
        messaging = self.messaging
        for topic in topics:
            if not messaging.knows_live(namespace, topic):
                await self.blocking(messaging.identity, namespace, topic)

    def endpoint(self, route: str) -> Callable[[Endpoint], Endpoint]:
        """Wrap an endpoint: map errors to responses and count it under ``route``."""
        observe = self.metrics.http.observe
        allowed = allowed_set(self.config.allowed_origins)
        # Probes (a load balancer's, Kubernetes') address an instance by whatever
        # name or address they have for it, and liveness and readiness tell a page
        # nothing worth a rebinding.
        hosts = None if route in UNCHECKED_HOSTS else self.hosts

        def wrap(fn: Endpoint) -> Endpoint:
            @functools.wraps(fn)
            async def endpoint(request: Request) -> Response:
                start = time.perf_counter()
                try:
                    # A request for another Host (DNS rebinding) and a browser's write
                    # from another site (docs/security.md, "Requests from other
                    # sites"), before authorization: the refusal does not depend on
                    # the token and costs no hashing.
                    check_request(request.method, request.scope["headers"], allowed, hosts)
                    if self.auth is not None:
                        self._authorize(request, route)
                    response = await fn(request)
                except TidingsError as exc:
                    if type(exc) is Forbidden:
                        # Refused by the table or by what the body names: the
                        # principal's name only, never the token.
                        principal = principal_of(request)
                        log.warning(
                            "forbidden",
                            extra={
                                "event": "forbidden",
                                "principal": None if principal is None else principal.name,
                                "route": route,
                            },
                        )
                    response = error_response(exc)
                except ClientDisconnect:
                    # Nobody reads the answer; nginx's 499 keeps it apart in the metrics.
                    response = Response(status_code=CLIENT_CLOSED)
                except Exception as exc:
                    unavailable = _unreachable_store(exc)
                    if unavailable is not None:
                        log.warning(
                            unavailable.message,
                            extra={"event": "error", "route": route, "method": request.method},
                        )
                        response = error_response(unavailable)
                    else:
                        log.exception(
                            "request failed",
                            extra={"event": "error", "route": route, "method": request.method},
                        )
                        response = error_response(
                            ServerError(f"internal error: {type(exc).__name__}: {exc}")
                        )
                observe(request.method, route, response.status_code, time.perf_counter() - start)
                return response

            return endpoint

        return wrap
