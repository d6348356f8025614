"""The transaction manager: the state machine, made thread-safe, durable and timed.

Every call runs the same way (``_run``): under one lock, read the clock, let the state
machine decide and apply, and append the resulting records to the log; then, outside the
lock, wait for the group commit that covers them (``_run_future``, for the
``*_future`` variants, instead returns a future that resolves then: no thread waits,
which is what the server's event loop needs). Calls that change nothing (errors,
``state()``) wait for the records already appended, so nothing a caller is told rests on
a change that could still be lost.

A begin is the exception: it is answered without waiting for its record when its
pointer lies in a reservation already on disk (``Reserve``; recovery invalidates the
reserved pointers the log never names, so a begin lost in a crash leaves an invalid
pointer, never a reused one) and its snapshot rests on nothing that could still be lost
(a commit or abort not yet durable is shown to it as still in progress). That takes
one of the log's flushes off every transaction. A background thread runs the timeout sweep and takes
snapshots when the log has grown by ``snapshot_every`` records.

``commit_in_write()`` is the one-write commit of a one-request transaction (where one
process runs both services): the commit is decided inside the store write that holds
the transaction's messages, last in it, and its record is carried by that write
(``append_carried`` of :class:`~tidings.tx.log.WriteAheadLog` or, with the log in the
store, of :class:`~tidings.tx.stored.StoreLog`), so the store's one commit makes
messages and commit durable together: one fsync, not two.

``snapshot()`` is the cheap read for read-committed consumers: a read-only snapshot from
memory that waits only for records that change what a reader sees (anything but a
begin), and with ``wait=False`` does not wait at all. Listeners
(:meth:`TransactionManager.add_listener`) hear of every durable end of a transaction:
commit, abort, invalidation, timeout, fencing, prune.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import os
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, NamedTuple, TypeVar

from tidings.clock import Clock, SystemClock
from tidings.errors import (
    BadRequest,
    BeginIdConflict,
    InvalidProducer,
    ServerError,
    ServiceUnavailable,
    StoreFull,
    StoreUnavailable,
    TidingsError,
    TimeoutTooLarge,
    TransactionTimedOut,
)
from tidings.names import INT64_MAX
from tidings.store.backend import Store, WriteView
from tidings.structs import ProducerInfo, Transaction, TransactionState
from tidings.tx.config import TxConfig
from tidings.tx.durable import TxStorage
from tidings.tx.log import WriteAheadLog
from tidings.tx.records import (
    Abort,
    Begin,
    Commit,
    Invalidate,
    Outcome,
    Prune,
    Release,
    Reserve,
    encode_record,
)
from tidings.tx.state import Result, TxStateMachine
from tidings.tx.stored import StoreLog, StoreTxStorage

__all__ = [
    "Begun",
    "Ending",
    "OneWriteCommit",
    "OpenTransaction",
    "TransactionDetails",
    "TransactionManager",
]

log = logging.getLogger(__name__)

_T = TypeVar("_T")
_U = TypeVar("_U")

#: Records that change nothing a reader sees.
_NOT_VISIBLE = frozenset({Begin, Reserve, Release})
#: Records that end the transaction they name.
_ENDS = frozenset({Commit, Abort, Invalidate})

#: How long ``snapshot(wait=False)`` may wait for the lock (seconds): longer than any
#: decision takes, shorter than a log flush.
_NOWAIT_LOCK_TIMEOUT = 0.0005
#: How often a one-write commit, waiting for the lock on the store's writer, looks
#: whether a log rotation holds it (seconds).
_ROTATION_POLL = 0.0005
#: Begin ids of ended transactions kept (the newest), so that a late resend is told how
#: its transaction ended rather than beginning another: a resend comes within a
#: client's retries (seconds), and each costs ~200 bytes.
_ENDED_BEGIN_IDS = 10_000


class Begun(NamedTuple):
    """A begin's answer: the snapshot, and whether a begin id sent before named it."""

    transaction: Transaction
    #: The begin id named a transaction begun before; nothing new was begun.
    again: bool


@dataclass(frozen=True, slots=True)
class _Keyed:
    """An open transaction begun with a begin id: its snapshot as begun, and what the
    begin asked for (a resend must ask for the same)."""

    transaction: Transaction
    timeout_ms: int
    transactional_id: str | None
    epoch: int | None


@dataclass(frozen=True, slots=True)
class OpenTransaction:
    """A transaction in progress as :meth:`TransactionManager.details` shows it."""

    write_pointer: int
    #: When it expires (ms).
    expires_at: int
    #: When it began (ms); None if it began before this process started.
    began_at: int | None
    #: Who began it (None: no transactional id), with the epoch it began under.
    producer: ProducerInfo | None


@dataclass(frozen=True, slots=True)
class Ending:
    """How an abort or invalidation left a transaction."""

    #: ``ABORTED`` or one of the invalid outcomes (invalidated, timed out, fenced,
    #: unlogged): what the call did, or how the transaction had ended before it.
    outcome: Outcome
    #: The transaction had ended so before the call, which changed nothing.
    already: bool


@dataclass(frozen=True, slots=True)
class TransactionDetails:
    """The state plus what it does not say: who holds each open transaction and since
    when, and every registered transactional id. For operators (the web console)."""

    state: TransactionState
    open: tuple[OpenTransaction, ...]
    producers: tuple[ProducerInfo, ...]
    #: The manager's clock when this was read (ms).
    now: int


