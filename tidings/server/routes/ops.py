"""Operations endpoints: liveness, readiness, Prometheus metrics, the OpenAPI document."""

from __future__ import annotations

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

import tidings
from tidings.server.handlers import Api, json_response
from tidings.server.metrics import CONTENT_TYPE
from tidings.server.openapi import openapi_document

__all__ = ["routes"]


def routes(api: Api) -> list[Route]:
    """``/healthz``, ``/readyz``, ``/metrics`` and ``/openapi.json``."""
    max_timeout = api.config.tx_max_timeout
    document = orjson.dumps(openapi_document(tidings.__version__, max_timeout=max_timeout))

    @api.endpoint("/healthz")
    async def healthz(request: Request) -> Response:
        return json_response({"status": "ok"})

    @api.endpoint("/readyz")
    async def readyz(request: Request) -> Response:
        if api.services.ready:
            return json_response({"status": "ready", "role": api.config.role})
        return json_response({"status": "not ready", "role": api.config.role}, 503)

    @api.endpoint("/metrics")
    async def metrics(request: Request) -> Response:
        # Rendering reads the transaction state and per-topic counters: cheap, but not
        # free, so it runs off the loop.
        return Response(await api.blocking(api.metrics.render), media_type=CONTENT_TYPE)

    @api.endpoint("/openapi.json")
    async def openapi(request: Request) -> Response:
        return Response(document, media_type="application/json")

    return [
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/openapi.json", openapi, methods=["GET"]),
    ]
