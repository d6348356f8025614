"""What a client gets over HTTP when the PostgreSQL store cannot serve a request now:
a retriable 503 with a JSON error, never a 500."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import fresh_schema

pytest.importorskip("psycopg")

import psycopg

from tidings.messaging import MessagingService
from tidings.server.app import create_app
from tidings.server.config import ServerConfig
from tidings.server.handlers import Api
from tidings.server.inbox import LoopInbox
from tidings.server.longpoll import LongPolls
from tidings.server.metrics import Metrics, Sources
from tidings.server.services import Services
from tidings.store.backends.postgres import PostgresStore


async def _get(services: Services, path: str) -> httpx.Response:
    api = Api(
        services.config,
        services,
        Metrics(sources=Sources(tx_state=None)),
        LongPolls(),
        LoopInbox(asyncio.get_running_loop()),
    )
    transport = httpx.ASGITransport(app=create_app(api))
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
        return await client.get(path)


def test_a_read_finding_every_pooled_connection_busy_gets_a_503(
    postgres_url: str, tmp_path: Path
) -> None:
    # The read waited the pool's timeout, then its PoolTimeout was a 500.
    store = PostgresStore(fresh_schema(postgres_url), readers=1, connect_timeout=0.3)
    services = Services(ServerConfig(data_dir=tmp_path, role="messaging"))
    services.store = store
    services.messaging = MessagingService(store)
    try:
        services.messaging.create_topic("ns", "t")
        with store.read():  # the pool's only connection
            answer = asyncio.run(_get(services, "/v1/namespaces/ns/topics"))
        assert answer.status_code == 503, answer.text
        body = answer.json()
        assert body["type"] == "StoreUnavailable" and "read pool" in body["error"]
        answer = asyncio.run(_get(services, "/v1/namespaces/ns/topics"))
        assert answer.status_code == 200 and answer.json() == ["t"]
    finally:
        services.close()


class _UnreachableLease:
    instance_id = "me"
    seconds = 5.0

    def view(self, window: float = 3600.0) -> Any:
        raise psycopg.OperationalError("connection to server failed: Connection refused")


def test_the_cluster_view_with_postgresql_unreachable_gets_a_503(tmp_path: Path) -> None:
    services = Services(ServerConfig(data_dir=tmp_path, role="messaging"))
    services.lease = _UnreachableLease()  # type: ignore[assignment]
    try:
        answer = asyncio.run(_get(services, "/v1/cluster"))
        assert answer.status_code == 503, answer.text
        assert answer.json()["type"] == "StoreUnavailable"
        assert "Connection refused" in answer.json()["error"]
    finally:
        services.lease = None
        services.close()
