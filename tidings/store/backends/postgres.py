"""The store on PostgreSQL (>= 15), with psycopg 3 and psycopg-pool (docs/storage.md).

Each table of :data:`~tidings.store.backend.TABLES` is a PostgreSQL table
``tidings_<name> (key bytea primary key, value bytea)``: ``bytea`` compares byte-wise,
so a B-tree range scan is the ordered scan the store interface promises. Tidings
creates the tables on start and records the schema version in ``tidings_schema``; a
database written by a newer Tidings is refused.

Reads run in ``REPEATABLE READ READ ONLY`` transactions on pooled connections: one
snapshot per ``read()``. Writes go through one writer thread with a connection of its
own, which runs every write function submitted meanwhile, keeps their writes in
memory (a function that raises loses only its own), sends them in one transaction in
a few round trips, and commits once: group commit, durable with PostgreSQL's default
``synchronous_commit = on``.
Scans page through the range with keyset queries, so an iterator stopped early reads
little. Acknowledged means committed in PostgreSQL. A ``COMMIT`` whose answer is
lost is not left in doubt where PostgreSQL can say how it ended
(:meth:`PostgresStore._outcome`).

Every connection has TCP keepalives and ``tcp_user_timeout`` (``tcp_timeout``, as the
leader lease's connections: :func:`tidings.cluster.lease.tcp_options`): a read or a
write on a connection whose network path was cut without a reset fails within about
that long, instead of holding its thread (and, for the writer, every write of the
process) until the operating system gives up, many minutes later.
"""

from __future__ import annotations

import contextlib
import logging
import math
import queue
import select
import struct
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Future
from typing import Any, TypeVar

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg_pool import ConnectionPool, PoolTimeout

from tidings.errors import (
    LeaseLost,
    OutcomeUnknown,
    ServerError,
    StoreFull,
    StoreUnavailable,
    TidingsError,
)
from tidings.store.backend import TABLES, ReadView, Store, WriteView, check_table

__all__ = ["SCHEMA_VERSION", "TCP_TIMEOUT", "PostgresStore"]

T = TypeVar("T")
_log = logging.getLogger(__name__)

#: The schema this code writes and reads (``tidings_schema.version``).
SCHEMA_VERSION = 1
#: Rows one scan query fetches; an iterator asks for the next page when it needs it.
_PAGE = 1000
#: Most write functions one group commit holds.
_GROUP = 256
#: Most committed values the writer keeps for its reads, per table (then it starts
#: that table afresh).
_KNOWN = 65_536
#: Committed values the writer read or wrote, by table and key (PostgresStore._known).
_Known = dict[str, dict[bytes, bytes | None]]
#: Most bytes of keys and values a group's last writes may hold to go as SQL text
#: with its COMMIT (beyond it, binary parameters are cheaper than hex text).
_INLINE_BYTES = 64 << 10
#: How long a connection whose network path is cut may go unnoticed, by default
#: (seconds; the server passes its ``lease_seconds``): :func:`_with_tcp_options`.
TCP_TIMEOUT = 30.0
#: What a write refused by the leader fence tells its caller.
_LEASE_LOST = "this instance no longer holds the leader lease; retry elsewhere"
#: The group's transaction id (``xid8``), asked for before its ``COMMIT`` goes out: where
#: the answer to the ``COMMIT`` is lost, ``pg_xact_status`` of it says whether it
#: committed. The second form assigns none to a transaction that wrote nothing.
_XID = b"SELECT pg_current_xact_id()"
_XID_IF_ASSIGNED = b"SELECT pg_current_xact_id_if_assigned()"


class _ReadFailed(StoreUnavailable, psycopg.OperationalError):
    """A read that PostgreSQL could not serve (unreachable, the connection lost, the
    read pool busy) as a :class:`~tidings.errors.StoreUnavailable`, so the server
    answers a retriable 503, not a 500; still a ``psycopg.OperationalError``, so
    callers that catch that still do."""

    def to_json(self) -> dict[str, str]:
        return {"error": self.message, "type": StoreUnavailable.__name__}


def _reason(exc: BaseException) -> str:
    """``exc``'s message on one line (libpq's span several)."""
    return " ".join(str(exc).split()) or type(exc).__name__


def _passing(exc: BaseException) -> bool:
    """Whether ``exc`` is a failure that the same work may not meet again: the
    connection lost or refused, a statement cancelled, a lock or serialization
    conflict, PostgreSQL short of memory or connections (psycopg's
    ``OperationalError``), but not a program limit (SQLSTATE class 54: a row too large
    for its index), which every retry would meet."""
    return isinstance(exc, psycopg.OperationalError) and not isinstance(
        exc, psycopg.errors.ProgramLimitExceeded
    )


def _write_error(exc: BaseException, commit_sent: bool) -> TidingsError:
    """What the callers of a group whose transaction failed with ``exc`` get.

    Nothing of the group was stored, except where the connection was lost with its
    ``COMMIT`` sent and unanswered: the writer then asks PostgreSQL how that
    transaction ended (:meth:`PostgresStore._outcome`), and this is not called for it
    unless the answer was "not committed". An error PostgreSQL answered (it has a
    SQLSTATE) ended the transaction without committing it."""
    reason = _reason(exc)
    if isinstance(exc, psycopg.errors.DiskFull):
        # 53100: PostgreSQL could not extend a table or index file, as LMDB's full
        # map: room comes back as the cleaner deletes expired messages.
        return StoreFull(f"the PostgreSQL store has no room for the write: {reason}")
    if isinstance(exc, psycopg.errors.ReadOnlySqlTransaction):
        return StoreUnavailable(
            f"the PostgreSQL store refused the write (a read-only server, a standby?): "
            f"{reason}; nothing was written"
        )
    if _passing(exc) and not (commit_sent and getattr(exc, "sqlstate", None) is None):
        return StoreUnavailable(
            f"the PostgreSQL store could not be written: {reason}; nothing was written"
        )
    return ServerError(f"the store could not commit: {type(exc).__name__}: {exc}")


