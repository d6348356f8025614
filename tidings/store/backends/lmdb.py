"""The embedded default store: LMDB, one environment per data directory, group commit.

LMDB gives ordered keys, ACID transactions, one writer and any number of readers
that never block it (MVCC over a copy-on-write B+tree), and lets other processes
read the same directory. What it does not give is cheap durability: every commit is
an fsync. So all writes go through one writer thread that merges the write
functions submitted meanwhile into one write transaction and one fsync (group
commit), and resolves each function's future only after that commit is durable: an
acknowledged write survives a crash.

A group first runs every write function directly in the group's transaction. Only
if one raises is that attempt aborted and the group run again with each function in a
nested (child) transaction, whose abort discards exactly the failing function's writes
while the others still commit. Write functions decide from what they read, so running
them again is safe. The child transactions are kept off the common path because they
copy every page they touch: measured with py-lmdb 3.0 (LMDB 0.9), 500-row batches of
100 B are written at 0.72 M rows/s through children against 1.37 M rows/s flat.
"""

from __future__ import annotations

import collections
import fcntl
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from contextlib import AbstractContextManager, contextmanager
from typing import Any, TypeVar

import lmdb

from tidings.errors import ServiceUnavailable, StoreFull
from tidings.store.backend import TABLES, ReadView, Store, WriteView, check_table

__all__ = ["LmdbStore"]

T = TypeVar("T")

#: Default bound on the write functions merged into one commit: enough to amortise
#: an fsync over many callers, small enough to keep the first caller's wait short and
#: the child-transaction merges (each O(dirty pages of the group)) cheap.
DEFAULT_MAX_GROUP = 256

# Readers each hold a slot in the lock file for the length of a snapshot; a server
# with many request threads, plus inspection tools, needs more than LMDB's 126.
_MAX_READERS = 1024


class _MapFull(StoreFull, lmdb.MapFullError):
    """LMDB's ``MapFullError`` as a :class:`~tidings.errors.StoreFull`: callers that
    catch ``lmdb.MapFullError`` still do, and the server answers it as a 503 with a
    JSON body instead of an internal error."""

    def to_json(self) -> dict[str, str]:
        return {"error": self.message, "type": StoreFull.__name__}


class _DiskFull(StoreFull, lmdb.DiskError):
    """LMDB's ``DiskError`` (``ENOSPC``: the disk has no room for the file to grow) as
    a :class:`~tidings.errors.StoreFull`, as :class:`_MapFull` is."""

    def to_json(self) -> dict[str, str]:
        return {"error": self.message, "type": StoreFull.__name__}


#: Key of the write that lets LMDB reuse what the last commit freed (see _advance): put
#: and deleted in one transaction, so never stored. No table's keys start with NUL.
_ADVANCE_KEY = b"\0tidings.store.advance"


#: In the store's directory: held (flock) by the one process that writes the store.
LOCK_FILE = "tidings.lock"


