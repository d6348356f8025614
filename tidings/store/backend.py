"""The ordered key-value store every other part of Tidings is written against.

A store holds a fixed set of named tables, each an ordered map ``bytes -> bytes``
(keys compare byte-wise). Reads happen in consistent snapshots; writes happen in
*write functions* that the store runs one at a time inside its single write
transaction, so a function can read the current state, decide, and write, and
nothing else interleaves. That is how the messaging core assigns message keys inside
the storage write that makes them visible (docs/design.md, invariant 1).

Backends group-commit: functions submitted concurrently are run one after another in
one write transaction, made durable with one commit (one fsync), and only then are
their futures resolved. A function that raises has none of its writes applied; the
others in the same group are unaffected.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from contextlib import AbstractContextManager
from typing import Protocol, Self, TypeVar

__all__ = [
    "AFTER_ALL_KEYS",
    "TABLES",
    "ReadView",
    "Store",
    "WriteView",
]

T = TypeVar("T")

#: The tables every store holds. ``tx`` is free for components that keep state there.
TABLES: tuple[str, ...] = ("metadata", "messages", "payloads", "tx")

#: A scan bound above every key a store can hold (keys are at most 511 bytes).
AFTER_ALL_KEYS = b"\xff" * 512


class ReadView(Protocol):
    """A consistent view of every table (a snapshot, or the current write transaction)."""

    def get(self, table: str, key: bytes) -> bytes | None:
        """The value under ``key``, or None."""
        ...

    def scan(
        self, table: str, start: bytes, stop: bytes, limit: int | None = None
    ) -> Iterator[tuple[bytes, bytes]]:
        """Items with ``start <= key < stop`` in ascending key order, at most ``limit``.

        The iterator is only valid while the view is (inside its ``with`` block or
        write function).
        """
        ...

    def last_below(
        self, table: str, bound: bytes, floor: bytes = b""
    ) -> tuple[bytes, bytes] | None:
        """The item with the greatest key ``k`` such that ``floor <= k < bound``, or None."""
        ...


class WriteView(ReadView, Protocol):
    """What a write function sees: the current state, including the writes made so far."""

    def put(self, table: str, key: bytes, value: bytes) -> None:
        """Set ``key`` to ``value``."""
        ...

    def delete(self, table: str, key: bytes) -> bool:
        """Remove ``key``; True if it was there."""
        ...

    def delete_range(self, table: str, start: bytes, stop: bytes, limit: int | None = None) -> int:
        """Remove keys in ``[start, stop)``, at most ``limit`` of them (the lowest first).

        Returns how many were removed.
        """
        ...

    def put_many(
        self, table: str, items: Iterable[tuple[bytes, bytes]], *, append: bool = False
    ) -> None:
        """Set every ``key`` to its ``value``, in order; a later duplicate key wins.

        The same as calling :meth:`put` for each item, but much faster for large
        batches (publishing a 500-message batch writes through here): backends insert
        in bulk (LMDB: one cursor, ``putmulti``). Items in ascending key order are the
        fastest case. ``append=True`` is a hint that the keys ascend and probably follow
        every key already in the table; the result is the same either way, but a
        backend may write such a run faster (LMDB fills pages instead of splitting them).
        """
        ...


WriteFn = Callable[[WriteView], T]


class Store(abc.ABC):
    """An ordered, transactional key-value store with group commit.

    Implementations: :class:`~tidings.store.backends.lmdb.LmdbStore` (embedded,
    durable), :class:`~tidings.store.backends.memory.MemoryStore` (tests, examples).
    """

    @abc.abstractmethod
    def read(self) -> AbstractContextManager[ReadView]:
        """A consistent read snapshot; readers never block writers."""

    @abc.abstractmethod
    def submit(self, fn: Callable[[WriteView], T]) -> Future[T]:
        """Run ``fn`` inside the store's write transaction; resolve once durable.

        ``fn`` runs on the store's writer (never concurrently with another write
        function) and must not block. Its future holds its result after the commit
        containing its writes is durable, or the exception it raised (then none of its
        writes were applied), or the store's commit error.
        """

    def submit_inline(self, fn: Callable[[WriteView], T]) -> Future[T]:
        """:meth:`submit`, or, where the store allows it, ``fn`` run and committed in
        the calling thread before this returns (its future then already resolved).

        A backend with a writer thread commits in the caller's thread only when nothing
        else is queued or being committed and the check given to
        :meth:`set_inline_check` says the caller may wait that long: a lone write then
        skips the hand-over to the writer and back. Call it only where nothing the
        write function or the future's callbacks need is held. By default, and in
        backends without the option, this is :meth:`submit`."""
        return self.submit(fn)

    def set_inline_check(self, check: Callable[[], bool] | None) -> None:
        """Install the check :meth:`submit_inline` asks, in the calling thread, before
        committing there (``None``: never). Backends without the option ignore it."""
        del check  # nothing commits in a caller's thread here

    def apply(self, fn: Callable[[WriteView], T]) -> T:
        """:meth:`submit` and wait: returns once ``fn``'s writes are durable."""
        return self.submit(fn).result()

    @abc.abstractmethod
    def close(self) -> None:
        """Finish pending writes and release the store. Idempotent."""

    @property
    def commits(self) -> int:
        """Write transactions committed so far (0 where a backend does not count them)."""
        return 0

    @property
    def reads_block(self) -> bool:
        """True where a read waits on more than memory and the local disk (a network
        round trip, a pooled connection): such reads must not run on an event loop.
        False for the embedded stores, whose reads take microseconds."""
        return False

    # Conveniences: each runs in a snapshot of its own.

    def get(self, table: str, key: bytes) -> bytes | None:
        """Point read in a fresh snapshot."""
        with self.read() as view:
            return view.get(table, key)

    def scan_list(
        self, table: str, start: bytes, stop: bytes, limit: int | None = None
    ) -> list[tuple[bytes, bytes]]:
        """:meth:`ReadView.scan` in a fresh snapshot, materialised."""
        with self.read() as view:
            return list(view.scan(table, start, stop, limit))

    def last_below(
        self, table: str, bound: bytes, floor: bytes = b""
    ) -> tuple[bytes, bytes] | None:
        """:meth:`ReadView.last_below` in a fresh snapshot."""
        with self.read() as view:
            return view.last_below(table, bound, floor)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def check_table(table: str) -> None:
    """Raise ValueError for a table name the store does not hold (a programming error)."""
    if table not in TABLES:
        raise ValueError(f"unknown table {table!r}; tables are {TABLES}")