def _name(table: str) -> sql.Identifier:
    check_table(table)
    return sql.Identifier(f"tidings_{table}")


class _View:
    """Reads over one connection inside one transaction.

    Results come in binary: a ``bytea`` as its bytes, not as hex text to be parsed
    (about a fifth less of the reader's CPU per row of 100 bytes, measured here)."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self._conn = conn

    def get(self, table: str, key: bytes) -> bytes | None:
        row = self._conn.execute(
            sql.SQL("SELECT value FROM {} WHERE key = %s").format(_name(table)),
            (key,),
            binary=True,
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
            rows = self._conn.execute(query, (start, stop, page), binary=True).fetchall()
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
            binary=True,
        ).fetchone()
        return None if row is None else (bytes(row[0]), bytes(row[1]))


class _Changes:
    """Buffered writes per table: ``plain`` maps a key to its value (None: deleted);
    ``new`` holds the keys written with ``put_many(append=True)`` (keys the writer
    believes are new) and their values. A key is in one of the two at most: the later
    write moves it.

    Per table, so that a publish's entries go in with one ``dict.update`` and out as
    they are (a tuple per key and a set of them cost the writer ~1.5 us per message).
    Keys and values are kept as the callers give them: bytes (or read-only buffers).
    """

    __slots__ = ("new", "plain")

    def __init__(self) -> None:
        self.plain: dict[str, dict[bytes, bytes | None]] = {}
        self.new: dict[str, dict[bytes, bytes]] = {}

    def __bool__(self) -> bool:
        return any(self.plain.values()) or any(self.new.values())

    def find(self, table: str, key: bytes) -> tuple[bool, bytes | None]:
        """(True, value) where ``key`` is buffered (value None: deleted), else (False,
        None)."""
        plain = self.plain.get(table)
        if plain is not None and key in plain:
            return True, plain[key]
        new = self.new.get(table)
        if new is not None and key in new:
            return True, new[key]
        return False, None

    def put(self, table: str, key: bytes, value: bytes | None) -> None:
        self.plain.setdefault(table, {})[key] = value
        new = self.new.get(table)
        if new:
            new.pop(key, None)

    def put_new(self, table: str, items: list[tuple[bytes, bytes]]) -> None:
        new = self.new.setdefault(table, {})
        plain = self.plain.get(table)
        if not plain:
            try:
                new.update(items)
                return
            except TypeError:  # an unhashable key (a bytearray): as bytes, below
                pass
        for key, value in items:
            key = bytes(key)
            new[key] = bytes(value)
            if plain:
                plain.pop(key, None)

    def absorb(self, other: _Changes) -> None:
        """Take ``other``'s writes, which came later."""
        for table, plain in other.plain.items():
            if plain:
                self.put_many(table, plain)
        for table, new in other.new.items():
            if new:
                mine = self.plain.get(table)
                if mine:
                    for key in new:
                        mine.pop(key, None)
                self.new.setdefault(table, {}).update(new)

    def put_many(self, table: str, values: dict[bytes, bytes | None]) -> None:
        """Plain writes of every ``key: value``."""
        self.plain.setdefault(table, {}).update(values)
        new = self.new.get(table)
        if new:
            for key in values:
                new.pop(key, None)


