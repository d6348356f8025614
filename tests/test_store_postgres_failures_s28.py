"""How the PostgreSQL store's connections fail: a network path cut without a reset,
a read pool with every connection taken, PostgreSQL unreachable or refusing a write.
Each must end in a bounded time with a retriable 503, never a hang or a 500."""

from __future__ import annotations

import time
from typing import Any

import orjson
import pytest

from tests.conftest import fresh_database, fresh_schema

pytest.importorskip("psycopg")

import psycopg

from tidings.cluster.lease import tcp_options
from tidings.errors import ServerError, StoreFull, StoreUnavailable, TidingsError
from tidings.server.handlers import error_response
from tidings.store.backend import WriteView
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


def test_the_server_sizes_the_read_pool_by_pg_readers(postgres_url: str, tmp_path: Any) -> None:
    # The pool was 8 connections whatever the server's settings said.
    from tidings.server.config import load_config
    from tidings.server.services import _open_store

    env = {"TIDINGS_STORE": fresh_schema(postgres_url), "TIDINGS_DATA_DIR": str(tmp_path)}
    store = _open_store(load_config({"pg_readers": "3"}, env=env))
    try:
        assert isinstance(store, PostgresStore)
        assert store._pool.max_size == 3
    finally:
        store.close()


def test_the_writer_reconnects_within_the_store_s_connect_timeout(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The writer's connections waited 10 s whatever connect_timeout the store was given.
    timeouts: list[object] = []
    connect = psycopg.connect

    def recording(*args: Any, **kwargs: Any) -> Any:
        timeouts.append(kwargs.get("connect_timeout"))
        return connect(*args, **kwargs)

    url = fresh_database(postgres_url)
    monkeypatch.setattr(psycopg, "connect", recording)
    store = PostgresStore(url, readers=1, connect_timeout=2.5)
    try:
        assert timeouts == [3]  # libpq counts whole seconds: rounded up, never 0
        monkeypatch.setattr(psycopg, "connect", connect)  # _cut_sessions connects too
        _cut_sessions(postgres_url, url)
        monkeypatch.setattr(psycopg, "connect", recording)
        store.apply(lambda view: view.put(M, b"a", b"1"))
        assert timeouts == [3, 3]
        assert store.get(M, b"a") == b"1"
    finally:
        store.close()


def _cut_sessions(postgres_url: str, database_url: str) -> None:
    """Terminate every session of ``database_url``'s database, as a restart of
    PostgreSQL does."""
    database = database_url.rsplit("/", 1)[1].split("?", 1)[0]
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = %s AND pid <> pg_backend_pid()",
            (database,),
        )
        for _ in range(100):  # bounded: the sessions end within milliseconds
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = %s", (database,)
            ).fetchone()
            if row is not None and row[0] == 0:
                return
            time.sleep(0.02)


def _answer(exc: BaseException) -> tuple[int, dict[str, Any]]:
    """The server's answer to ``exc`` (what Api.endpoint sends for a TidingsError)."""
    assert isinstance(exc, TidingsError), exc
    response = error_response(exc)
    return response.status_code, orjson.loads(bytes(response.body))


def test_a_read_finding_the_pool_busy_is_a_retriable_503(postgres_url: str) -> None:
    # It waited the pool's timeout, then psycopg_pool's PoolTimeout became a 500.
    store = PostgresStore(fresh_schema(postgres_url), readers=1, connect_timeout=0.3)
    try:
        with store.read(), pytest.raises(StoreUnavailable) as caught, store.read():
            pass
        status, body = _answer(caught.value)
        assert status == 503 and body["type"] == "StoreUnavailable"
        assert "read pool" in body["error"] and "1 connections" in body["error"]
        assert caught.value.retriable
        # Still an OperationalError, as before, for callers catching that.
        assert isinstance(caught.value, psycopg.OperationalError)
        # The pool is whole again: the next read goes.
        assert store.get(M, b"a") is None
    finally:
        store.close()


