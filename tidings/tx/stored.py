"""The transaction log and snapshots kept in the store's ``tx`` table instead of files.

Where the store is PostgreSQL, everything the server keeps lives in the database, so
another instance can take over the transaction service from it (``tidings.cluster``).
Layout in the ``tx`` table (big-endian integers, so key order is replay order)::

    b"txsnap/" | generation (8)              the state before the first record of that
                                             generation's log
    b"txlog/"  | generation (8) | seq (8)    one log record

The log appends each batch of records as one write function: the store's group commit
merges those of concurrent callers, so a burst of transaction calls costs one database
commit, as a burst of publishes does. Store writes commit in the order they were
submitted and records are submitted under the manager's lock, so a record is durable
once any later one is. A failed write makes the log *failed* (fail-stop), as a failed
``fdatasync`` does for the file log.

A one-request transaction's commit record goes into the store write of its messages
instead (:meth:`StoreLog.append_carried`): that write puts every record not yet
committed up to the commit, so it commits them in log order, and the write functions
already queued for some of them put the same keys again later, which changes nothing.

Recovery, rotation and snapshots follow :mod:`tidings.tx.durable`: replay from the
newest snapshot, then write a fresh snapshot under a new generation and drop
everything older in the same write. Unlike the file log's, a rotation waits for no
write under the manager's lock: the snapshot's write waits for the older records,
outside it.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import struct
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from functools import partial

from tidings.errors import LeaseLost, LogFailed, OutcomeUnknown, ServiceUnavailable, TidingsError
from tidings.store.backend import Store, WriteView
from tidings.tx.records import decode_record
from tidings.tx.snapshot import decode_state, encode_state
from tidings.tx.state import StateImage, TxStateMachine

__all__ = ["StoreLog", "StoreTxStorage"]

log = logging.getLogger(__name__)

_TABLE = "tx"
_LOG = b"txlog/"
_SNAP = b"txsnap/"
_U64 = struct.Struct(">Q")
_U64X2 = struct.Struct(">QQ")


def _log_key(generation: int, seq: int) -> bytes:
    return _LOG + _U64X2.pack(generation, seq)


def _snap_key(generation: int) -> bytes:
    return _SNAP + _U64.pack(generation)


def _put_records(items: list[tuple[bytes, bytes]], view: WriteView) -> None:
    view.put_many(_TABLE, items, append=True)


class StoreLog:
    """The write-ahead log on a :class:`~tidings.store.backend.Store`: the interface of
    :class:`~tidings.tx.log.WriteAheadLog`, with the store's group commit."""

    def __init__(self, store: Store, generation: int) -> None:
        self._store = store
        self.generation = generation
        self._cond = threading.Condition(threading.Lock())
        self._appended = 0
        self._durable = 0
        #: Keys and payloads of the records after ``_durable``: what a write may carry.
        self._unsynced: deque[tuple[bytes, bytes]] = deque()
        self._failed: BaseException | None = None
        #: The last record submitted when the log failed (what may still commit).
        self._failed_at = 0
        self._closed = False
        self._waiters: list[tuple[int, int, Future[None]]] = []
        self._tickets = itertools.count()
        #: Called once, with the error, when the log stops after a failed write (from
        #: the thread that saw the failure; it must not block).
        self.on_failed: Callable[[BaseException], None] | None = None

    @property
    def durable(self) -> int:
        """Sequence number of the last record known committed."""
        return self._durable

    @property
    def tail(self) -> int:
        """Sequence number of the last appended record."""
        return self._appended

    @property
    def failed(self) -> bool:
        """The log stopped after a failed write."""
        return self._failed is not None

    def append(self, payloads: list[bytes]) -> int:
        """Submit ``payloads`` (in order) to the store; returns the sequence to sync on."""
        with self._cond:
            self._check()
            first = self._appended + 1
            self._appended += len(payloads)
            seq = self._appended
            items = [(_log_key(self.generation, first + i), p) for i, p in enumerate(payloads)]
            self._unsynced.extend(items)
            # Submitted under the lock: the store commits in submission order, so the
            # order of sequence numbers is the order of commits.
            future = self._store.submit(partial(_put_records, items))
        # Outside the lock: a store that commits at once runs the callback right here.
        future.add_done_callback(partial(self._committed, seq))
        return seq

    def append_carried(self, payloads: list[bytes]) -> tuple[int, list[tuple[bytes, bytes]]]:
        """Append ``payloads`` without a write of their own: returns their last sequence
        number and the ``tx`` table items of every record not yet committed up to it,
        for the caller's store write to put; then :meth:`carried` or :meth:`fail`."""
        with self._cond:
            self._check()
            first = self._appended + 1
            self._appended += len(payloads)
            self._unsynced.extend(
                (_log_key(self.generation, first + i), p) for i, p in enumerate(payloads)
            )
            return self._appended, list(self._unsynced)

    def carried(self, first: int, seq: int) -> None:
        """The store write carrying the records up to ``seq`` has committed."""
        self._advance(seq, None)

    def fail(self, error: BaseException) -> None:
        """Stop the log: a write carrying records failed after memory moved on."""
        self._advance(0, error)

    def sync(self, seq: int) -> None:
        """Return once every record up to ``seq`` is committed (or raise LogFailed)."""
        with self._cond:
            while self._durable < seq:
                self._check(seq)
                self._cond.wait()
            self._check(seq)

    def sync_future(self, seq: int) -> Future[None]:
        """:meth:`sync` without blocking."""
        future: Future[None] = Future()
        future.set_running_or_notify_cancel()
        with self._cond:
            if self._failed is None and not self._closed and self._durable >= seq:
                future.set_result(None)
                return future
            try:
                self._check(seq)
            except (LogFailed, LeaseLost, OutcomeUnknown) as exc:
                future.set_exception(exc)
                return future
            heapq.heappush(self._waiters, (seq, next(self._tickets), future))
        return future

    def rotate(self, generation: int) -> None:
        """Append under ``generation`` from now on. The caller holds the manager's lock,
        so nothing is appended meanwhile.

        It does not wait for the records so far to be committed: that waited for the
        store, under the manager's lock, which the server's event loop takes (a slow
        PostgreSQL stalled every request). Nothing needs it here: keys order records
        by generation and sequence, the store commits them in the order they were
        submitted, and recovery replays every generation from its snapshot's on. The
        snapshot's write waits for them instead (:meth:`StoreTxStorage.finish_snapshot`),
        since it deletes the older generations' records."""
        with self._cond:
            self._check()
            self.generation = generation

    def close(self) -> None:
        """Wait for what was appended, then refuse further calls; idempotent."""
        with self._cond:
            while self._durable < self._appended and self._failed is None:
                self._cond.wait()
            self._closed = True
            waiters, self._waiters = self._waiters, []
            durable = self._durable
            self._cond.notify_all()
        for seq, _, future in waiters:
            if seq <= durable:
                future.set_result(None)
            else:
                future.set_exception(LogFailed("transaction log is closed"))

    def _check(self, seq: int | None = None) -> None:
        """Raise if the log failed (or closed); ``seq``: the caller waits for the
        records up to it, submitted before the failure where it is past the last
        record known committed and not past the last submitted then."""
        if self._failed is not None:
            waiting = seq is not None and self._durable < seq <= self._failed_at
            raise _failure(self._failed, waiting=waiting)
        if self._closed:
            raise LogFailed("transaction log is closed")

    def _committed(self, seq: int, future: Future[None]) -> None:
        self._advance(seq, future.exception())

    def _advance(self, seq: int, exc: BaseException | None) -> None:
        # A write holding the records up to ``seq`` committed (or failed: ``exc``).
        ready: list[tuple[int, Future[None]]] = []
        first_failure = False
        with self._cond:
            if exc is not None:
                if self._failed is None:
                    log.error("transaction log write failed; refusing further changes: %s", exc)
                    first_failure = True
                    self._failed_at = self._appended
                self._failed = exc
                ready = [(s, f) for s, _, f in self._waiters]
                self._waiters.clear()
            else:
                if seq > self._durable:
                    for _ in range(min(seq - self._durable, len(self._unsynced))):
                        self._unsynced.popleft()
                    self._durable = seq
                while self._waiters and self._waiters[0][0] <= self._durable:
                    s, _, f = heapq.heappop(self._waiters)
                    ready.append((s, f))
            self._cond.notify_all()
        for _, waiter in ready:
            if exc is None:
                waiter.set_result(None)
            else:
                waiter.set_exception(_failure(exc, waiting=True))
        if first_failure and exc is not None and self.on_failed is not None:
            try:
                self.on_failed(exc)
            except Exception:
                log.exception("the transaction log's failure handler failed")