class _WriteView(_View):
    """The view of one group commit's write functions, with their writes buffered.

    A write function's ``put``s are kept in memory (``_mine``) and become the group's
    (``_group``) when it returns; a ``get`` looks there first. Everything buffered goes
    to PostgreSQL in a few statements per table (:func:`_write`), before anything that
    must see it in SQL (a scan, a range delete) and at the commit. So a group of
    publishes costs a few statements instead of a round trip per key, and a function
    that raises is undone by dropping its buffer; only one that had to flush its own
    writes first gets a savepoint to roll back to.
    """

    def __init__(
        self,
        conn: psycopg.Connection[Any],
        known: _Known,
        opening: bytes = b"BEGIN",
        fenced_by: bool = False,
    ) -> None:
        super().__init__(conn)
        #: What opens the group's transaction: ``BEGIN``, and with ``fenced_by`` the
        #: fence's query after it, as one statement string (PostgresStore.fence).
        self._opening = opening
        self._fenced_by = fenced_by
        #: The transaction has begun (before that, reads run on their own, as reads
        #: of committed values by the store's only writer).
        self.begun = False
        #: The fence found the lease gone: the transaction was rolled back.
        self.fenced = False
        self._group = _Changes()
        self._mine = _Changes()
        self._savepoint = False
        # Committed values read before (PostgresStore._known); see get().
        self._known = known
        #: Whether some of the group's writes went to PostgreSQL before its end: reads
        #: may then see them uncommitted, so none is remembered.
        self.flushed = False
        #: What the last finish() wrote.
        self.written = _Changes()
        #: The group's ``COMMIT`` went out: a connection lost now leaves its outcome
        #: unknown.
        self.commit_sent = False
        #: The transaction's id (``xid8``, as text), once asked for: None while not
        #: asked, or where the transaction wrote nothing (it then has none).
        self.xid: str | None = None
        #: The server process of the session the ``COMMIT`` went out on.
        self.backend_pid = 0

    # -- the protocol --------------------------------------------------------------------

    def get(self, table: str, key: bytes) -> bytes | None:
        check_table(table)
        key = bytes(key)
        found, value = self._mine.find(table, key)
        if not found:
            found, value = self._group.find(table, key)
        if found:
            return None if value is None else bytes(value)
        # This connection is the store's only writer (fenced by the leader lease, and
        # the process exits when it loses it), so a value it read or committed stays
        # the committed one: a publish's read of its topic's state is a round trip
        # only the first time (BENCHMARKS.md, "The PostgreSQL store's writer").
        # Not once the group flushed writes of its own: PostgreSQL then holds values
        # newer than the committed ones (a put, a scan that flushed it, then a get of
        # the key returned the committed value instead of the one just written).
        known = self._known.get(table)
        if not self.flushed and known is not None and key in known:
            return known[key]
        value = super().get(table, key)
        if not self.flushed:
            if known is None:
                known = self._known[table] = {}
            elif len(known) >= _KNOWN:
                known.clear()
            known[key] = value
        return value

    def scan(
        self, table: str, start: bytes, stop: bytes, limit: int | None = None
    ) -> Iterator[tuple[bytes, bytes]]:
        self._flush()
        return super().scan(table, start, stop, limit)

    def last_below(
        self, table: str, bound: bytes, floor: bytes = b""
    ) -> tuple[bytes, bytes] | None:
        self._flush()
        return super().last_below(table, bound, floor)

    def put(self, table: str, key: bytes, value: bytes) -> None:
        check_table(table)
        self._mine.put(table, bytes(key), bytes(value))

    def put_many(
        self, table: str, items: Iterable[tuple[bytes, bytes]], *, append: bool = False
    ) -> None:
        check_table(table)
        if append:
            self._mine.put_new(table, list(items))
            return
        self._mine.put_many(table, {bytes(key): bytes(value) for key, value in items})

    def delete(self, table: str, key: bytes) -> bool:
        existed = self.get(table, key) is not None
        if existed:
            self._mine.put(table, bytes(key), None)
        return existed

    def delete_range(self, table: str, start: bytes, stop: bytes, limit: int | None = None) -> int:
        if limit is not None and limit <= 0:
            return 0  # as LMDB (PostgreSQL refuses a negative LIMIT)
        self._flush()
        self._known.pop(table, None)  # deleted in SQL, not through the buffers
        name = _quoted(table)
        where = b"key >= " + _bytea(bytes(start)) + b" AND key < " + _bytea(bytes(stop))
        if limit is None:
            statement = b"DELETE FROM " + name + b" WHERE " + where
        else:
            statement = (
                b"DELETE FROM " + name + b" WHERE key IN (SELECT key FROM " + name
                + b" WHERE " + where + b" ORDER BY key LIMIT " + str(int(limit)).encode() + b")"
            )  # fmt: skip
        # Deleted in SQL: a function that raises after it must be able to take it back,
        # even where it had buffered nothing of its own before, so the function's
        # savepoint goes first (in the same round trip, as text).
        if not self._savepoint:
            statement = b"SAVEPOINT fn; " + statement
            self._savepoint = True
        cur = self._conn.execute(statement)
        while cur.nextset():
            pass
        return cur.rowcount

    # -- what the store's writer calls ---------------------------------------------------

    def begin_function(self) -> None:
        """A write function starts: its writes are its own until :meth:`end_function`."""
        self._mine = _Changes()
        self._savepoint = False

    def end_function(self, ok: bool) -> None:
        """The function returned (``ok``) or raised: keep its writes, or undo them."""
        if ok:
            self._group.absorb(self._mine)
            if self._savepoint:
                self._conn.execute("RELEASE SAVEPOINT fn")
        elif self._savepoint:
            self._conn.execute("ROLLBACK TO SAVEPOINT fn")
        self._mine = _Changes()
        self._savepoint = False

    def finish(self) -> None:
        """Write everything the group's functions kept so far (the transaction begun)."""
        _write(self._conn, self._group, self.open(_probes(self._group)))
        self.written = self._group
        self._group = _Changes()

    def commit(self) -> None:
        """Write everything the group's functions kept and commit, in as few round
        trips as it can: the transaction's opening, its fence and the range probes
        of new keys in one; a ``COPY`` per table of new keys; the other writes and
        the ``COMMIT`` in one. A group that wrote nothing has nothing to commit."""
        group = self._group
        if not group and not self.begun:
            return
        # The transaction id, for finding out how the COMMIT ended if its answer is
        # lost; in the same round trip as the opening or the probes where there is one.
        free = self.open(_probes(group), xid=_XID if group else _XID_IF_ASSIGNED)
        self.backend_pid = self._conn.info.backend_pid
        _write(self._conn, group, free, then=b"COMMIT", sending_then=self._sending_commit)
        self.written = group
        self._group = _Changes()

    def open(
        self, probes: Mapping[str, bytes] | None = None, *, xid: bytes | None = None
    ) -> dict[str, bool]:
        """Begin the transaction if it has not begun, checking the fence first, and
        run ``probes`` (a query per table) in the same round trip: the tables whose
        probe found no row. Raises :class:`LeaseLost` where the fence refuses.

        With ``xid`` (:data:`_XID` or :data:`_XID_IF_ASSIGNED`), the transaction's id
        is asked for too, unless known (:attr:`xid`). A fenced opening always asks: the
        fence's row lock gives the transaction an id anyway."""
        if self.fenced:
            raise LeaseLost(_LEASE_LOST)
        probes = probes or {}
        if self._fenced_by and not self.begun:
            xid = _XID
        ask = xid if xid is not None and self.xid is None else None
        parts = [
            *([] if self.begun else [self._opening]),
            *probes.values(),
            *([] if ask is None else [ask]),
        ]
        if not parts:
            return {}
        # Without parameters psycopg sends the text as one simple query: every
        # statement in it costs one round trip together (each costs ~1-2 ms when the
        # cores are busy, as under load; BENCHMARKS.md).
        cur = self._conn.execute(b"; ".join(parts))
        rows: list[Any] = []
        while True:
            if cur.description is not None:
                rows.append(cur.fetchone())
            if not cur.nextset():
                break
        if ask is not None:
            got = rows.pop()
            self.xid = None if got is None or got[0] is None else str(got[0])
        if not self.begun:
            self.begun = True
            if self._fenced_by and rows.pop(0) is None:
                self.fenced = True
                _rollback(self._conn)
                raise LeaseLost(_LEASE_LOST)
        return {table: row is None for table, row in zip(probes, rows, strict=True)}

    def _sending_commit(self) -> None:
        self.commit_sent = True

    def committed(self) -> None:
        """The group committed: what it wrote is now the committed value of each key
        the writer remembers."""
        if self.flushed:
            self._known.clear()
            return
        known = self._known
        if not known:
            return
        for table, plain in self.written.plain.items():
            _remember(known.get(table), plain)
        for table, new in self.written.new.items():
            _remember(known.get(table), new)

    def _flush(self) -> None:
        # The group's writes first: they are not this function's to undo. Then this
        # function's, after a savepoint, so that raising can still take them back.
        # finish() begins the transaction if it has not begun: what follows (the
        # flushed writes, the scan or delete that needs them) runs inside it.
        self.flushed = True
        self.finish()
        if self._mine:
            self._hold_savepoint()
            _write(self._conn, self._mine, self.open(_probes(self._mine)))
            # Flushed: still this function's writes (undone by the savepoint), but
            # nothing to write again at its end.
            self._mine = _Changes()

    def _hold_savepoint(self) -> None:
        # Before the function's first write in SQL (the transaction begun): what it
        # writes there from now on is undone by rolling back to it.
        if not self._savepoint:
            self._conn.execute("SAVEPOINT fn")
            self._savepoint = True


