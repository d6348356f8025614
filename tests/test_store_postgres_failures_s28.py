"""How the PostgreSQL store's connections fail: a network path cut without a reset,
a read pool with every connection taken, PostgreSQL unreachable or refusing a write.
Each must end in a bounded time with a retriable 503, never a hang or a 500."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import fresh_schema

pytest.importorskip("psycopg")

import psycopg

from tidings.cluster.lease import tcp_options
from tidings.store.backends.postgres import PostgresStore

M = "messages"


def _tcp_of(conn: psycopg.Connection[Any]) -> dict[str, str]:
    params = conn.info.get_parameters()
    return {k: params.get(k, "") for k in tcp_options(1)}


def test_every_connection_of_the_store_gets_tcp_timeouts(postgres_url: str) -> None:
    # Without them a read or write on a connection whose network path was cut
    # (no reset) waited until the operating system gave up, many minutes: the
    # writer's wait held every write of the server.
    store = PostgresStore(fresh_schema(postgres_url), readers=1, tcp_timeout=6)
    try:
        want = {k: str(v) for k, v in tcp_options(6).items()}
        assert _tcp_of(store._writer_conn) == want
        with store._pool.connection() as conn:
            assert _tcp_of(conn) == want
    finally:
        store.close()


def test_a_store_url_s_own_tcp_options_win(postgres_url: str) -> None:
    url = fresh_schema(postgres_url) + "&keepalives_idle=7"
    store = PostgresStore(url, readers=1)
    try:
        params = store._writer_conn.info.get_parameters()
        assert params["keepalives_idle"] == "7"
        assert params["tcp_user_timeout"] == "30000"  # the default, 30 s
    finally:
        store.close()


def test_the_server_bounds_the_store_s_connections_by_its_lease(
    postgres_url: str, tmp_path: Any
) -> None:
    from tidings.server.config import ServerConfig
    from tidings.server.services import _open_store

    config = ServerConfig(store=fresh_schema(postgres_url), lease_seconds=3, data_dir=tmp_path)
    store = _open_store(config)
    try:
        assert isinstance(store, PostgresStore)
        assert _tcp_of(store._writer_conn)["tcp_user_timeout"] == "3000"
    finally:
        store.close()
