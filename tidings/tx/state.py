"""The transaction service's state machine (Tephra's TransactionManager, without I/O).

Every operation takes the current time as an argument, decides, and either returns an
error without touching anything or returns the records it applied. ``apply`` is the only
mutator, so replaying the log through it rebuilds exactly the state the records left.
The manager adds locking, the log and threads; tests drive this class with plain ints.

State kept:

- ``last_write_pointer``: the highest pointer handed out (begin or commit);
- ``reserved_from..reserved``: the run of pointers a begin may hand out before its
  record is durable (``Reserve`` records; see the manager);
- ``read_pointer``: the highest write pointer that committed or aborted;
- ``in_progress``: write pointer -> expiry and owner, in begin (= pointer) order;
- ``invalid``: timed-out, invalidated and fenced pointers, until pruned;
- committed change sets, only while an older transaction is still in progress;
- a bounded history of how recent transactions ended (to tell "already committed" from
  "unknown");
- the transactional ids (``producers.py``).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import NamedTuple

from tidings.errors import (
    BadRequest,
    InvalidProducer,
    ServerError,
    TidingsError,
    TooManyTransactions,
    TransactionAborted,
    TransactionCommitted,
    TransactionConflict,
    TransactionInvalid,
    TransactionNotFound,
    TransactionTimedOut,
)
from tidings.names import INT64_MAX
from tidings.structs import ProducerInfo, Transaction, TransactionState
from tidings.tx.producers import ProducerTable
from tidings.tx.records import (
    Abort,
    Begin,
    Commit,
    Invalidate,
    Outcome,
    Prune,
    Record,
    Register,
    Release,
    Reserve,
)

__all__ = ["RESERVATION", "InProgress", "Result", "StateImage", "TxStateMachine"]

#: Write pointers are signed 64-bit everywhere they are stored.
#: Pointers are ``ms x 1,000,000``: a million begins per ms before the counter runs ahead.
POINTERS_PER_MS = 1_000_000

#: Pointers one ``Reserve`` record covers. Pointers inside a reservation are handed out
#: one after the other, so a crash costs at most this many entries on the invalid list;
#: a new reservation is made when half of the current one is left, one log flush before
#: a begin could need it.
RESERVATION = 128

_ENDED_INVALID = frozenset(
    {Outcome.INVALIDATED, Outcome.TIMED_OUT, Outcome.FENCED, Outcome.UNLOGGED}
)


class InProgress(NamedTuple):
    """An open transaction: when it expires and which producer (0: none) began it."""

    expiry_ms: int
    producer_id: int = 0
    epoch: int = 0


@dataclass(frozen=True, slots=True)
class Result:
    """What an operation did: the records it applied and what to tell the caller."""

    records: tuple[Record, ...] = ()
    error: TidingsError | None = None
    transaction: Transaction | None = None
    producer: ProducerInfo | None = None
    ids: tuple[int, ...] = ()
    #: How an abort or invalidate left the transaction (what it did, or how the
    #: transaction had ended already).
    outcome: Outcome | None = None
    #: A begin answered with a transaction begun before (a resent begin id): nothing
    #: new was begun.
    again: bool = False


@dataclass(frozen=True, slots=True)
class StateImage:
    """A copy of the whole state, for snapshots (all sequences in ascending/log order)."""

    last_write_pointer: int
    read_pointer: int
    next_producer_id: int
    #: Pointers in ``reserved_from..reserved`` may be out without a record (``Reserve``).
    reserved_from: int
    reserved: int
    in_progress: tuple[tuple[int, InProgress], ...]
    invalid: tuple[int, ...]
    #: Ended transactions, oldest first, and how each ended (an ``Outcome`` per byte).
    history: tuple[int, ...]
    history_outcomes: bytes
    change_sets: tuple[tuple[int, tuple[bytes, ...]], ...]
    producers: tuple[ProducerInfo, ...]
    #: The epoch a transactional id registered afresh starts at (above every epoch of
    #: a forgotten id; :attr:`ProducerTable.epoch_floor`).
    epoch_floor: int = 0


class TxStateMachine:
    """The pure core of the transaction manager; not thread-safe (the manager locks)."""

    def __init__(self, history_size: int = 100_000) -> None:
        self.history_size = history_size
        self.last_write_pointer = 0
        self.reserved_from = 1
        self.reserved = 0
        self.read_pointer = 0
        self.in_progress: OrderedDict[int, InProgress] = OrderedDict()
        self.invalid: set[int] = set()
        self.producers = ProducerTable()
        self._invalid_sorted: tuple[int, ...] | None = ()
        self._history: dict[int, Outcome] = {}
        self._history_order: deque[int] = deque()
        self._change_sets: OrderedDict[int, tuple[bytes, ...]] = OrderedDict()
        self._last_commit_of: dict[bytes, int] = {}

    # -- queries -------------------------------------------------------------------------

    def invalid_ids(self) -> tuple[int, ...]:
        if self._invalid_sorted is None:
            self._invalid_sorted = tuple(sorted(self.invalid))
        return self._invalid_sorted

    def outcome(self, write_pointer: int) -> Outcome | None:
        """How ``write_pointer`` ended, if the history (or the invalid list) knows."""
        outcome = self._history.get(write_pointer)
        if outcome is None and write_pointer in self.invalid:
            return Outcome.INVALIDATED
        return outcome

    def view(self) -> TransactionState:
        return TransactionState(
            read_pointer=self.read_pointer,
            last_write_pointer=self.last_write_pointer,
            in_progress={wp: tx.expiry_ms for wp, tx in self.in_progress.items()},
            invalid=self.invalid_ids(),
        )

    def change_set_count(self) -> int:
        return len(self._change_sets)

    # -- decisions -----------------------------------------------------------------------

    def begin(
        self,
        now_ms: int,
        timeout_ms: int,
        transactional_id: str | None = None,
        epoch: int | None = None,
        *,
        max_open: int | None = None,
    ) -> Result:
        producer = self.producers.check(transactional_id, epoch)
        if max_open is not None and len(self.in_progress) >= max_open:
            # Each open transaction costs memory, and read-committed readers stop at
            # its first entry until it ends: a cap keeps a flood of begins from
            # holding back everyone. A transaction frees its slot as it ends (a
            # timed-out one at the next sweep). len() is O(1): no scan per begin.
            raise TooManyTransactions(
                f"{len(self.in_progress)} transactions are open, as many as the server "
                f"allows (tx_max_open = {max_open}); nothing was begun: retry once some "
                "have ended"
            )
        if producer is not None:
            self.producers.last_used[producer.transactional_id] = now_ms
        wp = self._next_pointer(now_ms)
        tx = Transaction(self.read_pointer, wp, self.invalid_ids(), tuple(self.in_progress))
        records: list[Record] = []
        if self.reserved - wp < RESERVATION // 2:
            # The reservation ends here or soon: extend it (the new one is contiguous,
            # so recovery's range of unlogged pointers stays at most RESERVATION long).
            start = self.reserved + 1 if wp <= self.reserved else wp
            records.append(Reserve(start, wp + RESERVATION))
        if producer is None:
            records.append(Begin(wp, now_ms + timeout_ms))
        else:
            records.append(Begin(wp, now_ms + timeout_ms, producer.producer_id, producer.epoch))
        for record in records:
            self.apply(record)
        return Result(tuple(records), transaction=tx)

    def commit(
        self,
        now_ms: int,
        write_pointer: int,
        changes: Iterable[bytes] = (),
        transactional_id: str | None = None,
        epoch: int | None = None,
    ) -> Result:
        producer = self.producers.check(transactional_id, epoch)
        if producer is not None:
            self.producers.last_used[producer.transactional_id] = now_ms
        entry = self.in_progress.get(write_pointer)
        if entry is None:
            return Result(error=self.ended_error(write_pointer, "commit"))
        _check_owner(write_pointer, entry, producer)
        keys = _change_keys(changes)
        if now_ms >= entry.expiry_ms:
            record: Record = Invalidate(write_pointer, Outcome.TIMED_OUT)
            self.apply(record)
            error = TransactionTimedOut(f"transaction {write_pointer} timed out; it is invalid")
            return Result((record,), error=error)
        for key in keys:
            committed = self._last_commit_of.get(key)
            if committed is not None and committed > write_pointer:
                return Result(error=TransactionConflict(_conflict_message(write_pointer, key)))
        record = Commit(write_pointer, self._next_pointer(now_ms), keys)
        self.apply(record)
        return Result((record,))

    def abort(
        self,
        write_pointer: int,
        transactional_id: str | None = None,
        epoch: int | None = None,
    ) -> Result:
        producer = self.producers.check(transactional_id, epoch)
        entry = self.in_progress.get(write_pointer)
        if entry is None:
            outcome = self.outcome(write_pointer)
            if outcome is Outcome.ABORTED or outcome in _ENDED_INVALID:
                # Already aborted, or its data is skipped anyway.
                return Result(outcome=outcome)
            return Result(error=self.ended_error(write_pointer, "abort"))
        _check_owner(write_pointer, entry, producer)
        record = Abort(write_pointer)
        self.apply(record)
        return Result((record,), outcome=Outcome.ABORTED)

    def invalidate(self, write_pointer: int) -> Result:
        if write_pointer not in self.in_progress:
            outcome = self.outcome(write_pointer)
            if outcome in _ENDED_INVALID:  # also INVALIDATED for any on the invalid list
                return Result(outcome=outcome)
            return Result(error=self.ended_error(write_pointer, "invalidate"))
        record = Invalidate(write_pointer, Outcome.INVALIDATED)
        self.apply(record)
        return Result((record,), outcome=Outcome.INVALIDATED)

    def expire(self, now_ms: int) -> Result:
        expired = [wp for wp, tx in self.in_progress.items() if now_ms >= tx.expiry_ms]
        records = tuple(Invalidate(wp, Outcome.TIMED_OUT) for wp in expired)
        for record in records:
            self.apply(record)
        return Result(records, ids=tuple(expired))

    def expire_producers(self, now_ms: int, idle_ms: int) -> list[str]:
        """Forget transactional ids idle for ``idle_ms`` (see :meth:`ProducerTable.expire`)."""
        busy = {tx.producer_id for tx in self.in_progress.values() if tx.producer_id}
        return self.producers.expire(now_ms, idle_ms, busy)

    def prune(self, below: int | None = None, ids: Iterable[int] = ()) -> Result:
        removed: set[int] = set()
        if below is not None:
            _check_pointer(below, "below")
            removed.update(wp for wp in self.invalid if wp < below)
        for wp in ids:
            _check_pointer(wp, "ids")
            if wp in self.invalid:
                removed.add(wp)
        if not removed:
            return Result()
        record = Prune(tuple(sorted(removed)))
        self.apply(record)
        return Result((record,), ids=record.ids)

    def register(self, transactional_id: str) -> Result:
        info = self.producers.next_registration(transactional_id)
        record = Register(info.transactional_id, info.producer_id, info.epoch)
        self.apply(record)
        return Result((record,), producer=info)

    def release(self) -> Result:
        """End the reservation at the last pointer handed out (before a clean stop)."""
        if self.reserved <= self.last_write_pointer:
            return Result()
        return self._applied(Release(self.last_write_pointer))

    # -- the one mutator -----------------------------------------------------------------

    def apply(self, record: Record) -> None:
        """Apply one record (fresh, or replayed from the log)."""
        _APPLY[type(record)](self, record)

    def _apply_begin(self, r: Begin) -> None:
        self.last_write_pointer = max(self.last_write_pointer, r.write_pointer)
        self.in_progress[r.write_pointer] = InProgress(r.expiry_ms, r.producer_id, r.epoch)

    def _apply_commit(self, r: Commit) -> None:
        self.last_write_pointer = max(self.last_write_pointer, r.commit_pointer)
        self.in_progress.pop(r.write_pointer, None)
        self.read_pointer = max(self.read_pointer, r.write_pointer)
        self._remember(r.write_pointer, Outcome.COMMITTED)
        if r.changes and self.in_progress:
            # Only transactions that began before this commit can conflict with it.
            self._change_sets[r.commit_pointer] = r.changes
            for key in r.changes:
                self._last_commit_of[key] = r.commit_pointer
        self._trim_change_sets()

    def _apply_abort(self, r: Abort) -> None:
        self.in_progress.pop(r.write_pointer, None)
        # As Tephra's abort: its writes were rolled back, so nothing of it is left to
        # hide. Left above the read pointer, it would count as begun after every later
        # snapshot, and the topics it wrote to as held by an open transaction (their
        # last stable position stuck at its first entry) until some later commit.
        self.read_pointer = max(self.read_pointer, r.write_pointer)
        self._remember(r.write_pointer, Outcome.ABORTED)
        self._trim_change_sets()

    def _apply_invalidate(self, r: Invalidate) -> None:
        self.in_progress.pop(r.write_pointer, None)
        self.invalid.add(r.write_pointer)
        self._invalid_sorted = None
        self._remember(r.write_pointer, r.reason)
        self._trim_change_sets()

    def _apply_prune(self, r: Prune) -> None:
        self.invalid.difference_update(r.ids)
        self._invalid_sorted = None

    def _apply_reserve(self, r: Reserve) -> None:
        if r.start != self.reserved + 1:
            self.reserved_from = r.start  # a new run, after a jump of the clock
        self.reserved = max(self.reserved, r.upto)

    def _apply_release(self, r: Release) -> None:
        self.reserved = min(self.reserved, max(r.upto, self.last_write_pointer))

    def _apply_register(self, r: Register) -> None:
        info = ProducerInfo(r.transactional_id, r.producer_id, r.epoch)
        previous = self.producers.apply(info)
        if previous is None:
            return
        # KIP-98: the new holder starts clean; what the old one left open may have data
        # out there, so it is invalidated rather than aborted.
        left = [wp for wp, tx in self.in_progress.items() if tx.producer_id == r.producer_id]
        for wp in left:
            self._apply_invalidate(Invalidate(wp, Outcome.FENCED))

    # -- helpers -------------------------------------------------------------------------

    def _applied(self, record: Record) -> Result:
        self.apply(record)
        return Result((record,))

    def _next_pointer(self, now_ms: int) -> int:
        if self.last_write_pointer < self.reserved:
            # Inside a reservation pointers are consecutive: recovery invalidates the
            # unlogged rest of it, which must be a short list, not a stretch of the clock.
            return self.last_write_pointer + 1
        pointer = max(self.last_write_pointer + 1, now_ms * POINTERS_PER_MS)
        if pointer > INT64_MAX:
            raise ServerError("write pointers exhausted (is the clock far in the future?)")
        return pointer

    def _remember(self, write_pointer: int, outcome: Outcome) -> None:
        if self.history_size <= 0:
            return
        if write_pointer not in self._history:
            self._history_order.append(write_pointer)
        self._history[write_pointer] = outcome
        while len(self._history_order) > self.history_size:
            del self._history[self._history_order.popleft()]

    def _trim_change_sets(self) -> None:
        oldest = next(iter(self.in_progress), None)
        sets = self._change_sets
        while sets:
            commit_pointer = next(iter(sets))
            if oldest is not None and commit_pointer > oldest:
                return
            _, keys = sets.popitem(last=False)
            for key in keys:
                if self._last_commit_of.get(key) == commit_pointer:
                    del self._last_commit_of[key]

    def ended_error(self, write_pointer: int, verb: str) -> TidingsError:
        """The error for ``verb`` on a transaction no longer in progress (why it ended)."""
        outcome = self.outcome(write_pointer)
        prefix = f"cannot {verb} transaction {write_pointer}"
        if outcome is Outcome.COMMITTED:
            return TransactionCommitted(f"{prefix}: it has already committed")
        if outcome is Outcome.ABORTED:
            return TransactionAborted(f"{prefix}: it was aborted")
        if outcome is Outcome.TIMED_OUT:
            return TransactionTimedOut(f"{prefix}: it timed out and is invalid")
        if outcome is Outcome.FENCED:
            return TransactionInvalid(
                f"{prefix}: it was invalidated when its transactional id was registered again"
            )
        if outcome is Outcome.INVALIDATED:
            return TransactionInvalid(f"{prefix}: it was invalidated")
        if outcome is Outcome.UNLOGGED:
            return TransactionInvalid(
                f"{prefix}: the transaction service stopped before its begin was durable, "
                "so it was invalidated"
            )
        return TransactionNotFound(f"{prefix}: no such transaction (or too old to remember)")

    # -- recovery ------------------------------------------------------------------------

    def invalidate_unlogged(self) -> tuple[int, ...]:
        """After replaying the log: invalidate the reserved pointers it never names.

        Records are appended in pointer order, so every pointer up to the last one the
        log names has its record; those above it, up to ``reserved``, may have been
        handed out by begins whose records were lost with the process. Their data (if
        any) must stay hidden and they must never be handed out again.
        """
        lost = tuple(range(max(self.last_write_pointer + 1, self.reserved_from), self.reserved + 1))
        for wp in lost:
            self._apply_invalidate(Invalidate(wp, Outcome.UNLOGGED))
        self.last_write_pointer = max(self.last_write_pointer, self.reserved)
        return lost

    # -- snapshots -----------------------------------------------------------------------

    def export(self) -> StateImage:
        order = tuple(self._history_order)
        return StateImage(
            last_write_pointer=self.last_write_pointer,
            read_pointer=self.read_pointer,
            next_producer_id=self.producers.next_producer_id,
            reserved_from=self.reserved_from,
            reserved=self.reserved,
            in_progress=tuple(self.in_progress.items()),
            invalid=self.invalid_ids(),
            # Ids and outcomes apart, built at C speed without an object per entry:
            # snapshots export under the manager's lock, the history holds up to
            # 100,000 entries, and 100,000 fresh pairs set off garbage collections
            # of the whole heap (~40 ms instead of ~1).
            history=order,
            history_outcomes=bytes(map(self._history.__getitem__, order)),
            change_sets=tuple(self._change_sets.items()),
            producers=tuple(self.producers),
            epoch_floor=self.producers.epoch_floor,
        )

    @classmethod
    def from_image(cls, image: StateImage, history_size: int = 100_000) -> TxStateMachine:
        state = cls(history_size)
        state.last_write_pointer = image.last_write_pointer
        state.reserved_from = image.reserved_from
        state.reserved = image.reserved
        state.read_pointer = image.read_pointer
        for wp, tx in sorted(image.in_progress):
            state.in_progress[wp] = tx
        state.invalid = set(image.invalid)
        state._invalid_sorted = None
        for wp, outcome in zip(image.history, image.history_outcomes, strict=True):
            state._remember(wp, Outcome(outcome))
        for commit_pointer, keys in sorted(image.change_sets):
            state._change_sets[commit_pointer] = keys
            for key in keys:
                state._last_commit_of[key] = commit_pointer
        for info in image.producers:
            state.producers.apply(info)
        state.producers.next_producer_id = max(
            state.producers.next_producer_id, image.next_producer_id
        )
        state.producers.epoch_floor = image.epoch_floor
        return state


_APPLY: dict[type, Callable[[TxStateMachine, Record], None]] = {
    Begin: TxStateMachine._apply_begin,  # type: ignore[dict-item]
    Commit: TxStateMachine._apply_commit,  # type: ignore[dict-item]
    Abort: TxStateMachine._apply_abort,  # type: ignore[dict-item]
    Invalidate: TxStateMachine._apply_invalidate,  # type: ignore[dict-item]
    Prune: TxStateMachine._apply_prune,  # type: ignore[dict-item]
    Register: TxStateMachine._apply_register,  # type: ignore[dict-item]
    Reserve: TxStateMachine._apply_reserve,  # type: ignore[dict-item]
    Release: TxStateMachine._apply_release,  # type: ignore[dict-item]
}


def _check_owner(write_pointer: int, tx: InProgress, producer: ProducerInfo | None) -> None:
    # A call without a transactional id is the anonymous (or admin) path and may end any
    # transaction; a call naming one may only end that producer's own transactions.
    if producer is not None and tx.producer_id != producer.producer_id:
        raise InvalidProducer(
            f"transaction {write_pointer} was not begun by transactional id "
            f"{producer.transactional_id!r}"
        )


def _check_pointer(value: object, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(f"{name}: write pointers are integers, got {value!r}")


def _change_keys(changes: Iterable[bytes]) -> tuple[bytes, ...]:
    if isinstance(changes, bytes | bytearray | memoryview | str):
        raise BadRequest("changes is a collection of byte strings, not one string")
    keys: set[bytes] = set()
    for key in changes:
        if not isinstance(key, bytes | bytearray | memoryview):
            raise BadRequest(f"change keys are bytes, got {type(key).__name__}")
        keys.add(bytes(key))
    return tuple(sorted(keys))


def _conflict_message(write_pointer: int, key: bytes) -> str:
    shown = key[:32].hex() + ("..." if len(key) > 32 else "")
    return (
        f"transaction {write_pointer} conflicts: change key {shown} was written by a "
        "transaction that committed after it began"
    )
