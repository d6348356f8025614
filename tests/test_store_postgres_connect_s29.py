"""Which connect timeout the PostgreSQL store's connections get: the store's, in the
connection string itself so that the read pool's connections have it too (they had
psycopg's 130 s), unless the URL gives a positive one of its own."""

from __future__ import annotations

import pytest

from tests.conftest import fresh_schema

pytest.importorskip("psycopg")

from psycopg.conninfo import conninfo_to_dict

from tidings.cluster.lease import LeaderLease
from tidings.store.backends.postgres import PostgresStore


def _pooled_timeout(store: PostgresStore) -> str:
    with store._pool.connection() as conn:
        return str(conn.info.get_parameters().get("connect_timeout", ""))


def test_every_connection_gets_the_store_s_connect_timeout(postgres_url: str) -> None:
    store = PostgresStore(fresh_schema(postgres_url), readers=1, connect_timeout=2.5)
    try:
        assert conninfo_to_dict(store._conninfo)["connect_timeout"] == "3"  # whole seconds
        assert _pooled_timeout(store) == "3"
        assert store._connect_timeout == 2.5
    finally:
        store.close()


@pytest.mark.parametrize(("given", "used"), [("4", "4"), ("0", "7")])
def test_a_positive_connect_timeout_of_the_url_wins(
    postgres_url: str, given: str, used: str
) -> None:
    # 0 is libpq's "wait forever": what the setting is there against.
    url = f"{fresh_schema(postgres_url)}&connect_timeout={given}"
    store = PostgresStore(url, readers=1, connect_timeout=7)
    try:
        assert _pooled_timeout(store) == used
        assert store._connect_timeout == float(used)
    finally:
        store.close()
    lease = LeaderLease(url, instance_id="a", advertise_url="http://a", connect_timeout=7)
    assert lease.connect_timeout == int(used)
