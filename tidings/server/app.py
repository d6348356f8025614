"""The ASGI application: the routes of every service plus JSON answers for bad paths."""

from __future__ import annotations

import logging

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from tidings.errors import BadRequest, NotFound, ServerError, TidingsError
from tidings.server import permissions
from tidings.server.handlers import Api, Endpoint, error_response
from tidings.server.routes import console, groups, messaging, ops, queues, transactions

__all__ = ["create_app"]

log = logging.getLogger("tidings.server")

UNMATCHED = "unmatched"


def create_app(api: Api) -> ASGIApp:
    """The server's application over ``api``'s services (they are opened by the caller)."""
    observe = api.metrics.http.observe

    async def http_error(request: Request, exc: Exception) -> Response:
        # Starlette raises these for paths no route matches (404) and for methods a
        # matched path does not allow (405, with its Allow header).
        assert isinstance(exc, HTTPException)
        error: TidingsError
        if exc.status_code == 404:
            error = NotFound(f"no such endpoint: {request.method} {request.url.path}")
        elif exc.status_code == 405:
            # tidings.errors has no class for 405; clients fall back on the status.
            error = BadRequest(f"{request.method} is not allowed on {request.url.path}")
        else:
            error = BadRequest(str(exc.detail))
        response = error_response(error, dict(exc.headers or {}))
        response.status_code = exc.status_code
        observe(request.method, UNMATCHED, exc.status_code, 0.0)
        return response

    async def server_error(request: Request, exc: Exception) -> Response:
        log.error(
            "unhandled error", exc_info=exc, extra={"event": "error", "path": request.url.path}
        )
        return error_response(ServerError(f"internal error: {type(exc).__name__}"))

    messaging_routes = messaging.routes(api)
    transaction_routes = transactions.routes(api)
    queue_routes = queues.routes(api)
    group_routes = groups.routes(api)
    app = Starlette(
        routes=[
            *messaging_routes,
            *transaction_routes,
            *group_routes,
            *queue_routes,
            *ops.routes(api),
            *console.routes(api),
        ],
        exception_handlers={HTTPException: http_error, Exception: server_error},
    )
    _check_permissions(app)
    hot = {
        route.path: route.endpoint
        for route in [*messaging_routes, *transaction_routes, *queue_routes, *group_routes]
        if isinstance(route, Route) and route.path in _HOT_PATHS
    }
    return _HotPaths(app, hot)


def _check_permissions(app: Starlette) -> None:
    """Refuse to start with a route the permission table does not name: a route added
    later cannot go unchecked."""
    missing = [
        f"{method} {route.path}"
        for route in app.routes
        if isinstance(route, Route)
        for method in sorted((route.methods or set()) - {"HEAD"})
        if (method, route.path) not in permissions.PERMISSIONS
    ]
    if missing:
        raise RuntimeError(f"routes without a permission entry: {', '.join(missing)}")


#: The requests producers and consumers send all the time.
_HOT_PATHS = frozenset(
    {
        messaging.TOPIC + "/publish",
        messaging.TOPIC + "/poll",
        transactions.PUBLISH,
        queues.QUEUE + "/pop",
        queues.QUEUE + "/ack",
        groups.GROUP + "/poll",
    }
)


class _HotPaths:
    """Publish, poll, the one-request transaction, a queue's pop and ack and a group
    member's poll straight to their endpoints; everything else through Starlette.

    Starlette's middleware, router and request wrapper cost ~10 us of the event loop per
    request (four layers of coroutines and ``send`` wrappers, then a regular expression
    per route until one matches), measured in the W3 latency benchmark where each
    message is one publish and one poll. The endpoints map their own errors
    (:meth:`Api.endpoint`), so this path answers exactly as Starlette would; any path
    it does not recognise, including malformed ones, goes the ordinary way.
    Justified by BENCHMARKS.md, "Where the time goes", Latency (W3).
    """

    def __init__(self, app: Starlette, hot: dict[str, Endpoint]) -> None:
        self.app = app
        self._topic_actions = {
            action: hot[messaging.TOPIC + "/" + action] for action in ("publish", "poll")
        }
        self._tx_publish = hot[transactions.PUBLISH]
        self._queue_actions = {
            action: hot[queues.QUEUE + "/" + action] for action in ("pop", "ack")
        }
        self._group_poll = hot[groups.GROUP + "/poll"]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and not scope.get("root_path"):
            parts = scope["path"].split("/")
            endpoint: Endpoint | None = None
            if len(parts) >= 6 and parts[1] == "v1" and parts[2] == "namespaces" and parts[3]:
                if len(parts) == 7 and parts[4] == "topics" and parts[5]:
                    # /v1/namespaces/{ns}/topics/{topic}/{publish|poll}
                    endpoint = self._topic_actions.get(parts[6])
                    params = {"ns": parts[3], "topic": parts[5]}
                elif len(parts) == 6 and parts[4] == "transactions" and parts[5] == "publish":
                    endpoint = self._tx_publish
                    params = {"ns": parts[3]}
                elif len(parts) == 9 and parts[4] == "topics" and parts[5] and parts[7]:
                    if parts[6] == "queues":
                        # /v1/namespaces/{ns}/topics/{topic}/queues/{queue}/{pop|ack}
                        endpoint = self._queue_actions.get(parts[8])
                        params = {"ns": parts[3], "topic": parts[5], "queue": parts[7]}
                    elif parts[6] == "groups" and parts[8] == "poll":
                        # /v1/namespaces/{ns}/topics/{topic}/groups/{group}/poll
                        endpoint = self._group_poll
                        params = {"ns": parts[3], "topic": parts[5], "group": parts[7]}
            if endpoint is not None:
                scope["path_params"] = params
                response = await endpoint(Request(scope, receive, send))
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
