"""The PostgreSQL store's writer after PostgreSQL cut its sessions while it sat idle
(a restart of PostgreSQL, a proxy dropping idle connections): the next write must not
fail for it, as it does not on LMDB."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.conftest import fresh_database

pytest.importorskip("psycopg")

from tidings.consumers.queues import QueueCoordinator
from tidings.messaging import MessagingService
from tidings.store.backends.postgres import PostgresStore
from tidings.tx import TransactionManager, TxConfig

M = "messages"


def _cut_sessions(postgres_url: str, database_url: str) -> int:
    """Terminate every session of ``database_url``'s database, as a restart of
    PostgreSQL does, and give the server a moment to close their sockets."""
    import psycopg

    database = database_url.rsplit("/", 1)[1]
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = %s AND pid <> pg_backend_pid()",
            (database,),
        ).fetchall()
        for _ in range(100):  # bounded: the sessions end within milliseconds
            left = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = %s", (database,)
            ).fetchone()
            if left is not None and left[0] == 0:
                break
            time.sleep(0.02)
    return len(rows)


def test_a_write_after_the_idle_writer_was_cut_commits(postgres_url: str) -> None:
    url = fresh_database(postgres_url)
    store = PostgresStore(url, readers=2)
    try:
        store.apply(lambda view: view.put(M, b"a", b"1"))
        assert _cut_sessions(postgres_url, url) >= 1
        # Nothing of it was sent on the dead connection: it goes on a new one.
        store.apply(lambda view: view.put(M, b"b", b"2"))
        assert store.apply(lambda view: view.get(M, b"a")) == b"1"
        assert store.scan_list(M, b"", b"\xff") == [(b"a", b"1"), (b"b", b"2")]
    finally:
        store.close()


def test_a_queue_keeps_its_leases_when_postgresql_cut_the_idle_writer(
    postgres_url: str, tmp_path: Path
) -> None:
    # The ack's write failed on the dead connection: the queue, whose memory had run
    # ahead of it, was rebuilt from its records, which a pop does not write. So the
    # worker's ack of what it had been handed was refused (NotDelivered), and the
    # messages went out again as if never delivered.
    url = fresh_database(postgres_url)
    store = PostgresStore(url, readers=2)
    messaging = MessagingService(store)
    try:
        with TransactionManager(None, TxConfig(sweep_interval=3600), store=store) as tx:
            queues = QueueCoordinator(store, messaging, tx)
            messaging.create_topic("ns", "t")
            messaging.publish("ns", "t", [b"m%d" % i for i in range(6)])
            snapshot = tx.snapshot()
            assert snapshot is not None
            first = queues.pop("ns", "t", "q", "w1", max_messages=2, snapshot=snapshot)
            queues.ack("ns", "t", "q", "w1", [m.id for m in first])
            held = queues.pop("ns", "t", "q", "w1", max_messages=2, snapshot=snapshot)
            assert _cut_sessions(postgres_url, url) >= 1
            queues.ack("ns", "t", "q", "w1", [m.id for m in held])
            rest = queues.pop("ns", "t", "q", "w2", max_messages=10, snapshot=snapshot)
            assert [m.payload for m in rest] == [b"m4", b"m5"]
            assert queues.describe("ns", "t", "q").acked == 4
    finally:
        messaging.close()
        store.close()