class TransactionManager:
    """Tephra-style transaction service with KIP-98 transactional ids; thread-safe.

    ``data_dir=None`` keeps everything in memory (tests, examples); otherwise every
    acknowledged change is in the write-ahead log under ``data_dir`` before the call
    returns. With ``store`` instead (a shared PostgreSQL store, say), the log and its
    snapshots are kept in the store's ``tx`` table (:mod:`tidings.tx.stored`), so
    another process can take over the state from there. Call :meth:`start` before use
    and :meth:`close` after (or use ``with``).
    """

    def __init__(
        self,
        data_dir: str | os.PathLike[str] | None,
        config: TxConfig = TxConfig(),  # noqa: B008  (frozen, so sharing it is safe)
        clock: Clock | None = None,
        *,
        store: Store | None = None,
        message_store: Store | None = None,
    ) -> None:
        if data_dir is not None and store is not None:
            raise ValueError("keep the transaction state in data_dir or in store, not both")
        if message_store is not None and data_dir is None:
            raise ValueError("message_store carries the tail of a log in data_dir")
        self.data_dir = None if data_dir is None else Path(data_dir)
        self.store = store
        #: The messaging service's store in this process: its writes may carry the log's
        #: tail (commit_in_write), so recovery reads it too.
        self.message_store = message_store
        #: True while take_snapshot rotates the log (it waits for held records under
        #: the lock, so a one-write commit on the store's writer must not wait for it).
        self._rotating = False
        self.config = config
        self._clock: Clock = clock if clock is not None else SystemClock()
        self._lock = threading.Lock()
        self._state = TxStateMachine(config.history_size)
        self._storage: TxStorage | StoreTxStorage | None = None
        self._wal: WriteAheadLog | StoreLog | None = None
        self._started = False
        self._closed = False
        self._since_snapshot = 0
        self._snapshot_mutex = threading.Lock()
        self._wake = threading.Condition()
        self._snapshot_due = False
        self._stopping = False
        self._thread: threading.Thread | None = None
        #: Log sequence of the last record that changes what a snapshot shows (not a
        #: begin), and a lower bound of what is known durable; see snapshot().
        self._visible_seq = 0
        self._synced_seq = 0
        self._listeners: list[Callable[[], None]] = []
        self._on_log_failed: Callable[[BaseException], None] | None = None
        # For begins answered before their record is durable (see the module doc), all
        # under the lock: commits and aborts whose records may not be on disk yet as
        # (log sequence, write pointer), Reserve records likewise as (sequence, upto),
        # the highest reserved pointer known durable, and the last prune's sequence.
        self._unsynced_ends: deque[tuple[int, int]] = deque()
        self._unsynced_reserves: deque[tuple[int, int]] = deque()
        self._durable_reserved = 0
        self._prune_seq = 0
        #: Begin time (ms) of the transactions begun by this process, for details();
        #: memory only (the log keeps expiries), trimmed by every timeout sweep.
        self._began: dict[int, int] = {}
        #: Begin ids (idempotency keys of begins) of open transactions, and the write
        #: pointer -> begin id map that forgets one as its transaction ends; then the
        #: newest ended ones (-> write pointer). Memory only: see begin().
        self._begin_ids: dict[str, _Keyed] = {}
        self._begin_id_of: dict[int, str] = {}
        self._ended_begin_ids: OrderedDict[str, int] = OrderedDict()

    # -- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        """Recover from ``data_dir`` and start the sweeper; idempotent."""
        with self._lock:
            if self._closed:
                raise ServiceUnavailable("the transaction manager was closed")
            if self._started:
                return
            if self.data_dir is not None:
                storage = TxStorage(
                    self.data_dir,
                    sync=self.config.sync,
                    history_size=self.config.history_size,
                    store=self.message_store,
                )
                self._state = storage.open()
                self._storage, self._wal = storage, storage.wal
            elif self.store is not None:
                stored = StoreTxStorage(self.store, history_size=self.config.history_size)
                self._state = stored.open()
                self._storage, self._wal = stored, stored.wal
                stored.wal.on_failed = self._on_log_failed
            self._started = True
        self._thread = threading.Thread(
            target=self._maintain, name="tidings-tx-maintenance", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        """Stop the sweeper, flush the log and release ``data_dir``; idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._wal is not None:
                # Every begin's record precedes this one, so the next start need not
                # invalidate the unused rest of the reservation. Best effort: a log
                # that failed leaves that to recovery.
                with contextlib.suppress(TidingsError):
                    self._append(self._wal, self._state.release())
        with self._wake:
            self._stopping = True
            self._wake.notify_all()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        with self._snapshot_mutex:
            if self._storage is not None:
                self._storage.close()

    def __enter__(self) -> TransactionManager:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- transactions --------------------------------------------------------------------

    def begin(
        self,
        timeout: float | None = None,
        *,
        transactional_id: str | None = None,
        epoch: int | None = None,
        begin_id: str | None = None,
    ) -> Transaction:
        """Start a transaction; its snapshot says what it may see (seconds of ``timeout``).

        ``begin_id`` makes the begin safe to send again when its answer was lost: while
        the transaction it began is open, a begin with the same id answers that
        transaction again (its snapshot as first answered) and begins nothing;
        once it ended, the begin fails as a commit would (410 how it ended, or
        :class:`TransactionTimedOut` past its expiry); with other ``timeout``,
        ``transactional_id`` or ``epoch`` it fails with :class:`BeginIdConflict`.
        The ids are kept in memory: after a restart a resend begins a new transaction.
        """
        timeout_ms = self._timeout_ms(timeout)
        result = self._run(
            self._begin_op(timeout_ms, transactional_id, epoch, begin_id), early=True
        )
        assert result.transaction is not None
        return result.transaction

    def begin_future(
        self,
        timeout: float | None = None,
        *,
        transactional_id: str | None = None,
        epoch: int | None = None,
        begin_id: str | None = None,
    ) -> Future[Transaction]:
        """:meth:`begin` without blocking: the future resolves once the begin is durable,
        or carries the error :meth:`begin` would raise."""
        return self._begin_as(_transaction_of, timeout, transactional_id, epoch, begin_id)

    def begin_once_future(
        self,
        timeout: float | None = None,
        *,
        transactional_id: str | None = None,
        epoch: int | None = None,
        begin_id: str | None = None,
    ) -> Future[Begun]:
        """:meth:`begin_future` that also says whether ``begin_id`` named a transaction
        begun before (nothing new was begun: the server counts no begin)."""
        return self._begin_as(_begun, timeout, transactional_id, epoch, begin_id)

    def _begin_as(
        self,
        answer: Callable[[Result], _T],
        timeout: float | None,
        transactional_id: str | None,
        epoch: int | None,
        begin_id: str | None,
    ) -> Future[_T]:
        try:
            timeout_ms = self._timeout_ms(timeout)
        except TidingsError as exc:
            return _failed(exc)
        return self._run_future(
            self._begin_op(timeout_ms, transactional_id, epoch, begin_id), answer, early=True
        )

    def _begin_op(
        self,
        timeout_ms: int,
        transactional_id: str | None,
        epoch: int | None,
        begin_id: str | None,
    ) -> Callable[[int], Result]:
        def op(now: int) -> Result:
            # Under the lock, as every op.
            if begin_id is not None:
                again = self._begun_before(now, begin_id, timeout_ms, transactional_id, epoch)
                if again is not None:
                    return again
            result = self._noted(
                now,
                self._state.begin(
                    now, timeout_ms, transactional_id, epoch, max_open=self.config.max_open
                ),
            )
            tx = result.transaction
            if begin_id is not None and tx is not None:
                # The snapshot as the state machine made it: a resend answered before
                # the commits it shows are durable gets them shown as in progress
                # again (_answer_early), as the first answer did.
                self._begin_ids[begin_id] = _Keyed(tx, timeout_ms, transactional_id, epoch)
                self._begin_id_of[tx.write_pointer] = begin_id
            return result

        return op

    def _begun_before(
        self,
        now: int,
        begin_id: str,
        timeout_ms: int,
        transactional_id: str | None,
        epoch: int | None,
    ) -> Result | None:
        # Under the lock: the answer to a begin whose id began a transaction already
        # (None: it did not, or too long ago to remember). The client never saw that
        # transaction's snapshot (its answer was lost), so the snapshot it gets now is
        # the first one it uses: the original, since the pointer was handed out then,
        # and a snapshot taken later could show transactions that began after it.
        keyed = self._begin_ids.get(begin_id)
        if keyed is None:
            ended = self._ended_begin_ids.get(begin_id)
            return None if ended is None else Result(error=self._ended_again(begin_id, ended))
        wp = keyed.transaction.write_pointer
        if (keyed.timeout_ms, keyed.transactional_id, keyed.epoch) != (
            timeout_ms,
            transactional_id,
            epoch,
        ):
            return Result(
                error=BeginIdConflict(
                    f"beginId {begin_id!r} began transaction {wp} with another timeout, "
                    "transactionalId or epoch; nothing was begun (draw a new id per begin)"
                )
            )
        entry = self._state.in_progress.get(wp)
        if entry is None:  # ended, and the sweep has not moved its id yet (fenced)
            return Result(error=self._ended_again(begin_id, wp))
        if now >= entry.expiry_ms:
            return Result(
                error=TransactionTimedOut(
                    f"beginId {begin_id!r} began transaction {wp}, which timed out"
                )
            )
        return Result(transaction=keyed.transaction, again=True)

    def _ended_again(self, begin_id: str, write_pointer: int) -> TidingsError:
        error = self._state.ended_error(write_pointer, "begin again")
        reason = error.message.partition(": ")[2]  # past "cannot ... transaction N"
        return type(error)(f"beginId {begin_id!r} began transaction {write_pointer}; {reason}")

    def _forget_begin_id(self, write_pointer: int) -> None:
        # Under the lock: the transaction ended; keep its id among the newest ended.
        begin_id = self._begin_id_of.pop(write_pointer, None)
        if begin_id is None:
            return
        self._begin_ids.pop(begin_id, None)
        ended = self._ended_begin_ids
        ended[begin_id] = write_pointer
        while len(ended) > _ENDED_BEGIN_IDS:
            ended.popitem(last=False)

    def commit(
        self,
        write_pointer: int,
        changes: Iterable[bytes] = (),
        *,
        transactional_id: str | None = None,
        epoch: int | None = None,
    ) -> None:
        """Commit, unless a transaction that committed since this one began wrote a key of
        ``changes`` (:class:`~tidings.errors.TransactionConflict`; it stays in progress)."""
        _check_pointer(write_pointer)
        keys = _materialize(changes)
        self._run(lambda now: self._state.commit(now, write_pointer, keys, transactional_id, epoch))

    def commit_future(
        self,
        write_pointer: int,
        changes: Iterable[bytes] = (),
        *,
        transactional_id: str | None = None,
        epoch: int | None = None,
    ) -> Future[None]:
        """:meth:`commit` without blocking: resolves (to None) once the commit is durable,
        or carries the error :meth:`commit` would raise."""
        try:
            _check_pointer(write_pointer)
            keys = _materialize(changes)
        except TidingsError as exc:
            return _failed(exc)
        return self._run_future(
            lambda now: self._state.commit(now, write_pointer, keys, transactional_id, epoch),
            _none,
        )

    def commit_in_write(
        self,
        write_pointer: int,
        *,
        transactional_id: str | None = None,
        epoch: int | None = None,
    ) -> OneWriteCommit | None:
        """The commit of a transaction without change keys as the last step of a store
        write (the write that publishes its messages), made durable by that write's
        commit: one fsync for messages and commit. None where this manager cannot (no
        ``message_store`` for a file log, or no log): commit with :meth:`commit_future`
        after the publish. With the log in the store (``store``), the publish must be a
        write of that same store.

        Run the returned step last inside the write function (``step(view)``) and pass
        that write's future to :meth:`OneWriteCommit.watch`. See :class:`OneWriteCommit`.
        """
        wal = self._wal
        # A file log needs the messages' store to carry its tail; a log in the store
        # (PostgreSQL) is written by store writes anyway.
        if not (
            (self.message_store is not None and isinstance(wal, WriteAheadLog))
            or isinstance(wal, StoreLog)
        ):
            return None
        _check_pointer(write_pointer)
        return OneWriteCommit(self, write_pointer, transactional_id, epoch)

    def abort(
        self,
        write_pointer: int,
        *,
        transactional_id: str | None = None,
        epoch: int | None = None,
    ) -> None:
        """End a transaction whose writes the client has rolled back; idempotent."""
        _check_pointer(write_pointer)
        self._run(lambda now: self._state.abort(write_pointer, transactional_id, epoch))

    def abort_future(
        self,
        write_pointer: int,
        *,
        transactional_id: str | None = None,
        epoch: int | None = None,
    ) -> Future[bool]:
        """:meth:`abort` without blocking (see :meth:`commit_future`); resolves to True
        if this call aborted the transaction, False if it had ended so already."""
        try:
            _check_pointer(write_pointer)
        except TidingsError as exc:
            return _failed(exc)
        return self._run_future(
            lambda now: self._state.abort(write_pointer, transactional_id, epoch), _applied
        )

    def abort_ending_future(
        self,
        write_pointer: int,
        *,
        transactional_id: str | None = None,
        epoch: int | None = None,
    ) -> Future[Ending]:
        """:meth:`abort_future` that also says how the transaction stands: aborted by
        this call, aborted before, or invalid already (its data is skipped anyway, so
        the abort succeeds without changing anything)."""
        try:
            _check_pointer(write_pointer)
        except TidingsError as exc:
            return _failed(exc)
        return self._run_future(
            lambda now: self._state.abort(write_pointer, transactional_id, epoch), _ending
        )

    def invalidate_ending_future(self, write_pointer: int) -> Future[Ending]:
        """:meth:`invalidate_future` that also says how the transaction stands:
        invalidated by this call, or invalid before (and why)."""
        try:
            _check_pointer(write_pointer)
        except TidingsError as exc:
            return _failed(exc)
        return self._run_future(lambda now: self._state.invalidate(write_pointer), _ending)

    def invalidate(self, write_pointer: int) -> None:
        """Move an in-progress transaction to the invalid list; idempotent."""
        _check_pointer(write_pointer)
        self._run(lambda now: self._state.invalidate(write_pointer))

    def invalidate_future(self, write_pointer: int) -> Future[bool]:
        """:meth:`invalidate` without blocking (see :meth:`commit_future`); resolves to
        True if this call invalidated the transaction, False if it had ended so already."""
        try:
            _check_pointer(write_pointer)
        except TidingsError as exc:
            return _failed(exc)
        return self._run_future(lambda now: self._state.invalidate(write_pointer), _applied)

    def check_writable(self, write_pointer: int, action: str = "publish under") -> None:
        """Raise unless ``write_pointer`` is a transaction in progress and not past its
        expiry: :class:`TransactionTimedOut`, :class:`TransactionCommitted`,
        :class:`TransactionAborted`, :class:`TransactionInvalid` or
        :class:`TransactionNotFound`, as a commit would. ``action`` is what was tried,
        for the error's text: "cannot {action} transaction N: ...".

        The messaging core calls it inside a publish's write function (on the store's
        writer thread), so no entry is published under a pointer that has ended: a late
        write into a committed transaction would appear in it after the fact, and one
        under an invalid pointer would count as committed once that pointer is pruned.
        It reads the in-memory state without the manager's lock (a decision is in
        memory before it is durable, so an ended transaction is refused at once).
        """
        entry = self._state.in_progress.get(write_pointer)
        if entry is None:
            raise self._state.ended_error(write_pointer, action)
        if self._clock.now_ms() >= entry.expiry_ms:
            raise TransactionTimedOut(f"cannot {action} transaction {write_pointer}: it timed out")

    def has_committed(self, write_pointer: int) -> bool:
        """True if ``write_pointer`` committed: its entries are the topic's for good.

        The messaging core asks inside a rollback's write function (on the store's
        writer thread, as :meth:`check_writable`), so a rollback that comes after the
        commit (a client that lost the commit's answer, or anyone else who names the
        pointer) leaves the committed entries as they are. A transaction too old for
        the history counts as committed if readers see it (not invalid, at most the
        read pointer): rolling it back would change what they have read.
        """
        state = self._state
        if write_pointer in state.in_progress:
            return False
        outcome = state.outcome(write_pointer)
        if outcome is not None:
            return outcome is Outcome.COMMITTED
        return 0 < write_pointer <= state.read_pointer

    def began_under(self, write_pointer: int) -> str | None:
        """The transactional id the open transaction ``write_pointer`` was begun under;
        None if it was begun without one, or is not open (a commit or abort of it then
        answers why). The server asks before it lets a principal end a transaction
        without naming its transactional id (docs/security.md).

        :class:`InvalidProducer` if its producer id has no registration (an id with an
        open transaction is never forgotten, so this does not happen): nobody can be
        said to hold it."""
        with self._lock:
            self._check_running()
            entry = self._state.in_progress.get(write_pointer)
            if entry is None or not entry.producer_id:
                return None
            info = self._state.producers.of_producer(entry.producer_id)
        if info is None:
            raise InvalidProducer(
                f"transaction {write_pointer} was begun by producer id {entry.producer_id}, "
                "which no transactional id holds"
            )
        return info.transactional_id

    @property
    def failed(self) -> bool:
        """The transaction log stopped (a write or fsync failed): every call fails
        until the service is restarted (fail-stop)."""
        wal = self._wal
        return wal is not None and wal.failed

    def state(self) -> TransactionState:
        """Read pointer, last write pointer, in-progress expiries (ms) and invalid list."""
        with self._lock:
            self._check_running()
            view = self._state.view()
            wal = self._wal
            seq = 0 if wal is None else wal.tail
        if wal is not None:
            wal.sync(seq)  # report nothing that could still be lost
        return view

    def details(self) -> TransactionDetails:
        """:meth:`state` plus each open transaction's producer and begin time, and every
        registered transactional id with its current epoch (read from memory)."""
        with self._lock:
            self._check_running()
            state = self._state
            now = self._clock.now_ms()
            producers = {info.producer_id: info for info in state.producers}
            open_ = tuple(
                OpenTransaction(
                    wp,
                    tx.expiry_ms,
                    self._began.get(wp),
                    None
                    if not tx.producer_id or tx.producer_id not in producers
                    else dataclasses.replace(producers[tx.producer_id], epoch=tx.epoch),
                )
                for wp, tx in state.in_progress.items()
            )
            view = state.view()
            wal = self._wal
            seq = 0 if wal is None else wal.tail
        if wal is not None:
            wal.sync(seq)  # as state(): report nothing that could still be lost
        listed = tuple(sorted(producers.values(), key=lambda p: p.transactional_id))
        return TransactionDetails(view, open_, listed, now)

    def snapshot(self, *, wait: bool = True) -> Transaction | None:
        """A read-only snapshot of what is committed now, from memory: no log write.

        It sees what a transaction begun now would see (read pointer, invalid and
        in-progress lists); its write pointer is ``2**63 - 1``, which no transaction
        ever gets. It never rests on a commit, abort or invalidation that is not yet
        durable: it waits for that group commit, or with ``wait=False`` returns None
        instead (retry with ``wait=True`` off the event loop). Begins not yet durable
        may be in it: they only add in-progress pointers, which block readers anyway.
        """
        # Without waiting, do not queue behind a log rotation (it flushes under the lock).
        if not self._lock.acquire(timeout=-1 if wait else _NOWAIT_LOCK_TIMEOUT):
            return None
        try:
            self._check_running()
            state = self._state
            tx = Transaction(
                state.read_pointer, INT64_MAX, state.invalid_ids(), tuple(state.in_progress)
            )
            wal = self._wal
            seq = self._visible_seq
        finally:
            self._lock.release()
        if wal is None or self._synced_seq >= seq:
            return tx
        if not wait:
            return None
        wal.sync(seq)
        self._note_synced(seq)
        return tx

    def on_log_failed(self, fn: Callable[[BaseException], None] | None) -> None:
        """With the log kept in ``store``: call ``fn(error)`` once when the log stops
        after a failed write (fail-stop: every later call fails until the manager is
        started again from what the store holds). Call before :meth:`start`.

        It runs on the thread that saw the failure (the store's writer, or a request's
        worker): it must not block. Its exceptions are logged and ignored.
        """
        self._on_log_failed = fn

    def add_listener(self, fn: Callable[[], None]) -> None:
        """Call ``fn()`` after every durable change that ends transactions or changes
        what a snapshot shows (commit, abort, invalidate, timeout, fencing, prune).

        It runs on the thread of the call that made the change (a request's worker, or
        the sweeper), or for the ``*_future`` calls on the log's flusher thread: it must
        not block. Its exceptions are logged and ignored.
        """
        self._listeners = [*self._listeners, fn]

    def register_producer(self, transactional_id: str) -> ProducerInfo:
        """Register (again) a transactional id: new epoch, predecessor fenced (KIP-98)."""
        result = self._run(lambda now: self._state.register(transactional_id))
        assert result.producer is not None
        return result.producer

    def prune(self, *, below: int | None = None, ids: Iterable[int] = ()) -> list[int]:
        """Drop invalid ids below ``below`` and/or those in ``ids``; returns the removed."""
        wanted = _materialize(ids)
        return list(self._run(lambda now: self._state.prune(below, wanted)).ids)

    def expire(self) -> list[int]:
        """One timeout sweep: expired in-progress transactions become invalid, and
        transactional ids unused for ``producer_expiry`` seconds are forgotten."""
        expired = list(self._run(lambda now: self._state.expire(now)).ids)
        idle_ms = round(self.config.producer_expiry * 1000)
        with self._lock:
            self._check_running()
            forgotten = self._state.expire_producers(self._clock.now_ms(), idle_ms)
            in_progress = self._state.in_progress
            for wp in [wp for wp in self._began if wp not in in_progress]:
                del self._began[wp]
            # Fencing ends transactions inside its Register record: caught here.
            for wp in [wp for wp in self._begin_id_of if wp not in in_progress]:
                self._forget_begin_id(wp)
        if forgotten:
            log.info("forgot %d idle transactional ids: %s", len(forgotten), forgotten[:10])
        return expired

    def take_snapshot(self) -> None:
        """Write a snapshot and start a new log (the old one is deleted)."""
        with self._snapshot_mutex:
            storage = self._storage
            if storage is None:
                self._check_running()
                return
            if isinstance(storage, StoreTxStorage):
                generation, target = storage.new_log()
            else:
                generation, path = storage.new_log()
            # Rotating the file log waits for held records and flushes under the lock
            # (the log in the store waits for nothing there: finish_snapshot waits for
            # its records, outside the lock); one-write commits that would wait for the
            # lock meanwhile take the two-write path instead.
            self._rotating = True
            try:
                with self._lock:
                    self._check_running()
                    image = self._state.export()
                    if isinstance(storage, StoreTxStorage):
                        storage.wal.rotate(target)
                    else:
                        storage.wal.rotate(path)
                    storage.rotated(generation)
                    self._since_snapshot = 0
            finally:
                self._rotating = False
            storage.finish_snapshot(generation, image)

    # -- the one way every call runs -----------------------------------------------------

    def _noted(self, now: int, result: Result) -> Result:
        # Under the lock (every op runs there): a begin's time, for details().
        if result.transaction is not None:
            self._began[result.transaction.write_pointer] = now
        return result

    def _run(self, op: Callable[[int], Result], *, early: bool = False) -> Result:
        # Blocking: the caller's thread takes part in the group commit itself (leads a
        # flush or follows one), which is a thread hop cheaper than waiting on a future.
        result, wal, seq, visible = self._decide(op, early)
        if wal is not None:
            wal.sync(seq)
            self._note_synced(seq)
        return self._finish(result, visible)

    def _run_future(
        self, op: Callable[[int], Result], answer: Callable[[Result], _T], *, early: bool = False
    ) -> Future[_T]:
        # _run without blocking: the future is resolved with ``answer(result)`` (or the
        # error) on the log's flusher thread, after the group commit covering ``op``.
        out: Future[_T] = Future()
        out.set_running_or_notify_cancel()  # what is decided cannot be called off
        try:
            result, wal, seq, visible = self._decide(op, early)
        except BaseException as exc:  # not running, or the log failed (nothing decided)
            out.set_exception(exc)
            return out
        if wal is None:
            _settle(out, lambda: answer(self._finish(result, visible)))
            return out

        def synced(done: Future[None]) -> None:
            error = done.exception()
            if error is not None:
                out.set_exception(error)
                return
            self._note_synced(seq)
            _settle(out, lambda: answer(self._finish(result, visible)))

        wal.sync_future(seq).add_done_callback(synced)
        return out

    def _decide(
        self, op: Callable[[int], Result], early: bool = False
    ) -> tuple[Result, WriteAheadLog | StoreLog | None, int, bool]:
        # Under the lock: decide, apply and append; the caller then waits for ``seq``
        # (``wal`` None: nothing to wait for). ``early``: a begin that may be answered
        # before its record is durable, if _answer_early allows.
        with self._lock:
            self._check_running()
            try:
                result = op(self._clock.now_ms())
            except TidingsError as exc:
                result = Result(error=exc)
            wal = self._wal
            seq = 0 if wal is None else self._append(wal, result)
            visible = any(type(r) not in _NOT_VISIBLE for r in result.records)
            if visible:
                self._visible_seq = seq
                if self._begin_id_of:
                    for record in result.records:
                        if type(record) in _ENDS:
                            self._forget_begin_id(record.write_pointer)  # type: ignore[union-attr]
            if wal is not None:
                self._track(result, seq, wal.durable)
                if early and result.transaction is not None:
                    answered = self._answer_early(result, wal.durable)
                    if answered is not None:
                        if any(type(r) is Reserve for r in result.records):
                            # Extend the reservation on disk before a begin needs it.
                            wal.sync_future(seq)
                        return answered, None, seq, visible
        return result, wal, seq, visible

    def _track(self, result: Result, seq: int, durable: int) -> None:
        # Under the lock: note what the early-answer rule must know about ``result``,
        # and forget what ``durable`` (a lower bound of what is on disk) already covers.
        for record in result.records:
            kind = type(record)
            if kind is Commit or kind is Abort:
                self._unsynced_ends.append((seq, record.write_pointer))  # type: ignore[union-attr]
            elif kind is Reserve:
                self._unsynced_reserves.append((seq, record.upto))  # type: ignore[union-attr]
            elif kind is Prune:
                self._prune_seq = seq
        ends, reserves = self._unsynced_ends, self._unsynced_reserves
        while ends and ends[0][0] <= durable:
            ends.popleft()
        while reserves and reserves[0][0] <= durable:
            self._durable_reserved = max(self._durable_reserved, reserves.popleft()[1])

    def _answer_early(self, result: Result, durable: int) -> Result | None:
        # Under the lock: ``result`` (a begin) adjusted so that it may be answered before
        # its record is durable, or None if it must wait. Its pointer must be reserved on
        # disk (else a crash could hand it out again). Its snapshot must not rest on a
        # change still in flight: a commit or abort not yet durable is shown as in
        # progress (a crash may undo it; either way readers skip its data), a pending
        # prune makes it wait (it would show pointers as valid that may be invalid
        # again after a crash). Invalidations in flight are safe to show: they hide.
        tx = result.transaction
        assert tx is not None
        if tx.write_pointer > self._durable_reserved or self._prune_seq > durable:
            return None
        if not self._unsynced_ends:
            return result
        pending = {wp for _, wp in self._unsynced_ends}
        in_progress = tuple(sorted(pending.union(tx.in_progress)))
        early = dataclasses.replace(tx, in_progress=in_progress)
        return dataclasses.replace(result, transaction=early)

    def _finish(self, result: Result, visible: bool) -> Result:
        # Once its records are durable: tell the listeners, then answer (or raise).
        if visible:
            for fn in self._listeners:
                try:
                    fn()
                except Exception:
                    log.exception("transaction listener %r failed", fn)
        if result.error is not None:
            raise result.error
        return result

    def _note_synced(self, seq: int) -> None:
        # Racy on purpose: every value written was durable, so a lost update only
        # makes snapshot(wait=False) say "not yet" once too often.
        if seq > self._synced_seq:
            self._synced_seq = seq

    def _append(self, wal: WriteAheadLog | StoreLog, result: Result) -> int:
        if not result.records:
            return wal.tail
        seq = wal.append([encode_record(r) for r in result.records])
        self._count_appended(len(result.records))
        return seq

    def _count_appended(self, count: int) -> None:
        # Under the lock: a snapshot is due every ``snapshot_every`` records.
        self._since_snapshot += count
        if self._since_snapshot >= self.config.snapshot_every and not self._snapshot_due:
            with self._wake:
                self._snapshot_due = True
                self._wake.notify_all()

    def _check_running(self) -> None:
        if self._closed:
            raise ServiceUnavailable("the transaction manager is closed")
        if not self._started:
            raise ServiceUnavailable("the transaction manager is not started")

    def _timeout_ms(self, timeout: float | None) -> int:
        if timeout is None:
            timeout = self.config.default_timeout
        if isinstance(timeout, bool) or not isinstance(timeout, int | float):
            raise BadRequest(f"a timeout is a number of seconds, got {timeout!r}")
        if not math.isfinite(timeout) or timeout <= 0 or timeout > self.config.max_timeout:
            raise TimeoutTooLarge(f"timeout {timeout} s is not in (0, {self.config.max_timeout}] s")
        return max(1, round(timeout * 1000))

    # -- background work -----------------------------------------------------------------

    def _maintain(self) -> None:
        interval = self.config.sweep_interval
        next_sweep = time.monotonic() + interval
        while True:
            with self._wake:
                while not self._stopping and not self._snapshot_due:
                    remaining = next_sweep - time.monotonic()
                    if remaining <= 0:
                        break
                    self._wake.wait(remaining)
                if self._stopping:
                    return
                snapshot_due, self._snapshot_due = self._snapshot_due, False
            try:
                if snapshot_due:
                    self.take_snapshot()
                if time.monotonic() >= next_sweep:
                    next_sweep = time.monotonic() + interval
                    expired = self.expire()
                    if expired:
                        log.info("timed out %d transactions: %s", len(expired), expired[:10])
            except Exception as exc:
                # Closed, not started, or the lease lost: nothing more to do here. A
                # store that is full or cannot be reached for now (PostgreSQL
                # restarting) comes back: without another pass, no transaction would
                # time out again until a restart.
                if isinstance(exc, ServiceUnavailable) and not isinstance(
                    exc, StoreFull | StoreUnavailable
                ):
                    return
                log.exception("transaction maintenance failed; retrying in %s s", interval)
                next_sweep = time.monotonic() + interval
                with self._wake:  # back off, also from a snapshot that keeps failing
                    if not self._stopping:
                        self._wake.wait(interval)


class _Deferred(Exception):
    """A one-write commit found the log rotating: nothing was decided or written."""


class OneWriteCommit:
    """A commit made durable by the store write of the transaction's messages.

    ``step(view)`` runs last in that write function, on the store's writer. Under the
    manager's lock it decides the commit as :meth:`TransactionManager.commit` would
    (timeouts, fencing, ended transactions; in place of the publish guard, which would
    refuse the transaction once it is committed) and appends the record to the log
    without a write of its own: a file log holds it (no flush writes it until the
    store write has committed), a log in the store only numbers it. Every record not
    yet durable up to it goes into the write (``tx`` table), so that write's commit
    makes the commit durable with the messages, in log order. If the decision refuses,
    the step raises and the store drops the messages with it: nothing of the
    transaction was written (:attr:`refused`). If the log is rotating the step raises
    without deciding (:attr:`deferred`): publish and commit the usual way.

    Once decided, a failed store write (or a later run of the function that does not
    reach the step) stops the log: memory has the commit, the disk may never.
    The store may run a write function twice (a group is retried when a function in it
    raises); the decision is taken once and the second run puts the same records.
    """

    def __init__(
        self,
        manager: TransactionManager,
        write_pointer: int,
        transactional_id: str | None,
        epoch: int | None,
    ) -> None:
        self._manager = manager
        self.write_pointer = write_pointer
        self._transactional_id = transactional_id
        self._epoch = epoch
        #: The decision refused the commit (its error was raised in the write).
        self.refused = False
        #: The log was rotating; nothing was decided.
        self.deferred = False
        self._decided: tuple[Result, WriteAheadLog | StoreLog, int, int, bool] | None = None
        self._items: list[tuple[bytes, bytes]] = []

    @property
    def decided(self) -> bool:
        """The commit was decided in memory (the write must now commit, or the log stops)."""
        return self._decided is not None

    def __call__(self, view: WriteView) -> None:
        if self._decided is None:
            self._decide()
        view.put_many("tx", self._items)

    def _decide(self) -> None:
        m = self._manager
        lock = m._lock
        # Not a plain acquire: a rotation holds the lock while it waits for held records,
        # which this very store write may have to commit first.
        while not lock.acquire(timeout=_ROTATION_POLL):
            if m._rotating:
                self.deferred = True
                raise _Deferred("the transaction log is rotating")
        try:
            try:
                m._check_running()
            except TidingsError:
                self.refused = True
                raise
            wal = m._wal
            assert wal is not None
            wp = self.write_pointer
            try:
                result = m._state.commit(
                    m._clock.now_ms(), wp, (), self._transactional_id, self._epoch
                )
            except TidingsError as exc:
                result = Result(error=exc)
            visible = any(type(r) not in _NOT_VISIBLE for r in result.records)
            if result.error is not None:
                # Refused (a timeout appends its invalidation): nothing is committed, so
                # the records take the file's usual flush.
                seq = m._append(wal, result)
            else:
                payloads = [encode_record(r) for r in result.records]
                seq, self._items = wal.append_carried(payloads)
                m._count_appended(len(payloads))
                self._decided = (result, wal, seq - len(payloads) + 1, seq, visible)
            if visible:
                m._visible_seq = seq
            m._track(result, seq, wal.durable)
        finally:
            lock.release()
        if result.error is not None:
            self.refused = True
            raise result.error

    def watch(self, write: Future[Any]) -> Future[None]:
        """A future of the commit: resolves once ``write`` (the store write running this
        step) has committed and the listeners were told, or carries the error of the
        write, of the refusal, or of the stopped log."""
        out: Future[None] = Future()
        out.set_running_or_notify_cancel()

        def settled(done: Future[Any]) -> None:
            error = done.exception()
            decided = self._decided
            if decided is None:  # refused, deferred, or the publish failed: nothing decided
                out.set_exception(error if error is not None else ServerError("no commit"))
                return
            result, wal, first, seq, visible = decided
            if error is not None:
                wal.fail(error)
                out.set_exception(error)
                return
            wal.carried(first, seq)
            m = self._manager
            m._note_synced(seq)
            _settle(out, lambda: _none(m._finish(result, visible)))

        write.add_done_callback(settled)
        return out


def _failed(exc: BaseException) -> Future[Any]:
    future: Future[Any] = Future()
    future.set_running_or_notify_cancel()
    future.set_exception(exc)
    return future


def _settle(future: Future[_T], fn: Callable[[], _T]) -> None:
    """Resolve ``future`` with ``fn()``, or with the exception it raises."""
    try:
        value = fn()
    except BaseException as exc:
        future.set_exception(exc)
    else:
        future.set_result(value)


def _transaction_of(result: Result) -> Transaction:
    assert result.transaction is not None
    return result.transaction


def _begun(result: Result) -> Begun:
    assert result.transaction is not None
    return Begun(result.transaction, result.again)


def _none(result: Result) -> None:
    return None


def _applied(result: Result) -> bool:
    # An idempotent end that found the transaction ended already logs no record.
    return bool(result.records)


def _ending(result: Result) -> Ending:
    assert result.outcome is not None  # every abort and invalidate that succeeds says
    return Ending(result.outcome, already=not result.records)


def _check_pointer(write_pointer: object) -> None:
    if isinstance(write_pointer, bool) or not isinstance(write_pointer, int):
        raise BadRequest(f"a write pointer is an integer, got {write_pointer!r}")


def _materialize(items: Iterable[_T]) -> tuple[_T, ...]:
    if isinstance(items, str | bytes | bytearray | memoryview):
        raise BadRequest("expected a collection, got a single string")
    return tuple(items)