def _remember(
    known: dict[bytes, bytes | None] | None, values: Mapping[bytes, bytes | None]
) -> None:
    """Committed: each of ``values`` that the writer remembers (``known``, of the same
    table) is now as written."""
    if not known:
        return
    # Only keys in both, found in C: a publish writes thousands of keys the writer
    # never read.
    for key in known.keys() & values.keys():
        value = values[key]
        known[key] = None if value is None else bytes(value)


def _write(
    conn: psycopg.Connection[Any],
    changes: _Changes,
    free: Mapping[str, bool],
    then: bytes | None = None,
    sending_then: Callable[[], None] | None = None,
) -> None:
    """Write ``changes`` (the transaction begun): per table, new keys by ``COPY``
    where ``free`` says the table's probe (:func:`_probes`) found none stored in
    their range, else with the rest by one upsert, and deletions by one delete;
    ``then`` (``COMMIT``) right after them, in the same round trip where they are
    small enough to send as text.

    ``COPY`` costs PostgreSQL about half of ``INSERT ... ON CONFLICT`` per row (measured
    here: 21 against 40 ms for 4,000 rows), but fails on a key that exists, hence the
    probe; this connection is the store's only writer, so no key can appear between
    the probe and the ``COPY``. The upsert is always right.
    """
    rest: list[tuple[str, list[bytes], list[bytes], list[bytes]]] = []
    size = 0
    for table in dict.fromkeys([*changes.new, *changes.plain]):
        keys: list[bytes] = []
        values: list[bytes] = []
        gone: list[bytes] = []
        for key, value in changes.plain.get(table, {}).items():
            if value is None:
                gone.append(key)
            else:
                keys.append(key)
                values.append(value)
        new = changes.new.get(table)
        if new:
            if free.get(table, False):
                _copy_rows(conn, table, new.items())
            else:
                keys.extend(new)
                values.extend(new.values())
        if keys or gone:
            rest.append((table, keys, values, gone))
            if then is not None:  # only the COMMIT's string is sized
                size += sum(map(len, keys)) + sum(map(len, values)) + sum(map(len, gone))
    if then is not None and size <= _INLINE_BYTES:
        # A group's usual rest (a few topic states) goes as literals with the COMMIT.
        if sending_then is not None:
            sending_then()
        conn.execute(b"; ".join([*(_inline(*r) for r in rest), then]))
        return
    for table, keys, values, gone in rest:
        if keys:
            conn.execute(
                sql.SQL(
                    "INSERT INTO {} (key, value) SELECT * FROM unnest(%b::bytea[], %b::bytea[]) "
                    "ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value"
                ).format(_name(table)),
                # Binary parameters (%b): psycopg's text form escapes every byte of a
                # bytea array, which took most of the writer's time.
                (keys, values),
            )
        if gone:
            conn.execute(
                sql.SQL("DELETE FROM {} WHERE key = ANY(%b::bytea[])").format(_name(table)),
                (gone,),
            )
    if then is not None:
        if sending_then is not None:
            sending_then()
        conn.execute(then)


def _bytea(value: bytes | memoryview) -> bytes:
    """``value`` as a ``bytea`` expression in SQL text (no backslash, so it reads the
    same whatever ``standard_conforming_strings`` says)."""
    return b"decode('" + value.hex().encode("ascii") + b"', 'hex')"


def _quoted(table: str) -> bytes:
    check_table(table)
    return f'"tidings_{table}"'.encode("ascii")  # table names are lower-case words


