"""``tidings serve --store postgresql://...``: the server on a real PostgreSQL
(issue: PostgreSQL store; one instance, the store part)."""

from __future__ import annotations

from collections.abc import Callable

import psycopg
import pytest

from tests.conftest import fresh_database
from tests.e2e.serverproc import ServerProcess
from tidings import Client, Record

pytestmark = pytest.mark.e2e


def test_serve_on_postgres_keeps_everything_across_kill_9(
    start_server: Callable[..., ServerProcess], postgres_url: str
) -> None:
    url = fresh_database(postgres_url)
    srv = start_server("--store", url)
    with Client(srv.url) as client:
        client.create_topic("orders")
        client.publish("orders", [Record(b"a", b"k"), b"b"])
        with client.transaction() as tx:
            tx.publish("orders", [b"c", b"d"])
        q = client.queue("orders", "work")
        q.ack(q.pop(1))
        member = client.consume("orders", group="g", follow=False, partitions=2)
        assert len(member.poll()) == 4
        member.commit()
        member.close()
        assert client.stats("orders").message_count == 4
    srv.kill()
    srv.start()
    with Client(srv.url) as client:
        assert [m.payload for m in client.poll("orders")] == [b"a", b"b", b"c", b"d"]
        assert client.describe_group("orders", "g").lag == 0
        assert [m.payload for m in client.queue("orders", "work").pop(10)] == [b"b", b"c", b"d"]
    # The data is in PostgreSQL's tables, not in the data directory.
    with psycopg.connect(url) as conn:
        count = conn.execute("SELECT count(*) FROM tidings_messages").fetchone()
        assert count is not None and count[0] >= 3
        version = conn.execute("SELECT version FROM tidings_schema").fetchone()
        assert version == (1,)
    assert not (srv.data_dir / "store").exists()


def test_a_bad_store_url_stops_the_start(start_server: Callable[..., ServerProcess]) -> None:
    with pytest.raises(RuntimeError, match="store must be a postgresql:// URL"):
        start_server("--store", "mysql://nope")
