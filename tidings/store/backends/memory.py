"""An in-memory store for tests and examples: same semantics as LMDB, no durability.

Tables are immutable snapshots (a sorted key list plus a dict) replaced wholesale by
each write function that changes them, so a read snapshot is just the current set of
references and never sees later writes. Writes cost O(table size): fine for tests.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from contextlib import AbstractContextManager, contextmanager
from typing import TypeVar

from tidings.store.backend import TABLES, ReadView, Store, WriteView, check_table

__all__ = ["MemoryStore"]

T = TypeVar("T")


class _Table:
    __slots__ = ("keys", "values")

    def __init__(self, keys: list[bytes] | None = None, values: dict[bytes, bytes] | None = None):
        self.keys: list[bytes] = keys if keys is not None else []
        self.values: dict[bytes, bytes] = values if values is not None else {}

    def copy(self) -> _Table:
        return _Table(list(self.keys), dict(self.values))


class _View:
    """Reads over a mapping of table name to :class:`_Table`."""

    def __init__(self, tables: dict[str, _Table]) -> None:
        self._tables = tables

    def _table(self, table: str) -> _Table:
        check_table(table)
        return self._tables[table]

    def get(self, table: str, key: bytes) -> bytes | None:
        return self._table(table).values.get(bytes(key))

    def scan(
        self, table: str, start: bytes, stop: bytes, limit: int | None = None
    ) -> Iterator[tuple[bytes, bytes]]:
        t = self._table(table)
        lo = bisect.bisect_left(t.keys, start)
        hi = bisect.bisect_left(t.keys, stop)
        if limit is not None:
            hi = min(hi, lo + max(limit, 0))
        for key in t.keys[lo:hi]:
            yield key, t.values[key]

    def last_below(
        self, table: str, bound: bytes, floor: bytes = b""
    ) -> tuple[bytes, bytes] | None:
        t = self._table(table)
        i = bisect.bisect_left(t.keys, bound) - 1
        if i < 0 or t.keys[i] < floor:
            return None
        key = t.keys[i]
        return key, t.values[key]


class _WriteView(_View):
    """Copies a table on its first write, so an exception leaves the store untouched."""

    def __init__(self, tables: dict[str, _Table]) -> None:
        super().__init__(dict(tables))
        self.changed: set[str] = set()

    def _own(self, table: str) -> _Table:
        check_table(table)
        if table not in self.changed:
            self._tables[table] = self._tables[table].copy()
            self.changed.add(table)
        return self._tables[table]

    def put(self, table: str, key: bytes, value: bytes) -> None:
        t = self._own(table)
        key = bytes(key)
        if key not in t.values:
            bisect.insort(t.keys, key)
        t.values[key] = bytes(value)

    def put_many(
        self, table: str, items: Iterable[tuple[bytes, bytes]], *, append: bool = False
    ) -> None:
        t = self._own(table)
        new: list[bytes] = []
        for key, value in items:
            key = bytes(key)
            if key not in t.values:
                new.append(key)
            t.values[key] = bytes(value)
        if new:
            # Timsort merges the sorted table and the (usually sorted) new run in O(n).
            t.keys.extend(new)
            t.keys.sort()

    def delete(self, table: str, key: bytes) -> bool:
        t = self._own(table)
        key = bytes(key)
        if key not in t.values:
            return False
        del t.values[key]
        del t.keys[bisect.bisect_left(t.keys, key)]
        return True

    def delete_range(self, table: str, start: bytes, stop: bytes, limit: int | None = None) -> int:
        t = self._own(table)
        lo = bisect.bisect_left(t.keys, start)
        hi = max(bisect.bisect_left(t.keys, stop), lo)  # stop <= start: an empty range
        if limit is not None:
            hi = min(hi, lo + max(limit, 0))
        for key in t.keys[lo:hi]:
            del t.values[key]
        del t.keys[lo:hi]
        return hi - lo

    def tables(self) -> dict[str, _Table]:
        return self._tables


class MemoryStore(Store):
    """A volatile :class:`Store`: all tables in process memory, writes applied in order."""

    def __init__(self) -> None:
        self._tables: dict[str, _Table] = {name: _Table() for name in TABLES}
        self._lock = threading.Lock()
        self._closed = False

    def read(self) -> AbstractContextManager[ReadView]:
        return self._read()

    @contextmanager
    def _read(self) -> Iterator[ReadView]:
        self._check_open()
        yield _View(self._tables)

    def submit(self, fn: Callable[[WriteView], T]) -> Future[T]:
        future: Future[T] = Future()
        with self._lock:
            self._check_open()
            view = _WriteView(self._tables)
            try:
                result = fn(view)
            except BaseException as exc:  # the caller's error travels in its future
                future.set_exception(exc)
                return future
            self._tables = view.tables()
        future.set_result(result)
        return future

    def close(self) -> None:
        self._closed = True

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("store is closed")
