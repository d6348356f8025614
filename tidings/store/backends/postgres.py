"""The store on PostgreSQL (>= 15), with psycopg 3 and psycopg-pool (docs/storage.md).

Each table of :data:`~tidings.store.backend.TABLES` is a PostgreSQL table
``tidings_<name> (key bytea primary key, value bytea)``: ``bytea`` compares byte-wise,
so a B-tree range scan is the ordered scan the store interface promises. Tidings
creates the tables on start and records the schema version in ``tidings_schema``; a
database written by a newer Tidings is refused.

Reads run in ``REPEATABLE READ READ ONLY`` transactions on pooled connections: one
snapshot per ``read()``. Writes go through one writer thread with a connection of its
own, which runs every write function submitted meanwhile in one transaction, each
inside a savepoint (a function that raises loses only its own writes), and commits
once: group commit, durable with PostgreSQL's default ``synchronous_commit = on``.
Scans page through the range with keyset queries, so an iterator stopped early reads
little. Acknowledged means committed in PostgreSQL.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from typing import Any, TypeVar

import psycopg
from psycopg import sql
from psycopg_pool import ConnectionPool

from tidings.errors import ServerError
from tidings.store.backend import TABLES, ReadView, Store, WriteView, check_table

__all__ = ["SCHEMA_VERSION", "PostgresStore"]

T = TypeVar("T")
_log = logging.getLogger(__name__)

#: The schema this code writes and reads (``tidings_schema.version``).
SCHEMA_VERSION = 1
#: Rows one scan query fetches; an iterator asks for the next page when it needs it.
_PAGE = 1000
#: Most write functions one group commit holds.
_GROUP = 256


def _name(table: str) -> sql.Identifier:
    check_table(table)
    return sql.Identifier(f"tidings_{table}")


class _View:
    """Reads over one connection inside one transaction."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self._conn = conn

    def get(self, table: str, key: bytes) -> bytes | None:
        row = self._conn.execute(
            sql.SQL("SELECT value FROM {} WHERE key = %s").format(_name(table)), (key,)
        ).fetchone()
        return None if row is None else bytes(row[0])

    def scan(
        self, table: str, start: bytes, stop: bytes, limit: int | None = None
    ) -> Iterator[tuple[bytes, bytes]]:
        query = sql.SQL(
            "SELECT key, value FROM {} WHERE key >= %s AND key < %s ORDER BY key LIMIT %s"
        ).format(_name(table))
        left = limit
        while left is None or left > 0:
            page = min(_PAGE, left) if left is not None else _PAGE
            rows = self._conn.execute(query, (start, stop, page)).fetchall()
            for key, value in rows:
                yield bytes(key), bytes(value)
            if len(rows) < page:
                return
            if left is not None:
                left -= len(rows)
            # Keys are bytes: the first key after k is k + b"\0".
            start = bytes(rows[-1][0]) + b"\0"

    def last_below(
        self, table: str, bound: bytes, floor: bytes = b""
    ) -> tuple[bytes, bytes] | None:
        row = self._conn.execute(
            sql.SQL(
                "SELECT key, value FROM {} WHERE key < %s AND key >= %s ORDER BY key DESC LIMIT 1"
            ).format(_name(table)),
            (bound, floor),
        ).fetchone()
        return None if row is None else (bytes(row[0]), bytes(row[1]))


class _WriteView(_View):
    def put(self, table: str, key: bytes, value: bytes) -> None:
        self._conn.execute(
            sql.SQL(
                "INSERT INTO {} (key, value) VALUES (%s, %s) "
                "ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value"
            ).format(_name(table)),
            (key, value),
        )

    def delete(self, table: str, key: bytes) -> bool:
        cur = self._conn.execute(
            sql.SQL("DELETE FROM {} WHERE key = %s").format(_name(table)), (key,)
        )
        return cur.rowcount > 0

    def delete_range(self, table: str, start: bytes, stop: bytes, limit: int | None = None) -> int:
        if limit is None:
            cur = self._conn.execute(
                sql.SQL("DELETE FROM {} WHERE key >= %s AND key < %s").format(_name(table)),
                (start, stop),
            )
        else:
            cur = self._conn.execute(
                sql.SQL(
                    "DELETE FROM {0} WHERE key IN (SELECT key FROM {0} WHERE key >= %s "
                    "AND key < %s ORDER BY key LIMIT %s)"
                ).format(_name(table)),
                (start, stop, limit),
            )
        return cur.rowcount

    def put_many(
        self, table: str, items: Iterable[tuple[bytes, bytes]], *, append: bool = False
    ) -> None:
        # One statement for the batch (a publish of 500 messages is one round trip); a
        # key given twice would make ON CONFLICT fail, and the later one wins anyway.
        rows = dict(items)
        if not rows:
            return
        self._conn.execute(
            sql.SQL(
                "INSERT INTO {} (key, value) SELECT * FROM unnest(%s::bytea[], %s::bytea[]) "
                "ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value"
            ).format(_name(table)),
            (list(rows), list(rows.values())),
        )