def _inline(table: str, keys: list[bytes], values: list[bytes], gone: list[bytes]) -> bytes:
    """The upsert and delete of :func:`_write` as SQL text (literals, no parameters)."""
    out: list[bytes] = []
    if keys:
        rows = b", ".join(
            b"(" + _bytea(k) + b", " + _bytea(v) + b")" for k, v in zip(keys, values, strict=True)
        )
        out.append(
            b"INSERT INTO " + _quoted(table) + b" (key, value) VALUES " + rows
            + b" ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value"
        )  # fmt: skip
    if gone:
        out.append(
            b"DELETE FROM " + _quoted(table) + b" WHERE key IN ("
            + b", ".join(map(_bytea, gone)) + b")"
        )  # fmt: skip
    return b"; ".join(out)


def _probes(changes: _Changes) -> dict[str, bytes]:
    """Per table with new keys in ``changes``: a query for a stored key between the
    lowest and the highest of them (a row: there is one)."""
    out: dict[str, bytes] = {}
    for table, rows in changes.new.items():
        if not rows:
            continue
        try:
            low, high = bytes(min(rows)), bytes(max(rows))  # over the keys, in C
        except TypeError:  # keys that are buffers without an order (memoryview)
            low, high = min(map(bytes, rows)), max(map(bytes, rows))
        out[table] = (
            b"SELECT 1 FROM " + _quoted(table) + b" WHERE key >= " + _bytea(low)
            + b" AND key <= " + _bytea(high) + b" LIMIT 1"
        )  # fmt: skip
    return out


def _rollback(conn: psycopg.Connection[Any]) -> None:
    """End the writer's transaction, if one is open, without keeping anything."""
    if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        conn.execute(b"ROLLBACK")


#: PostgreSQL's binary ``COPY`` stream: its signature, flags and header extension
#: length; each row's field count and first field's length; a field's length; the end.
_COPY_HEADER = b"PGCOPY\n\xff\r\n\x00" + bytes(8)
_COPY_ROW = struct.Struct(">hi")
_COPY_FIELD = struct.Struct(">i")
_COPY_TRAILER = b"\xff\xff"


def _copy_data(rows: Iterable[tuple[bytes, bytes]]) -> bytes:
    """``rows`` as one binary ``COPY`` stream of two ``bytea`` columns.

    Written here rather than row by row through psycopg's ``write_row``, which took
    about twice the writer's CPU per row (BENCHMARKS.md, "The PostgreSQL store's COPY
    written whole")."""
    row, field = _COPY_ROW.pack, _COPY_FIELD.pack
    parts = [_COPY_HEADER]
    add = parts.extend
    for key, value in rows:
        add((row(2, len(key)), key, field(len(value)), value))
    parts.append(_COPY_TRAILER)
    return b"".join(parts)


def _copy_rows(
    conn: psycopg.Connection[Any], table: str, rows: Iterable[tuple[bytes, bytes]]
) -> None:
    """``COPY`` ``rows`` into ``table`` (none of their keys may be stored)."""
    with (
        conn.cursor() as cur,
        cur.copy(
            sql.SQL("COPY {} (key, value) FROM STDIN (FORMAT BINARY)").format(_name(table))
        ) as copy,
    ):
        copy.write(_copy_data(rows))


