"""How the PostgreSQL store's writer learns the outcome of a commit whose answer was
lost, where it must not: the new connection leads to another server (a standby
promoted meanwhile), whose transaction ids and sessions are not the lost commit's.
tests/e2e/test_pg_commit_s29.py loses real commits' answers through a proxy."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import fresh_schema

pytest.importorskip("psycopg")

import psycopg

from tidings.errors import OutcomeUnknown
from tidings.store.backend import WriteView
from tidings.store.backends import postgres
from tidings.store.backends.postgres import PostgresStore

M = "messages"


def _lose_commit(view: WriteView) -> None:
    """Put a row, and have the group's COMMIT fail as a connection lost after it went
    out (it never does: the connection is closed instead, which rolls it back)."""
    conn = view._conn  # type: ignore[attr-defined]
    original = conn.execute

    def execute(query: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(query, bytes) and query.endswith(b"COMMIT"):
            conn.execute = original
            conn.close()
            raise psycopg.OperationalError("server closed the connection unexpectedly")
        return original(query, *args, **kwargs)

    conn.execute = execute
    view.put(M, b"a", b"1")


def test_the_outcome_is_not_asked_of_another_server(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = PostgresStore(fresh_schema(postgres_url), readers=1, connect_timeout=2)
    try:
        assert store._writer_server is not None  # read from the server itself
        monkeypatch.setattr(postgres, "_server_of", lambda conn: "another-cluster/00000002")
        with pytest.raises(OutcomeUnknown, match="may or may not"):
            store.apply(_lose_commit)
        assert store.get(M, b"a") is None  # closed before it was sent: not committed
        store.apply(lambda view: view.put(M, b"b", b"2"))  # and the writer goes on
        assert store.get(M, b"b") == b"2"
    finally:
        store.close()


def test_the_same_server_after_a_reconnection_is_asked(postgres_url: str) -> None:
    store = PostgresStore(fresh_schema(postgres_url), readers=1, connect_timeout=2)
    try:
        from tidings.errors import StoreUnavailable

        with pytest.raises(StoreUnavailable, match="did not commit it"):
            store.apply(_lose_commit)
        assert store.get(M, b"a") is None
    finally:
        store.close()


def _restarted(monkeypatch: pytest.MonkeyPatch, store: PostgresStore) -> None:
    """Have the writer's next connection lead to the same cluster and timeline, started
    again since the COMMIT went out (a crash or an immediate shutdown and a restart)."""
    assert store._writer_server is not None
    cluster = store._writer_server.rsplit("/", 1)[0]
    monkeypatch.setattr(postgres, "_server_of", lambda conn: f"{cluster}/started again")


def _lose_commit_of(xid: str) -> Any:
    def write(view: WriteView) -> None:
        _lose_commit(view)
        view.xid = xid  # type: ignore[attr-defined]

    return write


def test_after_a_restart_an_id_in_the_future_is_a_commit_that_was_lost(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A COMMIT not yet durable at a crash leaves nothing: the restarted server hands
    # its id out again later. Asked before that, PostgreSQL says the id is in the future.
    from tidings.errors import StoreUnavailable

    store = PostgresStore(fresh_schema(postgres_url), readers=1, connect_timeout=2)
    try:
        _restarted(monkeypatch, store)
        with pytest.raises(StoreUnavailable, match="did not commit it"):
            store.apply(_lose_commit_of(str(10**15)))
        store.apply(lambda view: view.put(M, b"b", b"2"))  # and the writer goes on
        assert store.get(M, b"b") == b"2"
    finally:
        store.close()


def test_after_a_restart_a_committed_id_may_be_another_transactions(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Handed out again after the restart, the lost commit's id may belong to a
    # transaction that committed since: "committed" then says nothing of the lost one.
    store = PostgresStore(fresh_schema(postgres_url), readers=1, connect_timeout=2)
    try:
        with psycopg.connect(postgres_url, autocommit=True) as other:
            row = other.execute("SELECT pg_current_xact_id()::text").fetchone()
        assert row is not None  # a transaction of its own, committed
        _restarted(monkeypatch, store)
        with pytest.raises(OutcomeUnknown, match="may or may not"):
            store.apply(_lose_commit_of(str(row[0])))
        assert store.get(M, b"a") is None
    finally:
        store.close()


def test_after_a_restart_an_aborted_id_is_not_committed(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tidings.errors import StoreUnavailable

    store = PostgresStore(fresh_schema(postgres_url), readers=1, connect_timeout=2)
    try:
        _restarted(monkeypatch, store)
        # The lost commit's own id: the connection closed before it was sent, so it
        # rolled back.
        with pytest.raises(StoreUnavailable, match="did not commit it"):
            store.apply(_lose_commit)
    finally:
        store.close()