class PostgresStore(Store):
    """:class:`~tidings.store.backend.Store` on a PostgreSQL database (``url``: a
    ``postgresql://`` connection string)."""

    def __init__(self, url: str, *, readers: int = 8, connect_timeout: float = 10.0) -> None:
        self.url = url
        self._writer_conn = psycopg.connect(url, autocommit=True, connect_timeout=10)
        try:
            _migrate(self._writer_conn)
        except BaseException:
            self._writer_conn.close()
            raise
        self._writer_conn.autocommit = False
        self._pool = ConnectionPool(
            url,
            min_size=1,
            max_size=readers,
            kwargs={"autocommit": False},
            timeout=connect_timeout,
            open=True,
        )
        self._queue: queue.SimpleQueue[tuple[Callable[[WriteView], Any], Future[Any]] | None] = (
            queue.SimpleQueue()
        )
        self._closed = False
        self._lock = threading.Lock()
        self._commits = 0
        self._thread = threading.Thread(target=self._write_loop, name="tidings-pg-writer")
        self._thread.start()

    @property
    def commits(self) -> int:
        """Write transactions committed (one per group of write functions)."""
        return self._commits

    @contextlib.contextmanager
    def _reading(self) -> Iterator[ReadView]:
        with self._pool.connection() as conn:
            conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            # The snapshot is taken at the first statement, not at BEGIN: take it now,
            # so the view shows the store as of read(), as the interface promises.
            conn.execute("SELECT 1")
            try:
                yield _View(conn)
            finally:
                conn.rollback()  # read only: nothing to keep

    def read(self) -> contextlib.AbstractContextManager[ReadView]:
        return self._reading()

    def submit(self, fn: Callable[[WriteView], T]) -> Future[T]:
        future: Future[T] = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError("store is closed")
            self._queue.put((fn, future))
        return future

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._queue.put(None)
        self._thread.join()
        self._pool.close()
        self._writer_conn.close()

    def _write_loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            group = [item]
            stop = False
            while len(group) < _GROUP:
                try:
                    more = self._queue.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    stop = True
                    break
                group.append(more)
            self._commit_group(group)
            if stop:
                return

    def _commit_group(self, group: list[tuple[Callable[[WriteView], Any], Future[Any]]]) -> None:
        conn = self._writer_conn
        view = _WriteView(conn)
        outcomes: list[tuple[bool, Any]] = []
        try:
            for fn, _ in group:
                conn.execute("SAVEPOINT fn")
                try:
                    result = fn(view)
                except BaseException as exc:
                    conn.execute("ROLLBACK TO SAVEPOINT fn")
                    outcomes.append((False, exc))
                else:
                    conn.execute("RELEASE SAVEPOINT fn")
                    outcomes.append((True, result))
            conn.commit()
            self._commits += 1
        except Exception as exc:
            with contextlib.suppress(Exception):
                conn.rollback()
            _log.error("store commit failed", exc_info=exc, extra={"event": "error"})
            error = ServerError(f"the store could not commit: {type(exc).__name__}: {exc}")
            for _, future in group:
                future.set_exception(error)
            self._reconnect_if_broken()
            return
        for (_, future), (ok, value) in zip(group, outcomes, strict=True):
            if ok:
                future.set_result(value)
            else:
                future.set_exception(value)

    def _reconnect_if_broken(self) -> None:
        # PostgreSQL restarted, say: the next group gets a fresh connection; callers
        # got a retriable ServerError meanwhile.
        if not self._writer_conn.closed and not self._writer_conn.broken:
            return
        with contextlib.suppress(Exception):
            self._writer_conn.close()
        try:
            self._writer_conn = psycopg.connect(self.url, autocommit=False, connect_timeout=10)
        except psycopg.Error as exc:
            _log.error(f"cannot reconnect to the store: {exc}", extra={"event": "error"})


def _migrate(conn: psycopg.Connection[Any]) -> None:
    """Create the tables (once) and check the schema version."""
    with conn.transaction():
        # One starting server at a time creates the schema.
        conn.execute("SELECT pg_advisory_xact_lock(8470)")
        conn.execute("CREATE TABLE IF NOT EXISTS tidings_schema (version integer NOT NULL)")
        row = conn.execute("SELECT max(version) FROM tidings_schema").fetchone()
        version = row[0] if row is not None else None
        if version is not None and version > SCHEMA_VERSION:
            raise ServerError(
                f"the database holds Tidings schema {version}; this Tidings knows "
                f"{SCHEMA_VERSION} at most: upgrade Tidings"
            )
        for table in TABLES:
            conn.execute(
                sql.SQL(
                    "CREATE TABLE IF NOT EXISTS {} (key bytea PRIMARY KEY, value bytea NOT NULL)"
                ).format(_name(table))
            )
        if version is None:
            conn.execute("INSERT INTO tidings_schema (version) VALUES (%s)", (SCHEMA_VERSION,))