def _lock(path: str) -> int:
    """Take the store's lock file, or raise :class:`ServiceUnavailable` naming the
    process that holds it. LMDB itself would let a second process open the store and
    write beside the first; a second server must instead stop before changing anything.
    Read-only opens take no lock, so ``tidings inspect`` works beside the server."""
    fd = os.open(os.path.join(path, LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
        os.close(fd)
        by = f" (pid {holder})" if holder.isdigit() else ""
        raise ServiceUnavailable(
            f"the store {path} is in use by another process{by}: one server per store"
        ) from None
    except BaseException:
        os.close(fd)
        raise
    # The pid, for the message above; the lock is the flock, not the file's content.
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


class _View:
    """Reads inside one LMDB transaction (a read snapshot or a write function's child)."""

    __slots__ = ("_dbs", "_txn")

    def __init__(self, txn: lmdb.Transaction[bytes], dbs: dict[str, lmdb._Database]) -> None:
        self._txn = txn
        self._dbs = dbs

    def _db(self, table: str) -> lmdb._Database:
        db = self._dbs.get(table)
        if db is None:
            check_table(table)
        assert db is not None
        return db

    def get(self, table: str, key: bytes) -> bytes | None:
        db = self._db(table)
        if not key:  # LMDB rejects empty keys; none can be stored, so none is found
            return None
        return self._txn.get(key, db=db)

    def scan(
        self, table: str, start: bytes, stop: bytes, limit: int | None = None
    ) -> Iterator[tuple[bytes, bytes]]:
        return _scan(self._txn.cursor(self._db(table)), start, stop, limit)

    def last_below(
        self, table: str, bound: bytes, floor: bytes = b""
    ) -> tuple[bytes, bytes] | None:
        db = self._db(table)
        if not bound:
            return None
        cursor = self._txn.cursor(db)
        found = cursor.prev() if cursor.set_range(bound) else cursor.last()
        if not found or cursor.key() < floor:
            return None
        return cursor.item()


def _scan(
    cursor: lmdb.Cursor[bytes], start: bytes, stop: bytes, limit: int | None
) -> Iterator[tuple[bytes, bytes]]:
    if (limit is not None and limit <= 0) or not cursor.set_range(start):
        return
    if limit is None:
        # The common case (a poll's walk stops itself): no count to keep.
        for item in cursor.iternext():
            if item[0] >= stop:
                return
            yield item
        return
    for count, (key, value) in enumerate(cursor.iternext(), 1):
        if key >= stop:
            return
        yield key, value
        if count == limit:
            return


class _WriteView(_View):
    """A write function's view: its own child transaction of the group's transaction."""

    __slots__ = ()

    def put(self, table: str, key: bytes, value: bytes) -> None:
        db = self._db(table)
        try:
            self._txn.put(key, value, db=db)
        except lmdb.BadValsizeError as exc:
            raise _bad_key(key) from exc

    def put_many(
        self, table: str, items: Iterable[tuple[bytes, bytes]], *, append: bool = False
    ) -> None:
        # One cursor and one C loop for the whole batch: ~3x faster than put() per item.
        with self._txn.cursor(self._db(table)) as cursor:
            try:
                if not append:
                    cursor.putmulti(items)
                    return
                # MDB_APPEND fills each page before starting the next instead of
                # splitting full pages in half: a third fewer pages for 1 KiB rows and
                # ~1.4x the write rate. It only takes keys above the table's last one
                # (a topic that is not the newest in the table fails it); then the
                # batch is written again the ordinary way, which overwrites any rows
                # the append did take with the same values.
                items = list(items)
                consumed, added = cursor.putmulti(items, append=True)
                if added != consumed:
                    cursor.putmulti(items)
            except lmdb.BadValsizeError as exc:
                raise _bad_key(b"") from exc

    def delete(self, table: str, key: bytes) -> bool:
        db = self._db(table)
        return bool(key) and self._txn.delete(key, db=db)

    def delete_range(self, table: str, start: bytes, stop: bytes, limit: int | None = None) -> int:
        cursor = self._txn.cursor(self._db(table))
        if (limit is not None and limit <= 0) or not cursor.set_range(start):
            return 0
        removed = 0
        # cursor.delete() moves to the next item; past the last one the cursor is
        # unpositioned and key() is b"", which no stored key can be.
        while (key := cursor.key()) and key < stop:
            cursor.delete()
            removed += 1
            if removed == limit:
                break
        return removed


def _bad_key(key: bytes) -> ValueError:
    detail = f" (got {len(key)} bytes)" if key else ""
    return ValueError(f"LMDB keys must be 1 to 511 bytes long{detail}")


#: How long (seconds) after the writer's last group of several writes no write is
#: committed in its caller's thread (see LmdbStore.submit_inline).
_COMPANY = 0.05


class LmdbStore(Store):
    """A durable :class:`Store` in an LMDB environment (the directory ``path``).

    One named LMDB database per table in :data:`~tidings.store.backend.TABLES`. Keys
    are 1 to 511 bytes (LMDB's limit).

    ``map_size`` is the most the data file may grow to (virtual address space is
    reserved, disk is not). ``sync=True`` fsyncs every commit: an acknowledged write
    survives a kill -9 and an OS crash or power loss. ``sync=False`` skips the fsync:
    acknowledged writes survive a kill -9 of the process (they are in the OS page
    cache), but an OS crash may lose the last commits, or corrupt the store on a
    filesystem that reorders writes (see docs/storage.md). ``readonly=True`` opens an
    existing store for inspection while another process writes it; :meth:`submit` then
    raises. A writable store is one process's: opening it while another process has
    it open for writing raises :class:`~tidings.errors.ServiceUnavailable` and changes
    nothing. ``max_group`` bounds how many write functions one commit merges.

    Close the store (or use it as a context manager): :meth:`close` finishes the
    queued writes and stops the writer thread.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        map_size: int = 1 << 40,
        sync: bool = True,
        readonly: bool = False,
        max_group: int = DEFAULT_MAX_GROUP,
    ) -> None:
        if max_group < 1:
            raise ValueError(f"max_group must be at least 1, got {max_group}")
        self.path = os.fspath(path)
        self.readonly = readonly
        self._max_group = max_group
        self._lock_fd: int | None = None
        if not readonly:
            os.makedirs(self.path, exist_ok=True)
            self._lock_fd = _lock(self.path)
        elif not os.path.exists(os.path.join(self.path, "data.mdb")):
            raise FileNotFoundError(f"no LMDB store at {self.path!r} to open read-only")
        try:
            self._open(map_size, sync, readonly)
        except BaseException:
            self._unlock()
            raise
        self._cond = threading.Condition()
        self._queue: collections.deque[tuple[Callable[[WriteView], Any], Future[Any]]] = (
            collections.deque()
        )
        self._closed = False
        # A commit is running (the writer's, or one in a caller's thread): one at a time.
        self._busy = False
        self._inline_check: Callable[[], bool] | None = None
        # When the writer last committed a group of several: writes had company then,
        # and a commit in a caller's thread would keep the next ones from grouping.
        self._grouped_at = -_COMPANY
        self._commits = 0
        self._writes = 0
        self._thread: threading.Thread | None = None
        if not readonly:
            self._thread = threading.Thread(
                target=self._write_loop, name=f"tidings-store-writer:{self.path}", daemon=True
            )
            self._thread.start()

    def _open(self, map_size: int, sync: bool, readonly: bool) -> None:
        self._env = lmdb.open(
            self.path,
            map_size=map_size,
            readonly=readonly,
            sync=sync,
            metasync=sync,
            # writemap maps the file writable, so a stray write through the map would
            # corrupt it, and with sync=False the OS could flush pages in any order.
            writemap=False,
            lock=True,
            max_readers=_MAX_READERS,
            max_dbs=len(TABLES) + 4,
            max_spare_txns=16,
        )
        try:
            # Free reader slots left by killed processes, whose old snapshots would
            # otherwise keep pages from being reused and make the file grow.
            self._env.reader_check()
            self._dbs = {
                name: self._env.open_db(name.encode(), create=not readonly) for name in TABLES
            }
        except BaseException:
            self._env.close()
            raise

    @property
    def commits(self) -> int:
        """How many write transactions have been committed (one fsync each when syncing)."""
        return self._commits

    @property
    def writes(self) -> int:
        """How many write functions have been committed (those that did not raise)."""
        return self._writes

    def read(self) -> AbstractContextManager[ReadView]:
        return self._read()

    @contextmanager
    def _read(self) -> Iterator[ReadView]:
        if self._closed:
            raise RuntimeError("store is closed")
        txn = self._env.begin()
        try:
            yield _View(txn, self._dbs)
        finally:
            txn.abort()

    def submit(self, fn: Callable[[WriteView], T]) -> Future[T]:
        return self._submit(fn, False)

    def submit_inline(self, fn: Callable[[WriteView], T]) -> Future[T]:
        return self._submit(fn, True)

    def set_inline_check(self, check: Callable[[], bool] | None) -> None:
        self._inline_check = check

    def _submit(self, fn: Callable[[WriteView], T], inline: bool) -> Future[T]:
        if self.readonly:
            raise RuntimeError(
                f"store at {self.path!r} was opened with readonly=True; it cannot write"
            )
        future: Future[T] = Future()
        with self._cond:
            if self._closed:
                raise RuntimeError("store is closed")
            check = self._inline_check
            here = (
                inline
                and not self._busy
                and not self._queue
                and check is not None
                and time.monotonic() - self._grouped_at > _COMPANY
                and check()
            )
            if here:
                self._busy = True
            else:
                self._queue.append((fn, future))
                self._cond.notify()
        if here:
            # Nothing else to commit, and the caller may wait: committing here saves
            # waking the writer and being woken by it (BENCHMARKS.md, "A lone write
            # committed where it was made").
            try:
                self._commit_group([(fn, future)])
            finally:
                with self._cond:
                    self._busy = False
                    if self._queue or self._closed:  # else the writer has nothing to do
                        self._cond.notify()
        return future

    def close(self) -> None:
        """Run the write functions already submitted, stop the writer, close LMDB."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._cond.notify()
        if self._thread is not None:
            if self._thread is threading.current_thread():
                raise RuntimeError("close() called from a write function")
            self._thread.join()
        self._env.close()
        self._unlock()

    def _unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = None

    def _write_loop(self) -> None:
        while True:
            with self._cond:
                # Also while a caller commits in its own thread (submit_inline): LMDB
                # takes one write transaction at a time.
                while (not self._queue and not self._closed) or self._busy:
                    self._cond.wait()
                if not self._queue:
                    return  # closed and drained
                # Everything that queued up during the previous commit's fsync goes
                # into this one: that is the grouping, with no timer to tune.
                count = min(len(self._queue), self._max_group)
                group = [self._queue.popleft() for _ in range(count)]
                self._busy = True
            if count > 1:
                self._grouped_at = time.monotonic()
            try:
                self._commit_group(group)
            finally:
                with self._cond:
                    self._busy = False

    def _run_flat(
        self,
        txn: Any,
        live: list[tuple[Callable[[WriteView], Any], Future[Any]]],
        outcomes: list[tuple[bool, Any]],
    ) -> bool:
        # The common case: nobody raises. Running every function directly in the group
        # transaction avoids the child transactions' page copies, which halve the write
        # rate of 500-row batches (measured: 0.72 vs 1.37 M rows/s of 100 B).
        view = _WriteView(txn, self._dbs)
        for fn, _ in live:
            try:
                outcomes.append((True, fn(view)))
            except BaseException:
                return False
        return True

    def _run_nested(
        self,
        txn: Any,
        live: list[tuple[Callable[[WriteView], Any], Future[Any]]],
        outcomes: list[tuple[bool, Any]],
    ) -> None:
        for fn, _ in live:
            child = self._env.begin(write=True, parent=txn)
            try:
                result = fn(_WriteView(child, self._dbs))
            except BaseException as exc:  # the caller's error travels in its future
                child.abort()
                outcomes.append((False, exc))
            else:
                child.commit()
                outcomes.append((True, result))

    def _commit_group(self, group: list[tuple[Callable[[WriteView], Any], Future[Any]]]) -> None:
        # Claim the futures first: from here on a caller can no longer cancel one, so
        # every claimed future is resolved by this method and only by it.
        live = [(fn, future) for fn, future in group if future.set_running_or_notify_cancel()]
        if not live:
            return
        outcomes = self._attempt(live)
        full = [i for i, (ok, value) in enumerate(outcomes) if not ok and _is_full(value)]
        if full and self._advance():
            # The map was full, maybe only because LMDB reuses the pages a commit frees
            # two commits later, not one (the previous state must stay whole): after a
            # cleaner pass that freed room, every write would fail until something else
            # commits. The advance was that commit; these functions get one more try.
            again = self._attempt([live[i] for i in full])
            for i, outcome in zip(full, again, strict=True):
                outcomes[i] = outcome
        # Futures resolve only now, after the commit (and its fsync) returned.
        for (_, future), (ok, value) in zip(live, outcomes, strict=True):
            if ok:
                self._writes += 1
                future.set_result(value)
            else:
                future.set_exception(self._full(value) if _is_full(value) else value)

    def _attempt(
        self, live: list[tuple[Callable[[WriteView], Any], Future[Any]]]
    ) -> list[tuple[bool, Any]]:
        """Run ``live`` in one write transaction and commit it: per function ``(True,
        result)`` if its writes committed, else ``(False, exception)``."""
        outcomes: list[tuple[bool, Any]] = []
        try:
            txn = self._env.begin(write=True)
            try:
                if not self._run_flat(txn, live, outcomes):
                    # A function raised: start over with each function in a child
                    # transaction, so only its own writes are dropped. Write functions
                    # decide from what they read, so running them again is safe.
                    txn.abort()
                    outcomes.clear()
                    txn = self._env.begin(write=True)
                    self._run_nested(txn, live, outcomes)
                txn.commit()
            except BaseException:
                txn.abort()
                raise
        except BaseException as exc:
            # Nothing of the group was committed: every caller learns it, except that a
            # function that had already raised keeps its own, more telling, error.
            return [
                outcomes[i] if i < len(outcomes) and not outcomes[i][0] else (False, exc)
                for i in range(len(live))
            ]
        self._commits += 1
        return outcomes

    def _advance(self) -> bool:
        """Commit a write that changes nothing (a key put and deleted), so that the
        next transaction may reuse the pages the last commit freed. False if even that
        found no room."""
        db = self._dbs["tx"]
        try:
            with self._env.begin(write=True) as txn:
                txn.put(_ADVANCE_KEY, b"", db=db)
                txn.delete(_ADVANCE_KEY, db=db)
        except (lmdb.MapFullError, lmdb.DiskError):
            return False
        self._commits += 1
        return True

    def _full(self, exc: BaseException) -> StoreFull:
        if isinstance(exc, StoreFull):
            return exc
        if isinstance(exc, lmdb.DiskError):
            disk = _DiskFull(
                "the store is full: the disk holding it has no space left, and nothing of "
                "this write was stored; room comes back as the cleaner deletes expired "
                f"messages (their pages are reused), or once the disk has space ({exc})"
            )
            disk.__cause__ = exc
            return disk
        size = self._env.info()["map_size"]
        error = _MapFull(
            f"the store is full: LMDB's map_size ({size} bytes) is reached, and nothing "
            "of this write was stored; room comes back as the cleaner deletes expired "
            f"messages, or restart with a larger map_size ({exc})"
        )
        error.__cause__ = exc
        return error


def _is_full(exc: object) -> bool:
    # DiskError is ENOSPC: the file could not grow. Both leave the store as it was.
    return isinstance(exc, (lmdb.MapFullError, lmdb.DiskError))
