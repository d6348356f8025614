"""What only the PostgreSQL store does: its sessions plan along the key, and a group
commit costs a few round trips (the contract itself is tests/test_store.py)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import fresh_schema
from tidings.store import WriteView

pytest.importorskip("psycopg")

from tidings.store.backends.postgres import PostgresStore

PAGE_SCAN = (
    "EXPLAIN SELECT key, value FROM tidings_messages WHERE key >= %s AND key < %s "
    "ORDER BY key LIMIT %s"
)


def test_a_page_of_a_fresh_table_is_read_along_the_key(postgres_url: str) -> None:
    # 20,000 rows written at once and never analysed: left to its statistics,
    # PostgreSQL read each page of 1,000 as a bitmap scan of the whole range and a sort.
    store = PostgresStore(fresh_schema(postgres_url))
    try:
        rows = [(i.to_bytes(8, "big"), b"x" * 100) for i in range(20_000)]
        store.submit(lambda view: view.put_many("messages", rows, append=True)).result()

        def plan(view: Any) -> str:
            cur = view._conn.execute(PAGE_SCAN, (b"", b"\xff" * 9, 1000))
            return "\n".join(row[0] for row in cur.fetchall())

        with store.read() as view:
            read_plan = plan(view)
        write_plan = store.submit(lambda view: plan(view)).result()
        for found in (read_plan, write_plan):
            assert "Index Scan using tidings_messages_pkey" in found, found
            assert "Sort" not in found and "Bitmap" not in found, found
        assert [k for k, _ in store.scan_list("messages", b"", b"\xff" * 9)] == [k for k, _ in rows]
    finally:
        store.close()


def test_a_group_of_publish_shaped_writes_takes_four_round_trips(postgres_url: str) -> None:
    # BEGIN with the range probe, the COPY (two), the rest with the COMMIT: counted as
    # the statements the writer's session sends (COPY's data is not one).
    store = PostgresStore(fresh_schema(postgres_url))
    try:
        store.submit(lambda view: view.put("metadata", b"state", b"0")).result()
        store.submit(lambda view: view.get("metadata", b"state")).result()  # remembered
        sent: list[bytes] = []

        def publish(view: WriteView) -> None:
            assert view.get("metadata", b"state") == b"0"  # from memory: no query
            view.put_many("messages", [(b"m%05d" % i, b"x") for i in range(500)], append=True)
            view.put("metadata", b"state", b"1")

        def count(view: Any) -> None:
            conn = view._conn
            original = conn.execute

            def execute(query: Any, *args: Any, **kwargs: Any) -> Any:
                sent.append(query if isinstance(query, bytes) else query.as_bytes(conn))
                return original(query, *args, **kwargs)

            conn.execute = execute
            store._restore = lambda: setattr(conn, "execute", original)  # type: ignore[attr-defined]

        store.submit(count).result()
        try:
            store.submit(publish).result()
        finally:
            store._restore()  # type: ignore[attr-defined]
        # One statement string opening the transaction with the probe, one closing it
        # with the COMMIT; the COPY goes through its own cursor.
        assert len(sent) == 2, sent
        assert sent[0].startswith(b"BEGIN") and b"SELECT 1 FROM" in sent[0]
        assert sent[1].endswith(b"COMMIT") and b"INSERT INTO" in sent[1]
        assert store.get("metadata", b"state") == b"1"
        assert len(store.scan_list("messages", b"m", b"n")) == 500
    finally:
        store.close()