def _failure(error: BaseException, *, waiting: bool = False) -> TidingsError:
    """What a call the failed log cannot serve raises: one ``waiting`` for records it
    submitted before the failure, or one refused after it (nothing submitted).

    Where the store's fence refused a write (the leader lease passed to another
    instance), nothing this instance writes can commit any more, so nothing was done:
    a retriable 503 that sends the client to the new leader, not a 500 that reads as
    a bug or a write that may have happened. Where the write's ``COMMIT`` went
    unanswered, a call waiting for it may have taken effect, which only
    ``OutcomeUnknown`` says."""
    if isinstance(error, LeaseLost):
        return LeaseLost(error.message)
    if waiting and isinstance(error, OutcomeUnknown):
        return OutcomeUnknown(f"transaction log write failed: {error.message}")
    return LogFailed(f"transaction log write failed: {error}")


class StoreTxStorage:
    """Recovery, rotation and snapshots of the transaction state in a store's ``tx``
    table: what :class:`~tidings.tx.durable.TxStorage` does with files."""

    def __init__(self, store: Store, *, history_size: int = 100_000) -> None:
        self._store = store
        self._history_size = history_size
        self._wal: StoreLog | None = None
        self.generation = 0
        #: The last record of the generations before the current one (rotated()).
        self._rotated_after = 0

    @property
    def wal(self) -> StoreLog:
        """The open log."""
        if self._wal is None:
            raise ServiceUnavailable("the transaction log is not open")
        return self._wal

    def open(self) -> TxStateMachine:
        """Recover the state, write it as a fresh snapshot, and open the log."""
        state, last = self._recover()
        self.generation = last + 1
        self._store.apply(partial(self._snapshot_fn, self.generation, state.export()))
        self._wal = StoreLog(self._store, self.generation)
        return state

    def new_log(self) -> tuple[int, int]:
        """The next generation, for ``wal.rotate`` (nothing to create beforehand)."""
        return self.generation + 1, self.generation + 1

    def rotated(self, generation: int) -> None:
        """Note that the log now appends under ``generation`` (under the manager's lock:
        every record appended so far belongs to the generations before)."""
        self.generation = generation
        self._rotated_after = self.wal.tail

    def finish_snapshot(self, generation: int, image: StateImage) -> None:
        """Write the snapshot for ``generation`` and drop the records it covers, once
        they are committed: the write that deletes them must not go before one of them
        (or come at all where one failed: the log then stopped, and this raises)."""
        self.wal.sync(self._rotated_after)
        self._store.apply(partial(self._snapshot_fn, generation, image))

    def close(self) -> None:
        """Wait for the log, then close it; idempotent."""
        if self._wal is not None:
            try:
                self._wal.close()
            finally:
                self._wal = None

    def _snapshot_fn(self, generation: int, image: StateImage, view: WriteView) -> None:
        # One write: the snapshot and the removal of what it makes obsolete.
        view.put(_TABLE, _snap_key(generation), encode_state(image))
        view.delete_range(_TABLE, _snap_key(0), _snap_key(generation))
        view.delete_range(_TABLE, _log_key(0, 0), _log_key(generation, 0))

    def _recover(self) -> tuple[TxStateMachine, int]:
        with self._store.read() as view:
            newest = view.last_below(_TABLE, _SNAP + b"\xff" * 9, _SNAP)
            base = 0
            if newest is None:
                state = TxStateMachine(self._history_size)
            else:
                (base,) = _U64.unpack(newest[0][len(_SNAP) :])
                state = TxStateMachine.from_image(decode_state(newest[1]), self._history_size)
            last = base
            replayed = 0
            for key, payload in view.scan(_TABLE, _log_key(base, 0), _LOG + b"\xff" * 17):
                generation, _ = _U64X2.unpack(key[len(_LOG) :])
                last = max(last, generation)
                state.apply(decode_record(payload))
                replayed += 1
        unlogged = state.invalidate_unlogged()
        log.info(
            "transaction state recovered from the store (snapshot %d, %d log records, "
            "%d reserved pointers invalidated): %d in progress, %d invalid, "
            "last write pointer %d",
            base,
            replayed,
            len(unlogged),
            len(state.in_progress),
            len(state.invalid),
            state.last_write_pointer,
        )
        return state, last