def test_a_read_whose_connection_was_cut_mid_read_is_a_retriable_503(
    postgres_url: str,
) -> None:
    url = fresh_database(postgres_url)
    store = PostgresStore(url, readers=2)
    try:
        store.apply(lambda view: view.put(M, b"a", b"1"))
        with pytest.raises(StoreUnavailable) as caught, store.read() as view:
            assert view.get(M, b"a") == b"1"
            _cut_sessions(postgres_url, url)
            view.get(M, b"a")
        assert _answer(caught.value)[0] == 503
        assert store.get(M, b"a") == b"1"  # PostgreSQL is back: reads go on
    finally:
        store.close()


def test_a_write_whose_connection_was_cut_before_its_commit_is_a_503(
    postgres_url: str,
) -> None:
    # Nothing of it was sent whole: not done, a 503, where it was a 500 (which clients
    # take for an answer lost, outcome unknown).
    url = fresh_database(postgres_url)
    store = PostgresStore(url, readers=2)
    try:

        def cut_then_read(view: WriteView) -> None:
            view.put(M, b"b", b"2")
            _cut_sessions(postgres_url, url)
            view.get(M, b"unknown")

        with pytest.raises(StoreUnavailable) as caught:
            store.apply(cut_then_read)
        assert _answer(caught.value)[0] == 503
        assert "nothing was written" in str(caught.value)
        store.apply(lambda view: view.put(M, b"c", b"3"))
        assert store.scan_list(M, b"", b"\xff") == [(b"c", b"3")]
    finally:
        store.close()


def test_a_write_whose_commit_got_no_answer_and_did_not_commit_is_a_503(
    postgres_url: str,
) -> None:
    # The COMMIT seemed to go out and the connection seemed to die: it may have
    # committed, so the writer asks PostgreSQL, which says it did not (the COMMIT never
    # left here): a 503, nothing written, where it was a 500 (outcome unknown).
    # tests/e2e/test_pg_commit_s29.py loses real COMMITs' answers.
    store = PostgresStore(fresh_schema(postgres_url), readers=1)
    try:

        def lose_commit(view: WriteView) -> None:
            conn = view._conn  # type: ignore[attr-defined]
            original = conn.execute

            def execute(query: Any, *args: Any, **kwargs: Any) -> Any:
                if isinstance(query, bytes) and query.endswith(b"COMMIT"):
                    conn.execute = original
                    raise psycopg.OperationalError("server closed the connection")
                return original(query, *args, **kwargs)

            conn.execute = execute
            view.put(M, b"a", b"1")

        with pytest.raises(StoreUnavailable, match="did not commit it") as caught:
            store.apply(lose_commit)
        assert _answer(caught.value)[0] == 503
        assert store.get(M, b"a") is None
    finally:
        store.close()


def test_postgresql_out_of_disk_is_store_full(postgres_url: str) -> None:
    # SQLSTATE 53100 (a table or index file could not grow) was a 500: it is the
    # store without room, as LMDB's full map, a retriable 503 StoreFull.
    url = fresh_database(postgres_url)
    store = PostgresStore(url, readers=1)
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(
                "CREATE FUNCTION full_disk() RETURNS trigger LANGUAGE plpgsql AS $$ "
                "BEGIN RAISE EXCEPTION 'could not extend file' USING ERRCODE = 'disk_full'; "
                "END $$"
            )
            conn.execute(
                "CREATE TRIGGER full_disk BEFORE INSERT ON tidings_messages "
                "FOR EACH ROW EXECUTE FUNCTION full_disk()"
            )
        with pytest.raises(StoreFull) as caught:
            store.apply(lambda view: view.put(M, b"a", b"1"))
        status, body = _answer(caught.value)
        assert status == 503 and body["type"] == "StoreFull"
        assert store.get(M, b"a") is None
    finally:
        store.close()