class PostgresStore(Store):
    """:class:`~tidings.store.backend.Store` on a PostgreSQL database (``url``: a
    ``postgresql://`` connection string).

    ``tcp_timeout`` (seconds; None: the URL's and the system's settings alone) bounds
    how long a connection whose network path was cut goes unnoticed: TCP keepalives
    and ``tcp_user_timeout`` as :func:`tidings.cluster.lease.tcp_options` sets them,
    except those the URL gives.

    ``connect_timeout`` (seconds, whole ones, at least 2: psycopg's rounding) bounds
    the opening of every connection, the writer's and the read pool's, unless the URL
    gives its own ``connect_timeout``. ``read_wait`` is how long a read waits for a
    pooled connection (None: ``connect_timeout``)."""

    def __init__(
        self,
        url: str,
        *,
        readers: int = 8,
        connect_timeout: float = 10.0,
        tcp_timeout: float | None = TCP_TIMEOUT,
        read_wait: float | None = None,
    ) -> None:
        self.url = url
        self._conninfo, connect_timeout = _with_connect_timeout(
            _with_tcp_options(url, tcp_timeout), connect_timeout
        )
        self._connect_timeout = connect_timeout
        self._writer_conn = _connect(self._conninfo, connect_timeout)
        #: The server the writer's connection leads to (_server_of).
        self._writer_server = _server_of(self._writer_conn)
        try:
            _migrate(self._writer_conn)
        except BaseException:
            self._writer_conn.close()
            raise
        # The writer's connection stays in autocommit: each group sends its own BEGIN,
        # in one round trip with the fence and probes (_WriteView.open).
        self._pool = ConnectionPool(
            self._conninfo,
            min_size=1,
            max_size=readers,
            # Autocommit, so that a read sends its BEGIN itself, with the statement
            # that takes the snapshot: one round trip rather than three.
            kwargs={"autocommit": True},
            configure=_plan_by_key,
            timeout=connect_timeout if read_wait is None else read_wait,
            open=True,
        )
        self._queue: queue.SimpleQueue[tuple[Callable[[WriteView], Any], Future[Any]] | None] = (
            queue.SimpleQueue()
        )
        self._closed = False
        self._lock = threading.Lock()
        self._commits = 0
        #: The fence's query with its parameters written in (the writer's to use).
        self._fence: bytes | None = None
        # Committed values the writer read or wrote, by (table, key); the writer's only.
        self._known: _Known = {}
        self._idle_timeout_ms = 0
        self._idle_set_on: psycopg.Connection[Any] | None = None
        self._thread = threading.Thread(target=self._write_loop, name="tidings-pg-writer")
        self._thread.start()

    @property
    def commits(self) -> int:
        """Write transactions committed (one per group of write functions)."""
        return self._commits

    @property
    def reads_block(self) -> bool:
        """True: every read is at least one round trip to PostgreSQL, on a connection
        that may first have to be waited for from the pool."""
        return True

    def fence(self, statement: str, params: tuple[object, ...], *, idle_timeout: float) -> None:
        """Run ``statement`` first in every later write transaction; where it returns no
        row, the transaction is rolled back and its writes fail with
        :class:`~tidings.errors.LeaseLost`. The leader lease
        (:mod:`tidings.cluster.lease`) fences this instance's writes by its epoch this
        way. ``idle_timeout`` (seconds) bounds how long the writer's session may sit
        inside a transaction without a statement: a process stopped mid-write then
        loses its transaction, and the locks the fence took, to the database."""
        self._idle_timeout_ms = max(1, round(idle_timeout * 1000))

        def install(view: WriteView) -> None:
            # In the writer's thread, on its connection: the fence as text (it goes in
            # one simple query with the BEGIN), and nothing remembered from before:
            # another instance may have written since (a new lease, a new epoch).
            cursor = psycopg.ClientCursor(self._writer_conn)
            self._fence = cursor.mogrify(statement, params).encode()
            self._known.clear()

        self.submit(install).result()

    @contextlib.contextmanager
    def _reading(self) -> Iterator[ReadView]:
        conn = self._snapshot()
        try:
            yield _View(conn)
        except psycopg.OperationalError as exc:
            if isinstance(exc, StoreUnavailable) or not _passing(exc):
                raise
            # PostgreSQL restarted or cut the connection mid-read, or cancelled the
            # statement (statement_timeout): nothing was changed, the read may go again.
            raise _ReadFailed(f"the PostgreSQL store could not be read: {_reason(exc)}") from exc
        finally:
            try:
                if not conn.broken:  # a broken one has no transaction to end
                    with contextlib.suppress(psycopg.Error):
                        _rollback(conn)  # read only: nothing to keep
            finally:
                self._pool.putconn(conn)

    def _snapshot(self) -> psycopg.Connection[Any]:
        """A pooled connection inside a new read-only snapshot.

        A pooled connection may have died while idle (PostgreSQL restarted, an idle
        session was cut): nothing says so until it is used. Where its ``BEGIN`` finds
        it broken, nothing was read yet, so the read takes another connection (the
        pool drops the dead one) instead of failing: every idle connection of the
        pool may be dead at once."""
        for attempt in range(self._pool.max_size + 1):
            try:
                conn = self._pool.getconn()
            except PoolTimeout as exc:
                # Every connection busy with other reads (or none could be opened:
                # PostgreSQL unreachable) for the pool's whole timeout: a 500 said
                # nothing of either, and the read may go again.
                raise _ReadFailed(
                    f"no connection of the PostgreSQL store's read pool "
                    f"({self._pool.max_size} connections) came free within "
                    f"{self._pool.timeout:g} s: all busy with other reads, or PostgreSQL "
                    f"cannot be reached ({_reason(exc)})"
                ) from exc
            try:
                # The snapshot is taken at the first statement, not at BEGIN: take it
                # now, so the view shows the store as of read(), as the interface
                # promises.
                conn.execute(b"BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; SELECT 1")
            except psycopg.OperationalError as exc:
                self._pool.putconn(conn)
                if not _passing(exc):
                    raise
                if not conn.broken or attempt == self._pool.max_size:
                    raise _ReadFailed(
                        f"the PostgreSQL store could not be read: {_reason(exc)}"
                    ) from exc
                continue
            except BaseException:
                self._pool.putconn(conn)
                raise
            return conn
        raise AssertionError("unreachable")  # the loop returns or raises

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
        # A group may fail on a connection that is gone without a statement of its own
        # noticing (a read-only group); the next one starts on a new connection.
        self._reconnect_if_broken()
        conn = self._writer_conn
        server = self._writer_server
        fence = self._fence
        outcomes: list[tuple[bool, Any]] = []
        view: _WriteView | None = None
        try:
            if fence is None:
                view = _WriteView(conn, self._known)
            else:
                self._set_idle_timeout(conn)
                view = _WriteView(conn, self._known, b"BEGIN; " + fence, fenced_by=True)
            for fn, _ in group:
                view.begin_function()
                try:
                    result = fn(view)
                except psycopg.OperationalError:
                    # The connection failed under a read of the function (PostgreSQL
                    # restarted, say): the whole group fails, retriably, and the next
                    # gets a new connection.
                    raise
                except BaseException as exc:
                    view.end_function(False)
                    outcomes.append((False, exc))
                else:
                    view.end_function(True)
                    outcomes.append((True, result))
            view.commit()
        except Exception as exc:
            # Whatever was written or read, nothing of it is known to be committed.
            self._known.clear()
            with contextlib.suppress(Exception):
                _rollback(conn)
            if view is not None and view.fenced:
                self._fenced(group)
                return
            _log.error("store commit failed", exc_info=exc, extra={"event": "error"})
            error: TidingsError
            if view is not None and _unanswered(exc, view.commit_sent):
                outcome = self._outcome(view, server)
                if outcome == "committed":
                    _log.warning(
                        "the store's commit went unanswered, and PostgreSQL says it "
                        "committed: the writes are acknowledged",
                        extra={"event": "error"},
                    )
                    self._commits += 1
                    self._settle(group, outcomes)
                    return
                if outcome is None:
                    error = OutcomeUnknown(
                        f"the PostgreSQL store's connection was lost after the write's "
                        f"COMMIT was sent ({_reason(exc)}), and whether it committed could "
                        f"not be found out within {self._connect_timeout:g} s: the write "
                        f"may or may not have been made"
                    )
                else:
                    error = StoreUnavailable(
                        f"the PostgreSQL store's connection was lost while the write "
                        f"committed ({_reason(exc)}), and PostgreSQL did not commit it: "
                        f"nothing was written"
                    )
            else:
                error = _write_error(exc, view is not None and view.commit_sent)
            for _, future in group:
                future.set_exception(error)
            if isinstance(exc, psycopg.errors.ReadOnlySqlTransaction):
                # The URL led to a standby (or the server was demoted): the next
                # group connects again, when it comes, which finds the primary once
                # there is one (the URL's hosts, target_session_attrs=read-write).
                with contextlib.suppress(Exception):
                    conn.close()
                return
            self._reconnect_if_broken()
            return
        if view.fenced:  # a function met the refusal and did not let it out
            self._known.clear()
            self._fenced(group)
            return
        self._commits += 1
        view.committed()
        self._settle(group, outcomes)

    @staticmethod
    def _settle(
        group: list[tuple[Callable[[WriteView], Any], Future[Any]]],
        outcomes: list[tuple[bool, Any]],
    ) -> None:
        """The group committed: each function's result, or the error it raised."""
        for (_, future), (ok, value) in zip(group, outcomes, strict=True):
            if ok:
                future.set_result(value)
            else:
                future.set_exception(value)

    def _outcome(self, view: _WriteView, server: str | None) -> str | None:
        """How the transaction whose ``COMMIT`` went unanswered ended: "committed",
        "aborted", or None where PostgreSQL could not tell within the connect timeout.

        Asked over a new connection (the writer's from then on): ``pg_xact_status`` of
        the transaction's id. Where its session still runs it ("in progress": the
        ``COMMIT`` never arrived, or is still being carried out), that session is ended
        first (``pg_terminate_backend``, which waits for it to exit): the transaction
        then either committed before or never will. A transaction without an id wrote
        nothing: whatever became of it, nothing was written. Only asked of the server
        the ``COMMIT`` went to (``server``, :func:`_server_of`), and where it restarted
        since, "committed" is not believed (:func:`_outcome_after_restart`)."""
        xid = view.xid
        if xid is None:
            return "aborted"
        deadline = time.monotonic() + self._connect_timeout
        while True:
            left = deadline - time.monotonic()
            try:
                conn = self._writer_conn
                if conn.closed or conn.broken:
                    with contextlib.suppress(Exception):
                        conn.close()
                    conn = self._writer_conn = _connect(self._conninfo, max(left, 0.0))
                    self._writer_server = _server_of(conn)
                now = self._writer_server
                if server is None or now is None or _cluster(now) != _cluster(server):
                    # Another server than the one the COMMIT went to (a standby promoted
                    # since, another host of the URL): its transaction ids are not that
                    # one's, and its sessions not that one's to end.
                    _log.warning(
                        "cannot find out whether the store's unanswered commit committed: "
                        "the connection now leads to another PostgreSQL server",
                        extra={"event": "error"},
                    )
                    return None
                if now != server:
                    return _outcome_after_restart(conn, xid)
                status = _xact_status(conn, xid)
                if status == "in progress" and view.backend_pid:
                    conn.execute(
                        "SELECT pg_terminate_backend(pid, %s) FROM pg_stat_activity "
                        "WHERE pid = %s AND backend_xid = %s::text::xid",
                        # backend_xid is the 32-bit xid: the xid8 without its epoch.
                        (max(100, int(left * 1000)), view.backend_pid, int(xid) & 0xFFFFFFFF),
                    ).fetchall()
                    status = _xact_status(conn, xid)
                if status in ("committed", "aborted"):
                    return status
            except psycopg.Error as exc:
                _log.warning(
                    f"cannot find out whether the store's unanswered commit committed: "
                    f"{_reason(exc)}",
                    extra={"event": "error"},
                )
            if time.monotonic() >= deadline:
                return None
            time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))

    def _set_idle_timeout(self, conn: psycopg.Connection[Any]) -> None:
        # Session-level, so once per connection (a reconnect starts without it).
        if self._idle_set_on is conn:
            return
        conn.execute(
            sql.SQL("SET idle_in_transaction_session_timeout = {}").format(
                sql.Literal(self._idle_timeout_ms)
            )
        )
        self._idle_set_on = conn

    def _fenced(self, group: list[tuple[Callable[[WriteView], Any], Future[Any]]]) -> None:
        _log.error(
            "the store refused a write: this instance no longer holds the leader lease",
            extra={"event": "fenced"},
        )
        error = LeaseLost(_LEASE_LOST)
        for _, future in group:
            future.set_exception(error)

    def _reconnect_if_broken(self) -> None:
        # PostgreSQL restarted, say: the next group gets a fresh connection; callers
        # got a retriable ServerError meanwhile. A connection that PostgreSQL ended
        # while it sat idle between groups is replaced before the group sends anything
        # on it: otherwise that group failed, though nothing of it had been sent (and
        # a queue whose write failed forgot the leases of its pops).
        conn = self._writer_conn
        if not conn.closed and not conn.broken and not _ended_while_idle(conn):
            return
        with contextlib.suppress(Exception):
            self._writer_conn.close()
        try:
            self._writer_conn = _connect(self._conninfo, self._connect_timeout)
            self._writer_server = _server_of(self._writer_conn)
        except psycopg.Error as exc:
            _log.error(f"cannot reconnect to the store: {exc}", extra={"event": "error"})


