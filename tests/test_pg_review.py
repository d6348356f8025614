"""Store contract cases found wanting on the PostgreSQL store, run against every
backend (the ``store`` fixture), and what only the PostgreSQL store does."""

from __future__ import annotations

import pytest

from tidings.store import Store, WriteView

M = "messages"
END = b"\xff" * 8


class Boom(Exception):
    pass


def _fill(store: Store) -> None:
    store.apply(lambda view: view.put_many(M, [(b"a", b"1"), (b"b", b"2"), (b"c", b"3")]))


def test_a_range_delete_of_a_function_that_raises_is_undone(store: Store) -> None:
    # The range delete is the function's first write: nothing of its own was buffered
    # before it, and the PostgreSQL store then took no savepoint to roll back to.
    _fill(store)

    def failing(view: WriteView) -> None:
        view.delete_range(M, b"a", b"c")
        raise Boom("no")

    with pytest.raises(Boom):
        store.submit(failing).result()
    assert store.scan_list(M, b"", END) == [(b"a", b"1"), (b"b", b"2"), (b"c", b"3")]


def test_a_range_delete_after_a_scan_of_a_function_that_raises_is_undone(store: Store) -> None:
    _fill(store)

    def failing(view: WriteView) -> None:
        assert len(list(view.scan(M, b"", END))) == 3
        view.delete_range(M, b"b", END, limit=1)
        view.put(M, b"d", b"4")
        assert [k for k, _ in view.scan(M, b"", END)] == [b"a", b"c", b"d"]
        raise Boom("no")

    with pytest.raises(Boom):
        store.submit(failing).result()
    assert store.scan_list(M, b"", END) == [(b"a", b"1"), (b"b", b"2"), (b"c", b"3")]


# --- the PostgreSQL store only -------------------------------------------------------


def _terminate_sessions(postgres_url: str, database_url: str) -> int:
    """Cut every session of ``database_url``'s database, as a restart of PostgreSQL
    does; how many were cut."""
    import psycopg

    database = database_url.rsplit("/", 1)[1]
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = %s AND pid <> pg_backend_pid()",
            (database,),
        ).fetchall()
    return len(rows)


def test_reads_go_on_after_the_sessions_were_cut(postgres_url: str) -> None:
    # PostgreSQL restarted (or a proxy dropped idle connections): the pooled
    # connections are dead, but nothing says so until they are used. A read that
    # has sent nothing but its BEGIN may take another connection.
    pytest.importorskip("psycopg")
    from contextlib import ExitStack

    from tests.conftest import fresh_database
    from tidings.store.backends.postgres import PostgresStore

    url = fresh_database(postgres_url)
    store = PostgresStore(url, readers=4)
    try:
        store.apply(lambda view: view.put(M, b"k", b"v"))
        with ExitStack() as stack:  # several pooled connections, all idle afterwards
            for _ in range(4):
                stack.enter_context(store.read())
        assert _terminate_sessions(postgres_url, url) >= 4
        for _ in range(6):
            assert store.get(M, b"k") == b"v"
            assert store.scan_list(M, b"", END) == [(b"k", b"v")]
    finally:
        store.close()


def test_a_holder_whose_renewal_hangs_is_told_within_the_lease(postgres_url: str) -> None:
    # The renewal neither answers nor fails (here: waiting for a row lock; in
    # production: PostgreSQL cut off without a reset). By the holder's own clock the
    # lease has passed: it must be told, not go on believing it leads.
    pytest.importorskip("psycopg")
    import threading
    import time

    import psycopg

    from tests.conftest import fresh_database
    from tidings.cluster.lease import LeaderLease

    url = fresh_database(postgres_url)
    lost: list[str] = []
    told = threading.Event()

    def on_lost(why: str) -> None:
        lost.append(why)
        told.set()

    lease = LeaderLease(
        url, instance_id="a", advertise_url="http://a", seconds=0.6, on_lost=on_lost
    )
    lease.prepare()
    lease.acquire(wait=False)
    lease.start_renewing()
    with psycopg.connect(url) as blocker:
        blocker.execute("SELECT 1 FROM tidings_leases FOR UPDATE")  # held until the end
        began = time.monotonic()
        assert told.wait(5), "the holder was never told its lease had passed"
        assert time.monotonic() - began < 0.6 + 0.5
        blocker.rollback()
    assert lost == ["the leader lease could not be renewed in time"]
    assert not lease.held
    lease.release()


@pytest.mark.parametrize("limit", [0, -1])
def test_a_range_delete_of_no_more_than_nothing_deletes_nothing(store: Store, limit: int) -> None:
    _fill(store)
    assert store.apply(lambda view: view.delete_range(M, b"", END, limit)) == 0
    assert store.apply(
        lambda view: [view.put(M, b"d", b"4"), view.delete_range(M, b"", END, limit)]
    ) == [None, 0]
    assert [k for k, _ in store.scan_list(M, b"", END)] == [b"a", b"b", b"c", b"d"]
    assert store.scan_list(M, b"", END, limit) == []


@pytest.mark.parametrize(
    ("host", "advertised"),
    [("127.0.0.1", "http://127.0.0.1:8470"), ("::1", "http://[::1]:8470")],
)
def test_the_default_advertised_url_is_a_url(postgres_url: str, host: str, advertised: str) -> None:
    # Nothing listens: the lease is only made (its tables created), not taken.
    pytest.importorskip("psycopg")
    import httpx

    from tests.conftest import fresh_database
    from tidings.server.config import ServerConfig
    from tidings.server.services import Services

    config = ServerConfig(store=fresh_database(postgres_url), host=host, port=8470)
    lease = Services.new_lease(config)
    assert lease.advertise_url == advertised
    assert httpx.URL(lease.advertise_url + "/v1/cluster").port == 8470  # parses
