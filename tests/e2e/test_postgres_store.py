"""``tidings serve --store postgresql://...``: the server on a real PostgreSQL
(issue: PostgreSQL store; one instance, the store part)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import psycopg
import pytest

from tests.conftest import PgTestCluster, fresh_database
from tests.e2e.serverproc import ServerProcess, wait_leading
from tidings import Client, Record, RetryPolicy
from tidings.errors import TidingsError

pytestmark = pytest.mark.e2e


def test_serve_on_postgres_keeps_everything_across_kill_9(
    start_server: Callable[..., ServerProcess], postgres_url: str
) -> None:
    url = fresh_database(postgres_url)
    # A short lease: the restarted server waits for the killed one's to pass.
    srv = start_server("--store", url, "--lease-seconds", "1")
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
    # It answers at once, standing by (forwarding) until the killed instance's lease
    # passes; requests in that second get 503. Wait until it leads.
    wait_leading(srv, timeout=30)
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
    assert not (srv.data_dir / "tx").exists()
    with psycopg.connect(url) as conn:
        logged = conn.execute("SELECT count(*) FROM tidings_tx").fetchone()
        assert logged is not None and logged[0] >= 1  # the transaction log's snapshot


def test_a_bad_store_url_stops_the_start(start_server: Callable[..., ServerProcess]) -> None:
    with pytest.raises(RuntimeError, match="store must be a postgresql:// URL"):
        start_server("--store", "mysql://nope")


def test_postgresql_restarted_under_load_clients_carry_on(
    start_server: Callable[..., ServerProcess], postgres_cluster: PgTestCluster
) -> None:
    url = fresh_database(postgres_cluster.url)
    srv = start_server("--store", url, "--lease-seconds", "15")
    acked: list[bytes] = []
    errors: list[BaseException] = []
    stop = threading.Event()

    def publish() -> None:
        # A patient, idempotent client: the retriable errors of the restart are retried
        # inside each call, and a retry is not written twice.
        patient = RetryPolicy(attempts=200, initial_backoff=0.05, max_backoff=0.5)
        with Client(srv.url, timeout=10.0, retry=patient) as client:
            n = 0
            while not stop.is_set():
                batch = [b"m%05d-%d" % (n, i) for i in range(10)]
                try:
                    client.publish("load", batch)
                except TidingsError as exc:
                    errors.append(exc)
                    return
                acked.extend(batch)
                n += 1

    with Client(srv.url) as client:
        client.create_topic("load")
    thread = threading.Thread(target=publish)
    thread.start()
    time.sleep(1.0)
    before = len(acked)
    postgres_cluster.restart()
    time.sleep(2.0)
    stop.set()
    thread.join(60)
    assert not thread.is_alive(), "a publish was still being retried a minute after the restart"
    assert not errors, errors
    assert before > 0 and len(acked) > before, "publishing did not carry on"
    assert srv.proc is not None and srv.proc.poll() is None, srv.log()
    assert "store commit failed" in srv.log()  # the restart did cut a commit short
    seen: list[bytes] = []
    with Client(srv.url) as client:
        page = client.poll("load", limit=10_000)
        while page:
            seen.extend(m.payload for m in page)
            page = client.poll("load", page[-1].id, inclusive=False, limit=10_000)
    assert seen == acked  # every acknowledged message, once, in order