def _unanswered(exc: BaseException, commit_sent: bool) -> bool:
    """Whether ``exc`` left a transaction whose ``COMMIT`` was sent with no answer: the
    connection failed (no SQLSTATE: PostgreSQL said nothing) after it went out."""
    return (
        commit_sent
        and isinstance(exc, psycopg.OperationalError)
        and getattr(exc, "sqlstate", None) is None
    )


def _cluster(server: str) -> str:
    """A :func:`_server_of` answer without the server's start: the cluster and its
    timeline, whose transaction ids are one sequence."""
    return server.rsplit("/", 1)[0]


def _outcome_after_restart(conn: psycopg.Connection[Any], xid: str) -> str | None:
    """How the transaction ``xid`` ended, asked of its server restarted since its
    ``COMMIT`` went out unanswered.

    A ``COMMIT`` that was durable before the stop keeps its id and its status. One that
    was not left nothing: its id lies at or past where the restarted server hands out
    ids, and is handed out again, to a transaction that may commit. So only "aborted",
    "in progress" (the id's new holder: the old session is gone) and an id still in the
    future say for certain that it did not commit; "committed" may be the new holder's
    and says nothing (None)."""
    try:
        status = _xact_status(conn, xid)
    except psycopg.errors.InvalidParameterValue:
        # "transaction ID ... is in the future": the restart lost it, and it is not
        # handed out again yet.
        _rollback(conn)
        return "aborted"
    if status == "committed":
        _log.warning(
            "cannot find out whether the store's unanswered commit committed: "
            "PostgreSQL restarted since, and a transaction id it did not keep may have "
            "been handed out again",
            extra={"event": "error"},
        )
        return None
    return "aborted"


