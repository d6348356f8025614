"""The ASGI application: the routes of every service plus JSON answers for bad paths."""

from __future__ import annotations

import logging

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from tidings.errors import BadRequest, NotFound, ServerError, TidingsError
from tidings.server.handlers import Api, error_response
from tidings.server.routes import messaging, ops, transactions

__all__ = ["create_app"]

log = logging.getLogger("tidings.server")

UNMATCHED = "unmatched"


def create_app(api: Api) -> Starlette:
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

    return Starlette(
        routes=[*messaging.routes(api), *transactions.routes(api), *ops.routes(api)],
        exception_handlers={HTTPException: http_error, Exception: server_error},
    )
