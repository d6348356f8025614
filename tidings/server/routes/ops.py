"""Operations endpoints: liveness, readiness, Prometheus metrics, the OpenAPI document,
and the instances sharing this server's store."""

from __future__ import annotations

import os
import socket
from typing import Any

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

    @api.endpoint("/v1/cluster")
    async def cluster(request: Request) -> Response:
        return json_response(await api.blocking(_cluster, api))

    @api.endpoint("/openapi.json")
    async def openapi(request: Request) -> Response:
        return Response(document, media_type="application/json")

    return [
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/v1/cluster", cluster, methods=["GET"]),
        Route("/openapi.json", openapi, methods=["GET"]),
    ]


#: What the leader owns: every writer role of the system.
_OWNED = ["topics", "transactions", "groups", "queues"]


def _cluster(api: Api) -> dict[str, Any]:
    """The instances on this server's store, the leader, its epoch and lease."""
    config = api.config
    lease = api.services.lease
    here = config.advertise_url or f"http://{config.host}:{config.port}"
    if lease is None:
        # The embedded store is one process's: this instance is the whole cluster.
        me = f"{socket.gethostname()}-{os.getpid()}"
        return {
            "store": "lmdb",
            "instance": me,
            "leader": {"instance": me, "url": here, "epoch": None},
            "instances": [{"id": me, "url": here, "leader": True, "owns": _OWNED}],
        }
    view = lease.view()
    leader = next((info for info in view.leases if info.name == "leader"), None)
    leader_id = leader.holder if leader is not None and leader.expires_in > 0 else None
    return {
        "store": "postgresql",
        "instance": lease.instance_id,
        "leaseSeconds": lease.seconds,
        "leader": None
        if leader is None
        else {
            "instance": leader.holder,
            "url": leader.url,
            "epoch": leader.epoch,
            "acquiredAt": leader.acquired_at.isoformat(),
            "renewedAt": leader.renewed_at.isoformat(),
            # Since it was taken, by the database's clock (now = expires_at - expires_in).
            "leaseAgeMs": round(
                ((leader.expires_at - leader.acquired_at).total_seconds() - leader.expires_in)
                * 1000
            ),
            "expiresInMs": round(leader.expires_in * 1000),
        },
        "instances": [
            {
                "id": info.id,
                "url": info.url,
                "startedAt": info.started_at.isoformat(),
                "seenAgoMs": round(info.seen_ago * 1000),
                "leader": info.id == leader_id,
                "owns": _OWNED if info.id == leader_id else [],
            }
            for info in view.instances
        ],
    }