def _xact_status(conn: psycopg.Connection[Any], xid: str) -> str | None:
    """``pg_xact_status`` of the transaction ``xid`` (an ``xid8`` as text)."""
    row = conn.execute("SELECT pg_xact_status(%s::text::xid8)", (xid,)).fetchone()
    return None if row is None or row[0] is None else str(row[0])


def _ended_while_idle(conn: psycopg.Connection[Any]) -> bool:
    """Whether PostgreSQL ended ``conn``'s session while it was idle (a restart, a
    terminated backend): the server then sends its last message and closes the socket,
    so the socket reads ready though nothing was asked. One ``select`` of no wait, no
    round trip. (The writer's session asks for no notifications, so nothing else makes
    an idle one readable; where something did, the cost is a new connection.)"""
    if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        return False
    try:
        readable, _, _ = select.select([conn.fileno()], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(readable)


def _with_tcp_options(url: str, seconds: float | None) -> str:
    """``url`` with the TCP options under which a cut network path fails a connection
    within about ``seconds``; options the URL gives win (an operator who set them
    meant them)."""
    if seconds is None:
        return url
    from tidings.cluster.lease import tcp_options

    try:
        given = conninfo_to_dict(url)
        tcp = {k: v for k, v in tcp_options(seconds).items() if k not in given}
        return make_conninfo(url, **tcp)
    except psycopg.Error:
        return url  # a malformed URL: the first connect says what is wrong


def _with_connect_timeout(url: str, seconds: float) -> tuple[str, float]:
    """``url`` with ``connect_timeout`` (``seconds``, rounded up to whole ones, as libpq
    counts them), unless it gives a positive one of its own, and the timeout it then
    has. In the URL, so that the read pool's connections get it too: without one,
    psycopg waited up to 130 s for each, and a pool whose opening threads all waited on
    a database that never answered (a black-holed address) could not open a connection
    for minutes after it came back. (A URL's 0, libpq's "wait forever", is that again.)"""
    try:
        given = conninfo_to_dict(url).get("connect_timeout")
        if given is not None and float(str(given)) > 0:
            return url, float(str(given))
        return make_conninfo(url, connect_timeout=max(1, math.ceil(seconds))), seconds
    except (psycopg.Error, ValueError):
        return url, seconds  # a malformed URL: the first connect says what is wrong


def _connect(url: str, timeout: float) -> psycopg.Connection[Any]:
    """The writer's connection (autocommit: each group sends its own BEGIN)."""
    # libpq takes whole seconds and treats 0 as "wait forever", so round up.
    conn = psycopg.connect(url, autocommit=True, connect_timeout=max(1, math.ceil(timeout)))
    try:
        _plan_by_key(conn)
    except BaseException:
        conn.close()
        raise
    return conn


def _server_of(conn: psycopg.Connection[Any]) -> str | None:
    """Which PostgreSQL server ``conn`` leads to, as far as transaction ids go: its
    cluster's system identifier and its timeline, which a standby's promotion changes
    (its copy shares the identifier), then (after a ``/``) when it last started. None
    where it cannot be read.

    The start tells a restart: a transaction whose ``COMMIT`` was not durable when the
    server stopped (a crash, an immediate shutdown) leaves no trace, and its id is
    handed out again after the restart (:meth:`PostgresStore._outcome`)."""
    try:
        row = conn.execute(
            "SELECT system_identifier::text || '/' || "
            "substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8) || '/' || "
            "pg_postmaster_start_time()::text FROM pg_control_system()"
        ).fetchone()
    except psycopg.Error:
        if not conn.broken:
            with contextlib.suppress(psycopg.Error):
                _rollback(conn)
        return None
    return None if row is None else str(row[0])


def _plan_by_key(conn: psycopg.Connection[Any]) -> None:
    """Plan every query of this session along the primary key.

    Each query of the store reads a key or a key range in key order, and the B-tree
    walk is always the right plan for it. Left to the statistics, which lag behind a
    table that grows by thousands of rows a second (before autovacuum's next ANALYZE),
    PostgreSQL chose a bitmap scan of the whole rest of the range and a sort for each
    page of 1,000 rows: reading 100,000 messages back through a server took 1.7-1.9 s
    instead of 0.67 (BENCHMARKS.md, "Fewer round trips per group commit")."""
    conn.execute(b"SET enable_bitmapscan = off; SET enable_seqscan = off")


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