def test_a_read_only_postgresql_refuses_writes_with_a_503_until_it_takes_them(
    postgres_url: str,
) -> None:
    # The store URL led to a server that takes no writes (a standby, a primary
    # demoted): a 500 each time, on the same connection, for as long as it lived.
    url = fresh_database(postgres_url)
    database = url.rsplit("/", 1)[1]
    store = PostgresStore(url, readers=1)
    try:
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            conn.execute(f"ALTER DATABASE {database} SET default_transaction_read_only = on")
        _cut_sessions(postgres_url, url)
        with pytest.raises(StoreUnavailable) as caught:
            store.apply(lambda view: view.put(M, b"a", b"1"))
        assert _answer(caught.value)[0] == 503
        assert "read-only" in str(caught.value)
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            conn.execute(f"ALTER DATABASE {database} RESET default_transaction_read_only")
        # The writer let the read-only session go: the next write connects again.
        store.apply(lambda view: view.put(M, b"a", b"1"))
        assert store.get(M, b"a") == b"1"
    finally:
        store.close()


def test_a_server_started_on_a_read_only_postgresql_says_so(
    postgres_url: str, tmp_path: Any
) -> None:
    # It said "cannot reach the PostgreSQL store", which sent the operator looking at
    # the network, not at a URL leading to a standby.
    from tidings.errors import ServiceUnavailable
    from tidings.server.config import ServerConfig
    from tidings.server.services import _open_store

    url = fresh_database(postgres_url)
    database = url.rsplit("/", 1)[1]
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f"ALTER DATABASE {database} SET default_transaction_read_only = on")
    with pytest.raises(ServiceUnavailable, match=r"takes no writes .*standby"):
        _open_store(ServerConfig(store=url, data_dir=tmp_path))


def test_a_write_over_a_postgresql_limit_is_not_a_503_to_retry(postgres_url: str) -> None:
    # SQLSTATE class 54 (a row too large for its index, say) is a psycopg
    # OperationalError too, but each retry meets it again: a 503 would have clients
    # retry it for as long as they are patient.
    url = fresh_database(postgres_url)
    store = PostgresStore(url, readers=1)
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(
                "CREATE FUNCTION too_big() RETURNS trigger LANGUAGE plpgsql AS $$ "
                "BEGIN RAISE EXCEPTION 'index row size exceeds maximum' "
                "USING ERRCODE = 'program_limit_exceeded'; END $$"
            )
            conn.execute(
                "CREATE TRIGGER too_big BEFORE INSERT ON tidings_messages "
                "FOR EACH ROW EXECUTE FUNCTION too_big()"
            )
        with pytest.raises(ServerError) as caught:
            store.apply(lambda view: view.put(M, b"a", b"1"))
        assert _answer(caught.value)[0] == 500
        assert store.get(M, b"a") is None
    finally:
        store.close()


def test_a_write_cancelled_by_statement_timeout_is_a_503_and_stores_nothing(
    postgres_url: str,
) -> None:
    url = fresh_database(postgres_url)
    database = url.rsplit("/", 1)[1]
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f"ALTER DATABASE {database} SET statement_timeout = '200ms'")
    store = PostgresStore(url, readers=1)
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(
                "CREATE FUNCTION slow() RETURNS trigger LANGUAGE plpgsql AS $$ "
                "BEGIN PERFORM pg_sleep(2); RETURN NEW; END $$"
            )
            conn.execute(
                "CREATE TRIGGER slow BEFORE INSERT ON tidings_messages "
                "FOR EACH ROW EXECUTE FUNCTION slow()"
            )

        def both(view: WriteView) -> None:
            view.put("metadata", b"k", b"v")
            view.put(M, b"a", b"1")

        with pytest.raises(StoreUnavailable, match="statement timeout") as caught:
            store.apply(both)
        assert _answer(caught.value)[0] == 503
        assert store.get("metadata", b"k") is None and store.get(M, b"a") is None
    finally:
        store.close()
