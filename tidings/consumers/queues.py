"""Queues: workers pop leased messages from a topic, ack, nack; leases time out.

A work queue in the manner of CDAP's queues (pop moves a message from waiting to
pending; commit or rollback; a pending message past its timeout goes back to waiting)
on a topic's total order, with Pulsar's shared subscriptions and transactional acks.
A queue is a named group of one topic: every queue (and every consumer group) of a
topic gets every message, and each message of a queue goes to one worker at a time.

**Leases.** ``pop`` hands out the oldest available messages (returned ones first, as
they are older than anything not read yet) under a lease: the worker holds them until
it acks or nacks them or ``ack_timeout`` passes. A message coming back counts one more
delivery; once it has been delivered ``max_deliveries`` times it is not handed out
again but moved to the queue's dead-letter topic, in the same write that takes it out
of its lease.

**Ack state** (:mod:`tidings.codec.queues`): the read position plus one record per
lease. What is acked is implicit: everything up to the read position that no lease
record holds. So the ack state grows with the messages in flight, not with the topic,
and an ack compacts it (it deletes or shrinks a lease record).

**Transactions.** ``ack(transaction=tx)`` moves the messages into a lease record
written under ``tx``'s write pointer (Pulsar's pending ack): no other worker gets
them, and the record resolves against the transaction service's snapshot at the
queue's next call: committed, the messages are acked; aborted (or timed out), they
are delivered again. An ack that conflicts (the lease passed to another worker,
another worker or transaction acked the message) raises
:class:`~tidings.errors.AckConflict` and invalidates the transaction, so a slow
worker's output never joins a faster one's.

**Durability.** Every state change is one store write, queued under the queue's lock
(so writes land in the order the memory changed) and awaited outside it (so
concurrent workers share fsyncs). A queue's memory is rebuilt from its records on
first use after a restart: leases keep their deadlines, so a dead worker's messages
come back after their timeout, and nothing acked comes back.

Queues need the transaction service in the same process (role ``all``).
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import logging
import struct
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from concurrent import futures
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from tidings.codec import queues as qkeys
from tidings.codec import wire
from tidings.codec.avro import ITEM_ID, item_message
from tidings.codec.media import AVRO_EXT, Media
from tidings.codec.queues import LeaseRecord, QueueRecord
from tidings.consumers.waiting import WouldWait
from tidings.errors import (
    AckConflict,
    BadRequest,
    NotDelivered,
    QueueNotFound,
    ServerError,
    ServiceUnavailable,
    TidingsError,
    TopicAlreadyExists,
)
from tidings.messaging import MessagingService
from tidings.messaging.counters import RateMeter
from tidings.names import check_name
from tidings.store.backend import Store, WriteView
from tidings.structs import (
    MESSAGE_ID_LAYOUT,
    Message,
    MessageId,
    QueueStats,
    Record,
    Transaction,
)
from tidings.tx import TransactionManager
from tidings.tx.visibility import is_visible

__all__ = [
    "DEFAULT_ACK_TIMEOUT_MS",
    "DEFAULT_MAX_DELIVERIES",
    "MAX_ACK_TIMEOUT_MS",
    "MAX_DELIVERIES_LIMIT",
    "Popped",
    "QueueCoordinator",
    "dead_letter_topic",
]

_META = "metadata"
_log = logging.getLogger(__name__)
_ID = struct.Struct(MESSAGE_ID_LAYOUT)

DEFAULT_ACK_TIMEOUT_MS = 30_000
MAX_ACK_TIMEOUT_MS = 12 * 3600 * 1000
#: RabbitMQ's quorum queues default to 20 deliveries since 4.0; so do we.
DEFAULT_MAX_DELIVERIES = 20
MAX_DELIVERIES_LIMIT = 1000
STARTS = ("earliest", "latest")
#: Acks remembered per queue (at least this many, at most twice), so a retried ack is
#: answered as done (and an ack of a message another worker acked is told apart from
#: one of a message never delivered).
_RECENT_ACKS = 100_000
#: Who "acked" a dead-lettered message among a queue's recent acks (never a consumer
#: id: those are 1-64 letters and digits).
_DEAD = ""
#: Most unread messages a depth count examines (a lower bound past it).
_DEPTH_BUDGET = 100_000
#: What a transactional ack tried, as its error says where the transaction ended.
_ACK_UNDER = "ack under"
#: Headers a dead-lettered message carries besides its own.
DEAD_LETTER_HEADERS = (
    "tidings-dead-letter-id",
    "tidings-dead-letter-topic",
    "tidings-dead-letter-queue",
    "tidings-delivery-count",
)


def dead_letter_topic(topic: str) -> str:
    """The default dead-letter topic of ``topic``'s queues: ``<topic>-dlq`` (topic names
    cannot hold a dot), shortened to stay a valid name."""
    return topic[:124] + "-dlq"


@dataclass(slots=True)
class _Entry:
    """A message handed out and not acked."""

    #: The message, or (as a pop reads it) its item of an Avro poll answer in the
    #: extended schema: a pop answers it as it is, without a Message each way.
    item: Message | bytes
    count: int  # deliveries so far
    lease: int  # the lease record holding it
    owners: list[str] = field(default_factory=list)  # workers it was leased to


@dataclass(slots=True)
class _Lease:
    owner: str  # "": returned to the queue
    deadline: int  # ms since the epoch; 0 for returned ones
    write_pointer: int  # non-zero: acked in that transaction, not ended yet
    ids: dict[MessageId, None]  # insertion-ordered set
    expired: bool = False  # its deadline passed and its messages went back
    durable: bool = False  # a record of it is in the store (maybe behind memory)
    #: A pop's lease whose answer waits for this write (a dead-lettering): if it
    #: fails, the worker is told so, and the lease is nobody's.
    answered_after: Future[None] | None = None

    def active(self) -> bool:
        return bool(self.owner) and not self.expired and not self.write_pointer


_QueueId = tuple[int, int, str]  # topic id, topic generation, queue


@dataclass(slots=True)
class _Unlanded:
    """An ack's store write and what it took out of memory: the ids, their entries,
    and the leases they were in (as they were: an emptied one leaves memory); and when
    it counted in the ack rate (monotonic seconds)."""

    write: Future[None]
    ids: list[MessageId]
    entries: list[_Entry]
    leases: dict[int, _Lease]
    at: float


@dataclass(slots=True)
class _Moved:
    """A nack's, release's or extension's store write, and for each message it moved
    the lease it put it in and the lease it held it by before (as it was then); and
    the nacks it counted."""

    write: Future[None]
    leases: dict[MessageId, tuple[_Lease, _Lease]]
    nacked: int = 0


@dataclass(slots=True)
class _DeadPop:
    """A pop whose answer waits for its dead-lettering write, its lease (which may
    hold nothing), what it counted, when it counted in the pop rate (monotonic
    seconds), the messages it dead-lettered (out of memory until the write lands),
    and the lease each message it took was held by before it (as it was then)."""

    write: Future[None]
    lease: _Lease
    popped: int
    redelivered: int
    dead_lettered: int
    at: float
    dead: list[tuple[MessageId, _Entry]]
    before: dict[MessageId, _Lease]


@dataclass(frozen=True, slots=True)
class Popped:
    """What a pop leased, in order: each message's id, its delivery count, and the
    message itself or its item of an Avro poll answer in the extended schema."""

    ids: list[MessageId]
    counts: list[int]
    items: list[Message | bytes]

    def messages(self) -> list[Message]:
        """The messages, each with its delivery count."""
        return [
            item_message(item)._replace(delivery_count=count)
            for item, count in zip(self.items, self.counts, strict=True)
        ]

    def body(self, media: Media) -> bytes:
        """The pop answer's body in ``media`` (the counts go in a header)."""
        if media is AVRO_EXT:
            return wire.avro_messages(self.items, media)
        return wire.encode_messages(self.messages(), media)


class _Queue:
    """One queue's memory: its record, entries, leases and counters."""

    def __init__(self, namespace: str, topic: str, qid: _QueueId, record: QueueRecord) -> None:
        self.namespace = namespace
        self.topic = topic
        self.qid = qid
        self.record = record
        self.lock = threading.Lock()
        self.entries: dict[MessageId, _Entry] = {}
        self.leases: dict[int, _Lease] = {}
        self.available: list[MessageId] = []  # a heap; stale ids are skipped
        self.next_lease = 1
        #: Leases whose record is behind memory (new ones: none yet), and the read
        #: position as the store has it. Every record holds only ids up to that.
        self.dirty: set[int] = set()
        self.durable_read = record.read
        #: Who acked each recent message, by the id's 20 bytes: a dict of bytes and
        #: strings is never tracked by the garbage collector, one of MessageId tuples
        #: is, and its 100,000s of entries made each full collection walk them all.
        self.recent: dict[bytes, str] = {}
        #: Acks whose write may not have landed yet, oldest first.
        self.unlanded: deque[_Unlanded] = deque()
        #: Nacks, releases and extensions whose write may not have landed yet; and
        #: pops waiting for a dead-lettering write.
        self.moved: deque[_Moved] = deque()
        self.dead_pops: deque[_DeadPop] = deque()
        self.broken = False
        #: Rebuilt after a failed write: this memory is no longer the queue's.
        self.replaced = False
        #: Write pointers whose acks the store refused (their transaction ended before
        #: the write): the leases under them went to the store as their workers held
        #: them, and memory follows at the next settle. Added to on the store's writer.
        self.refused: set[int] = set()
        #: The last write queued for this queue's records: the store applies writes in
        #: the order they are queued, so once it lands every earlier one has too.
        self.last_write: Future[None] | None = None
        self.popped = self.acked = self.nacked = 0
        self.redelivered = self.dead_lettered = self.expired = 0
        self.pop_rate = RateMeter()
        self.ack_rate = RateMeter()

    def is_available(self, entry: _Entry) -> bool:
        lease = self.leases[entry.lease]
        return not lease.write_pointer and (not lease.owner or lease.expired)

    def lease_key(self, lease: int) -> bytes:
        return qkeys.lease_key(*self.qid, lease)

    def lease_value(self, lease_no: int) -> bytes | None:
        """The record of a lease as memory has it now (None: it holds nothing)."""
        lease = self.leases.get(lease_no)
        if lease is None or not lease.ids:
            return None
        entries = tuple((m, self.entries[m].count) for m in lease.ids)
        owner = "" if lease.expired else lease.owner
        return qkeys.encode_lease(LeaseRecord(owner, lease.deadline, lease.write_pointer, entries))

    def take(self, ids: Iterable[MessageId]) -> set[int]:
        """Take messages out of their leases; the leases touched."""
        touched = set()
        for message_id in ids:
            entry = self.entries[message_id]
            lease = self.leases[entry.lease]
            del lease.ids[message_id]
            touched.add(entry.lease)
        return touched

    def writes(self, leases: Iterable[int]) -> list[tuple[bytes, bytes | None]]:
        """The record writes that bring these leases' records up to memory; empty
        leases are forgotten (their records deleted, if they had any)."""
        out: list[tuple[bytes, bytes | None]] = []
        for lease_no in sorted(set(leases)):
            lease = self.leases.get(lease_no)
            if lease is None:
                continue  # emptied and written before
            value = self.lease_value(lease_no)
            if value is not None:
                out.append((self.lease_key(lease_no), value))
                lease.durable = True
                continue
            if lease.durable:
                out.append((self.lease_key(lease_no), None))
            del self.leases[lease_no]
        return out

    def flush(self, leases: Iterable[int]) -> list[tuple[bytes, bytes | None]]:
        """The writes of an ack, nack or close: these leases, every lease whose record
        is behind memory, and the read position, together, so the store's records
        never name a message past its read position (what lies past it is read again
        after a restart; what lies before it and no record holds is acked)."""
        out = self.writes({*leases, *self.dirty})
        self.dirty.clear()
        if self.record.read != self.durable_read:
            out.append((qkeys.queue_key(*self.qid), qkeys.encode_queue(self.record)))
            self.durable_read = self.record.read
        return out

    def new_lease(self, owner: str, deadline: int, write_pointer: int) -> int:
        lease_no = self.next_lease
        self.next_lease += 1
        self.leases[lease_no] = _Lease(owner, deadline, write_pointer, {})
        self.dirty.add(lease_no)
        return lease_no

    def put_in(self, lease_no: int, ids: Iterable[MessageId]) -> None:
        lease = self.leases[lease_no]
        for message_id in ids:
            lease.ids[message_id] = None
            self.entries[message_id].lease = lease_no

    def drop(self, ids: Iterable[MessageId], dropped: list[_Entry]) -> set[int]:
        """Forget messages for good (acked): out of their leases and entries (into
        ``dropped``); the leases touched."""
        touched = set()
        entries, leases, keep = self.entries, self.leases, dropped.append
        for message_id in ids:
            entry = entries.pop(message_id)
            keep(entry)
            del leases[entry.lease].ids[message_id]
            touched.add(entry.lease)
        return touched

    def ack_queued(
        self,
        write: Future[None],
        ids: list[MessageId],
        dropped: list[_Entry],
        leases: dict[int, _Lease],
        at: float,
    ) -> None:
        """Remember what an ack took out of memory until its write is known to have
        landed, so that a rebuild after it failed gives the messages back to the
        worker's lease (:meth:`QueueCoordinator._keep_from`)."""
        _pend(self.unlanded, _Unlanded(write, ids, dropped, leases, at))

    def moves_queued(self, moved: _Moved) -> None:
        """Remember what a nack, release or extension changed until its write is known
        to have landed, so that a rebuild after it failed leaves the messages as the
        worker held them: it was told the call failed."""
        _pend(self.moved, moved)

    def remember_acked(self, ids: Iterable[MessageId], owner: str) -> None:
        # A message is acked once, so each id is new here and goes last (a dict keeps
        # insertion order). The oldest go in bulk once there are twice the bound: an
        # id at a time out of an OrderedDict cost 5 % of the server under 4 workers.
        recent, pack = self.recent, _ID.pack
        recent.update(dict.fromkeys([pack(*i) for i in ids], owner))
        if len(recent) > 2 * _RECENT_ACKS:
            self.recent = dict(itertools.islice(recent.items(), len(recent) - _RECENT_ACKS, None))

    def cursor(self) -> MessageId | None:
        if not self.entries:
            return self.record.read
        return min(self.entries).previous()


class QueueCoordinator:
    """Every queue of every topic, over the store, the messaging core and the
    transaction manager. Thread-safe."""

    def __init__(
        self,
        store: Store,
        messaging: MessagingService,
        tx: TransactionManager,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._messaging = messaging
        self._tx = tx
        self._clock = clock
        self._lock = threading.Lock()
        self._queues: dict[_QueueId, _Queue] = {}
        self._listeners: list[Callable[[str, str], None]] = []

    def add_listener(self, fn: Callable[[str, str], None]) -> None:
        """Call ``fn(namespace, topic)`` when messages of a queue become available
        other than by a publish (nack, close): long-polling pops wake on it."""
        self._listeners.append(fn)

    def _now(self) -> int:
        return int(self._clock() * 1000)

    # --- the worker's calls ------------------------------------------------------------

    def pop(
        self,
        namespace: str,
        topic: str,
        queue: str,
        consumer: str,
        *,
        max_messages: int,
        ack_timeout_ms: int = DEFAULT_ACK_TIMEOUT_MS,
        snapshot: Transaction,
        max_deliveries: int | None = None,
        dead_letter: str | None = None,
        start: str = "earliest",
        max_bytes: int | None = None,
    ) -> list[Message]:
        """Lease up to ``max_messages`` of the oldest available messages to
        ``consumer`` for ``ack_timeout_ms``, none past the message that brings them to
        ``max_bytes`` (default and most, the server's ``fetch_max_bytes``); the queue
        is created by its first pop (with ``max_deliveries``, ``dead_letter`` and
        ``start``; given later, the first two change it). Returns at once, maybe with
        nothing (the route long-polls)."""
        return self.pop_items(
            namespace,
            topic,
            queue,
            consumer,
            max_messages=max_messages,
            ack_timeout_ms=ack_timeout_ms,
            snapshot=snapshot,
            max_deliveries=max_deliveries,
            dead_letter=dead_letter,
            start=start,
            max_bytes=max_bytes,
        ).messages()

    def pop_items(
        self,
        namespace: str,
        topic: str,
        queue: str,
        consumer: str,
        *,
        max_messages: int,
        ack_timeout_ms: int = DEFAULT_ACK_TIMEOUT_MS,
        snapshot: Transaction,
        max_deliveries: int | None = None,
        dead_letter: str | None = None,
        start: str = "earliest",
        max_bytes: int | None = None,
    ) -> Popped:
        """:meth:`pop`, answered as :class:`Popped` (for the route: it writes the
        answer from the items as they are)."""
        self.check_pop(consumer, max_messages, ack_timeout_ms)
        budget = self._messaging.max_bytes(max_bytes)
        q = self._open(namespace, topic, queue, max_deliveries, dead_letter, start)
        out, done = self._pop(q, consumer, max_messages, budget, ack_timeout_ms, snapshot, True)
        if done is not None:
            self._await(q, done)
        return out

    def pop_nowait(
        self,
        namespace: str,
        topic: str,
        queue: str,
        consumer: str,
        *,
        max_messages: int,
        ack_timeout_ms: int = DEFAULT_ACK_TIMEOUT_MS,
        snapshot: Transaction,
        max_deliveries: int | None = None,
        dead_letter: str | None = None,
        max_bytes: int | None = None,
        start: str = "earliest",
    ) -> Popped | None:
        """:meth:`pop_items` for the event loop: None, having changed nothing, where it would
        wait for the store (the queue is not in memory, its settings change, or a
        message is due for its dead-letter topic); call :meth:`pop_items` on a worker
        then."""
        self.check_pop(consumer, max_messages, ack_timeout_ms)
        # Checked though an existing queue ignores them: a pop that names settings no
        # queue may have is refused whether or not its queue exists yet.
        self.check_settings(topic, max_deliveries, dead_letter, start)
        budget = self._messaging.max_bytes(max_bytes)
        q = self._in_memory(namespace, topic, queue)
        if q is None or not _same_settings(q.record, max_deliveries, dead_letter):
            return None
        try:
            return self._pop(q, consumer, max_messages, budget, ack_timeout_ms, snapshot, False)[0]
        except WouldWait:
            return None

    def check_pop(self, consumer: str, max_messages: int, ack_timeout_ms: int) -> None:
        """BadRequest unless a pop with these arguments is well-formed."""
        _check_consumer(consumer)
        fetch_max = self._messaging.config.fetch_max_limit
        if isinstance(max_messages, bool) or not 1 <= max_messages <= fetch_max:
            raise BadRequest(f"maxMessages must be in [1, {fetch_max}], got {max_messages}")
        if not 1 <= ack_timeout_ms <= MAX_ACK_TIMEOUT_MS:
            raise BadRequest(
                f"ackTimeoutMs must be in [1, {MAX_ACK_TIMEOUT_MS}], got {ack_timeout_ms}"
            )

    def check_settings(
        self, topic: str, max_deliveries: int | None, dead_letter: str | None, start: str
    ) -> None:
        """BadRequest unless a pop's queue settings are well-formed."""
        if max_deliveries is not None and not 1 <= max_deliveries <= MAX_DELIVERIES_LIMIT:
            raise BadRequest(
                f"maxDeliveries must be in [1, {MAX_DELIVERIES_LIMIT}], got {max_deliveries}"
            )
        if dead_letter is not None:
            check_name(dead_letter, "dead-letter topic")
            if dead_letter == topic:
                raise BadRequest("a queue's dead-letter topic cannot be its own topic")
        if start not in STARTS:
            raise BadRequest(f"start must be one of {', '.join(STARTS)}, got {start!r}")

    def _pop(
        self,
        q: _Queue,
        consumer: str,
        max_messages: int,
        budget: int,
        ack_timeout_ms: int,
        snapshot: Transaction,
        may_wait: bool,
    ) -> tuple[Popped, Future[None] | None]:
        namespace, topic = q.namespace, q.topic
        with q.lock:
            _current(q, may_wait)
            self._settle(q, snapshot)
            now = self._now()
            chosen: list[tuple[MessageId, _Entry]] = []
            dead: list[tuple[MessageId, _Entry]] = []
            taken: set[MessageId] = set()
            gone: list[MessageId] = []
            while q.available and len(chosen) < max_messages and budget > 0:
                batch: list[MessageId] = []
                while q.available and len(batch) < max_messages - len(chosen):
                    message_id = heapq.heappop(q.available)
                    entry = q.entries.get(message_id)
                    if entry is None or message_id in taken or not q.is_available(entry):
                        # Acked or handed out since it was queued, or queued twice (its
                        # lease ran out, then it came back again another way).
                        continue
                    taken.add(message_id)
                    batch.append(message_id)
                # Memory keeps a message until it is acked, but one past the topic's
                # retention (or its own expiry) is no longer the topic's: delivered
                # again, it would reach a worker only until a restart forgets it.
                held = self._messaging.held_ids(namespace, topic, batch)
                for message_id in batch:
                    if message_id not in held:
                        gone.append(message_id)
                        continue
                    if len(chosen) >= max_messages or budget <= 0:
                        heapq.heappush(q.available, message_id)
                        taken.discard(message_id)
                        continue
                    entry = q.entries[message_id]
                    if entry.count >= q.record.max_deliveries:
                        if not may_wait:
                            # Dead-lettering publishes (and may create a topic): put
                            # back what was taken, for the caller to pop on a worker
                            # thread.
                            for taken_id in taken:
                                heapq.heappush(q.available, taken_id)
                            raise WouldWait
                        dead.append((message_id, entry))
                    else:
                        chosen.append((message_id, entry))
                        budget -= _item_bytes(entry.item)
            if gone:
                # Forgotten as a restart forgets them; their leases are written with
                # the queue's next write.
                q.dirty.update(q.take(gone))
                for message_id in gone:
                    del q.entries[message_id]
            fresh: list[Message | bytes] = []
            if len(chosen) < max_messages and budget > 0:
                read = q.record.read
                fresh = self._messaging.fetch_items(
                    namespace,
                    topic,
                    AVRO_EXT,
                    start=read,
                    inclusive=read is None,
                    limit=max_messages - len(chosen),
                    transaction=snapshot,
                    max_bytes=budget,
                    count=False,  # the pop is counted once when it answers
                )
            if not chosen and not dead and not fresh:
                return Popped([], [], []), None
            # Where a pop whose dead-lettering fails leaves them (a lease that ran out
            # is still its worker's to extend or ack while nobody else took it).
            before = _leases_of(q, [m for m, _ in chosen + dead]) if dead else {}
            touched = q.take(message_id for message_id, _ in chosen + dead)
            for message_id, _ in dead:
                del q.entries[message_id]
            if dead:
                # So that an ack of one of them is told apart from a retried ack.
                q.remember_acked([message_id for message_id, _ in dead], _DEAD)
            lease_no = q.new_lease(consumer, now + ack_timeout_ms, 0)
            chosen.sort(key=_first)
            ids: list[MessageId] = []
            items: list[Message | bytes] = []
            counts: list[int] = []
            # Not those never delivered: read by a pop whose write failed (they came
            # back with the queue's rebuild).
            redelivered = 0
            for message_id, entry in chosen:
                redelivered += entry.count > 0
                entry.count += 1
                entry.owners.append(consumer)
                entry.lease = lease_no
                ids.append(message_id)
                items.append(entry.item)
                counts.append(entry.count)
            # Fresh ones (most of a pop) in one pass each: the id out of the item, the
            # entry made whole.
            entries, new, id_cls, unpack = q.entries, tuple.__new__, MessageId, ITEM_ID.unpack_from
            for item in fresh:
                if type(item) is bytes:
                    message_id = new(id_cls, unpack(item, 1))
                else:
                    assert isinstance(item, Message)
                    message_id = item.id
                entries[message_id] = _Entry(item, 1, lease_no, [consumer])
                ids.append(message_id)
            items.extend(fresh)
            counts.extend([1] * len(fresh))
            q.leases[lease_no].ids = dict.fromkeys(ids)
            # Nothing written for a pop (as Pulsar's dispatch): the next ack, nack or
            # close of any worker writes its lease. A server crash before that hands
            # these messages out again at once (at least once; an ack in a
            # transaction of a lease the server forgot is refused, so exactly-once
            # holds).
            q.dirty.update(touched)
            if fresh:
                q.record = _replace_read(q.record, ids[-1])
            out = Popped(ids, counts, items)
            if not dead:
                self._count_pop(q, len(ids), redelivered, 0)
                return out, None
            lease = q.leases[lease_no]  # (the write forgets it if it holds nothing)
            try:
                done = self._dead_letter(q, dead, q.flush(()))
            except BaseException as exc:
                # A write never queued (the dead-letter topic could not be created or
                # published to) is one that failed: the caller's wait raises it and
                # marks the queue for its rebuild, which undoes the pop as below.
                done = _failed(exc)
            lease.answered_after = done
            at = self._count_pop(q, len(ids), redelivered, len(dead))
            # Until the write lands: if it fails, the rebuild takes the counts back.
            _pend(
                q.dead_pops,
                _DeadPop(done, lease, len(ids), redelivered, len(dead), at, dead, before),
            )
            return out, done

    @staticmethod
    def _count_pop(q: _Queue, popped: int, redelivered: int, dead_lettered: int) -> float:
        """Count a pop; when it counted in the pop rate."""
        q.popped += popped
        q.redelivered += redelivered
        q.dead_lettered += dead_lettered
        at = time.monotonic()
        q.pop_rate.add(popped, at)
        return at

    def ack(
        self,
        namespace: str,
        topic: str,
        queue: str,
        consumer: str,
        ids: Sequence[MessageId],
        *,
        write_pointer: int | None = None,
    ) -> None:
        """Ack messages ``consumer`` popped: for good, or (``write_pointer``) if and only
        if that transaction commits. :class:`NotDelivered` for messages never delivered
        to it, :class:`AckConflict` for messages that another worker holds or acked
        (the transaction is invalidated then); nothing changes on either."""
        _check_consumer(consumer)
        _check_ids(ids)
        q = self._require(namespace, topic, queue)
        done, refused = self._ack(q, consumer, ids, write_pointer, self._snapshot())
        if done is not None:
            self._await(q, done)
        if refused:
            raise refused[0]

    def ack_nowait(
        self,
        namespace: str,
        topic: str,
        queue: str,
        consumer: str,
        ids: Sequence[MessageId],
        *,
        snapshot: Transaction,
        write_pointer: int | None = None,
    ) -> Future[None] | None:
        """:meth:`ack` for the event loop: the future of the store write that makes it
        durable (await it before answering), or None, having changed nothing, where
        the queue is not in memory (call :meth:`ack` on a worker then). Raises as
        :meth:`ack`, except that an :class:`AckConflict` leaves the transaction of
        ``write_pointer`` to its caller, who must then end it (it is not invalidated
        here: that waits for the transaction log)."""
        _check_consumer(consumer)
        _check_ids(ids)
        q = self._in_memory(namespace, topic, queue)
        if q is None:
            return None
        try:
            written, refused = self._ack(
                q, consumer, ids, write_pointer, snapshot, invalidate=False
            )
        except WouldWait:
            return None
        # The caller gets a future of its own: cancelling it (a request cancelled
        # while it waits) must not cancel the store write, which memory is already
        # ahead of.
        done: Future[None] = Future()
        if written is None:
            done.set_result(None)
        else:
            written.add_done_callback(lambda f: _settle_from(q, f, done, refused))
        return done

    def _ack(
        self,
        q: _Queue,
        consumer: str,
        ids: Sequence[MessageId],
        write_pointer: int | None,
        snapshot: Transaction,
        *,
        invalidate: bool = True,
    ) -> tuple[Future[None] | None, list[TidingsError]]:
        """The ack in memory and the future of its store write (None: nothing to
        write or wait for), and a list that holds, once that write landed, the error
        that refused a transactional ack there (its transaction ended meanwhile)."""
        refused: list[TidingsError] = []
        with q.lock:
            _current(q, invalidate)  # not invalidating here: on the event loop
            self._settle(q, snapshot)
            try:
                todo = self._claim(q, consumer, ids, write_pointer)
            except AckConflict:
                if write_pointer is not None and invalidate:
                    with contextlib.suppress(TidingsError):
                        self._tx.invalidate(write_pointer)
                raise
            if write_pointer is not None:
                self._tx.check_writable(write_pointer, action=_ACK_UNDER)
            dropped: list[_Entry] = []
            held_in: dict[int, _Lease] = {}
            acked_at = 0.0
            if write_pointer is None:
                touched = q.drop(todo, dropped)
                held_in = {n: q.leases[n] for n in touched}
                q.remember_acked(todo, consumer)
                q.acked += len(todo)
                acked_at = time.monotonic()
                q.ack_rate.add(len(todo), acked_at)
                writes = q.flush(touched)
            else:
                # Each message keeps the deadline of the lease it leaves (0: it was not
                # the worker's any more), so a transaction that fails can give it back
                # to the worker as it held it (:meth:`rollback` with ``keep_leases``).
                held: dict[int, list[MessageId]] = {}
                for message_id in todo:
                    lease = q.leases[q.entries[message_id].lease]
                    until = lease.deadline if lease.active() else 0
                    held.setdefault(until, []).append(message_id)
                touched = q.take(todo)
                made = []
                for until, group in held.items():
                    lease_no = q.new_lease(consumer, until, write_pointer)
                    q.put_in(lease_no, group)
                    made.append(lease_no)
                writes = q.flush([*touched, *made])
                # What the store gets instead where the transaction ended before the
                # write: the messages as the worker held them, so that memory (told by
                # `refused`) and the records agree again without a rebuild, which would
                # forget every lease not written yet, of every worker.
                held_by: dict[bytes, bytes] = {}
                for lease_no in made:
                    lease = q.leases[lease_no]
                    entries = tuple((m, q.entries[m].count) for m in lease.ids)
                    owner = consumer if lease.deadline else ""
                    record = LeaseRecord(owner, lease.deadline, 0, entries)
                    held_by[q.lease_key(lease_no)] = qkeys.encode_lease(record)
                write = _ack_write(writes, held_by, self._tx, write_pointer, q, refused)
            if not writes:
                # The store already says these are acked once the writes queued before
                # land: wait for those.
                last = q.last_write
                return (None if last is None or last.done() else last), refused
            if write_pointer is None:
                submitted = self._submit(q, _write_all(writes))
                q.ack_queued(submitted, todo, dropped, held_in, acked_at)
                return submitted, refused
            return self._submit(q, write), refused

    def nack(
        self, namespace: str, topic: str, queue: str, consumer: str, ids: Sequence[MessageId]
    ) -> list[MessageId]:
        """Give messages back to the queue at once (a queue's rollback): they go ahead
        of newer ones. Those ``consumer`` no longer holds are skipped and answered, in
        the order given: a give-back of messages that moved on meanwhile (their lease
        ran out and another worker took, acked or dead-lettered them; a transaction
        acked them) still gives back the rest, which would otherwise stay leased until
        their deadline (as SQS's batch calls answer each entry, and Pulsar's negative
        ack of a message no longer held is dropped)."""
        _check_consumer(consumer)
        _check_ids(ids)
        q = self._require(namespace, topic, queue)
        with q.lock:
            _current(q)
            self._settle(q, self._snapshot())
            skipped: list[MessageId] = []
            claimed = self._claim(q, consumer, ids, None, skipped=skipped)
            todo = [m for m in claimed if not q.is_available(q.entries[m])]
            if not todo:
                return skipped
            before = _leases_of(q, todo)
            touched = q.take(todo)
            lease_no = q.new_lease("", 0, 0)
            q.put_in(lease_no, todo)
            for message_id in todo:
                heapq.heappush(q.available, message_id)
            q.nacked += len(todo)
            back = q.leases[lease_no]
            done = self._submit(q, _write_all(q.flush([*touched, lease_no])))
            q.moves_queued(_Moved(done, {m: (back, before[m]) for m in todo}, len(todo)))
        self._await(q, done)
        self._notify(namespace, topic)
        return skipped

    def extend(
        self,
        namespace: str,
        topic: str,
        queue: str,
        consumer: str,
        ids: Sequence[MessageId],
        ack_timeout_ms: int = DEFAULT_ACK_TIMEOUT_MS,
    ) -> list[MessageId]:
        """Lease messages ``consumer`` holds for ``ack_timeout_ms`` from now (SQS's
        ChangeMessageVisibility, Pub/Sub's modifyAckDeadline): a worker on a long job
        keeps it from going to another worker, without asking for a long timeout for
        every pop. A message whose lease ran out counts as held while nobody else took
        it (as for an ack). Not a delivery: counts stay. Those ``consumer`` does not
        hold are skipped and answered, in the order given (as :meth:`nack`). The new
        deadline is written at once, so it holds after a restart."""
        _check_consumer(consumer)
        _check_ids(ids)
        if isinstance(ack_timeout_ms, bool) or not 1 <= ack_timeout_ms <= MAX_ACK_TIMEOUT_MS:
            raise BadRequest(
                f"ackTimeoutMs must be in [1, {MAX_ACK_TIMEOUT_MS}], got {ack_timeout_ms}"
            )
        q = self._require(namespace, topic, queue)
        with q.lock:
            _current(q)
            self._settle(q, self._snapshot())
            skipped: list[MessageId] = []
            claimed = self._claim(q, consumer, ids, None, skipped=skipped)
            # Not those it gave back itself (a nack or close): they are the queue's.
            todo = [m for m in claimed if q.leases[q.entries[m].lease].owner == consumer]
            if len(todo) < len(claimed):
                left = {*skipped, *set(claimed).difference(todo)}
                skipped = [m for m in dict.fromkeys(ids) if m in left]
            if not todo:
                return skipped
            before = _leases_of(q, todo)
            touched = q.take(todo)
            lease_no = q.new_lease(consumer, self._now() + ack_timeout_ms, 0)
            q.put_in(lease_no, todo)
            # Those that were back in the queue stay in its heap: a pop skips them now
            # that they are leased.
            extended = q.leases[lease_no]
            done = self._submit(q, _write_all(q.flush([*touched, lease_no])))
            q.moves_queued(_Moved(done, {m: (extended, before[m]) for m in todo}))
        self._await(q, done)
        return skipped

    def release(self, namespace: str, topic: str, queue: str, consumer: str) -> int:
        """Give back every lease ``consumer`` holds (its ``close()``); how many messages."""
        _check_consumer(consumer)
        q = self._require(namespace, topic, queue)
        with q.lock:
            _current(q)
            self._settle(q, self._snapshot())
            mine = [
                n for n, lease in q.leases.items() if lease.owner == consumer and lease.active()
            ]
            count = 0
            moved: dict[MessageId, tuple[_Lease, _Lease]] = {}
            for lease_no in mine:
                lease = q.leases[lease_no]
                was = _as_was(lease)
                lease.owner, lease.deadline = "", 0
                for message_id in lease.ids:
                    heapq.heappush(q.available, message_id)
                    moved[message_id] = (lease, was)
                count += len(lease.ids)
            if not mine:
                return 0
            done = self._submit(q, _write_all(q.flush(mine)))
            q.moves_queued(_Moved(done, moved))
        self._await(q, done)
        self._notify(namespace, topic)
        return count

    def rollback(
        self,
        namespace: str,
        topic: str,
        queue: str,
        write_pointer: int,
        *,
        keep_leases: bool = False,
    ) -> int:
        """Give back the messages acked under ``write_pointer``: its transaction is being
        aborted (Tephra's rollback before abort: an aborted transaction leaves nothing
        behind). How many messages came back.

        ``keep_leases``: back to the worker that acked them, under the lease it held
        them by until that lease's deadline (as SQS keeps a message whose delete failed
        invisible), rather than to the queue at once: the server refused the
        transaction, and the worker may ack them again. Those whose lease ran out
        meanwhile go back to the queue."""
        q = self._require(namespace, topic, queue)
        snapshot = self._snapshot()
        with q.lock:
            _current(q)
            self._unrefuse(q)
            if is_visible(snapshot, write_pointer):
                # Committed already (a rollback sent after the commit): its acks count,
                # as they would at the queue's next call.
                self._settle(q, snapshot)
                return 0
            held = [n for n, lease in q.leases.items() if lease.write_pointer == write_pointer]
            count = 0
            returned = False
            now = self._now()
            for lease_no in held:
                lease = q.leases[lease_no]
                count += len(lease.ids)
                if keep_leases and lease.owner and lease.deadline > now:
                    lease.write_pointer = 0
                    continue
                lease.write_pointer, lease.owner, lease.deadline = 0, "", 0
                for message_id in lease.ids:
                    heapq.heappush(q.available, message_id)
                returned = True
            if not held:
                return 0
            done = self._submit(q, _write_all(q.flush(held)))
        self._await(q, done)
        if returned:
            self._notify(namespace, topic)
        return count

    def next_deadline(self, namespace: str, topic: str, queue: str) -> float | None:
        """Seconds until the queue's next lease runs out (None: no lease running), so a
        waiting pop wakes for it."""
        q = self._queues.get(self._qid(namespace, topic, queue))
        if q is None:
            return None
        with q.lock:
            deadlines = [lease.deadline for lease in q.leases.values() if lease.active()]
        if not deadlines:
            return None
        return max(0.0, (min(deadlines) - self._now()) / 1000)

    # --- administration ------------------------------------------------------------------

    def describe(self, namespace: str, topic: str, queue: str) -> QueueStats:
        """The queue's settings, positions, in-flight messages, depth and counters."""
        q = self._require(namespace, topic, queue)
        snapshot = self._snapshot()
        with q.lock:
            self._settle(q, snapshot)
            consumers: dict[str, int] = {}
            pending = 0
            back: list[MessageId] = []
            for lease in q.leases.values():
                if lease.active() or lease.write_pointer:
                    pending += len(lease.ids)
                    consumers[lease.owner] = consumers.get(lease.owner, 0) + len(lease.ids)
                else:
                    back.extend(lease.ids)
            # A returned message past the topic's retention (or its own expiry) is
            # never handed out again (the next pop forgets it): not the queue's depth.
            returned = len(self._messaging.held_ids(namespace, topic, back)) if back else 0
            read, cursor, record = q.record.read, q.cursor(), q.record
            ack_state = len(q.entries)
            counters = (
                q.popped, q.acked, q.nacked, q.redelivered, q.dead_lettered, q.expired,
            )  # fmt: skip
            now = time.monotonic()
            rates = q.pop_rate.rate(now), q.ack_rate.rate(now)
        unread, exact = self._unread(namespace, topic, read, snapshot)
        pushed = self._messaging.counters().get((namespace, topic))
        return QueueStats(
            queue=queue,
            max_deliveries=record.max_deliveries,
            dead_letter_topic=record.dead_letter_topic,
            start=record.start,
            cursor=cursor,
            read=read,
            pending=pending,
            waiting=returned + unread,
            waiting_exact=exact,
            consumers=consumers,
            pushed=0 if pushed is None else pushed.messages_published,
            popped=counters[0],
            acked=counters[1],
            nacked=counters[2],
            redelivered=counters[3],
            dead_lettered=counters[4],
            expired=counters[5],
            pop_rate=rates[0],
            ack_rate=rates[1],
            ack_state=ack_state,
        )

    def names(self, namespace: str, topic: str) -> list[str]:
        """The names of the topic's queues, sorted."""
        topic_id, generation = self._messaging.identity(namespace, topic)
        start, stop = qkeys.queues_range(topic_id, generation)
        with self._store.read() as view:
            return [qkeys.queue_name_of(k) for k, _ in view.scan(_META, start, stop)]

    def all_names(self, namespace: str) -> list[tuple[str, str]]:
        """``(topic, queue)`` of every queue of the namespace's live topics."""
        out: list[tuple[str, str]] = []
        for topic in self._messaging.list_topics(namespace):
            with contextlib.suppress(TidingsError):  # deleted meanwhile
                out.extend((topic, name) for name in self.names(namespace, topic))
        return out

    def purge(self, namespace: str, topic: str, queue: str) -> int:
        """Ack everything the queue holds and everything published so far (leases
        included; transactions holding acks of it are invalidated); how many messages
        it dropped that it had read and not acked, leased or not."""
        q = self._require(namespace, topic, queue)
        snapshot = self._snapshot()
        with q.lock:
            _current(q)
            end = self._messaging.end(namespace, topic, snapshot)
            read = end.newest_id if end.last_stable_id is None else end.last_stable_id.previous()
            dropped = len(q.entries)
            record = q.record
            if read is not None and (record.read is None or read > record.read):
                record = _replace_read(record, read)
            queue_key, value = qkeys.queue_key(*q.qid), qkeys.encode_queue(record)
            start, stop = qkeys.leases_range(*q.qid)

            def purged(view: WriteView) -> None:
                # Every lease record, not only those memory knows: memory forgets a
                # lease it emptied once a write deleting its record is queued, and that
                # write may still fail.
                view.delete_range(_META, start, stop)
                view.put(_META, queue_key, value)

            # Memory changes only once the write landed, and no other call of the queue
            # runs meanwhile (an admin call, rare; its write is small): a purge whose
            # write fails changes nothing and needs no rebuild, where a rebuild from
            # memory already emptied would have handed the leases nobody wrote yet to
            # the next pop, as every message read since the records' read position.
            # The transactions holding acks of it are invalidated only then too (one
            # that commits first keeps its acks, which the purge acks anyway).
            self._submit(q, purged).result()
            for lease in q.leases.values():
                if lease.write_pointer:
                    with contextlib.suppress(TidingsError):
                        self._tx.invalidate(lease.write_pointer)
            q.record = record
            q.durable_read = record.read
            q.entries.clear()
            q.leases.clear()
            q.dirty.clear()
            q.available.clear()
        return dropped

    def delete(self, namespace: str, topic: str, queue: str) -> None:
        """Delete a queue and its state (leases held now are dropped)."""
        q = self._require(namespace, topic, queue)
        start, stop = qkeys.leases_range(*q.qid)

        def drop(view: WriteView) -> None:
            view.delete(_META, qkeys.queue_key(*q.qid))
            view.delete_range(_META, start, stop)

        with q.lock:
            q.broken = True
            self._store.apply(drop)
        with self._lock:
            self._queues.pop(q.qid, None)

    def forget_topic(self, topic_id: int) -> None:
        """Drop every queue row of a deleted topic (all its generations)."""

        def drop(view: WriteView) -> None:
            for start, stop in qkeys.topic_range(topic_id):
                view.delete_range(_META, start, stop)

        self._store.apply(drop)
        with self._lock:
            for qid in [k for k in self._queues if k[0] == topic_id]:
                self._queues.pop(qid).broken = True

    def referenced_pointers(self, candidates: set[int]) -> set[int]:
        """The pointers among ``candidates`` that a lease record is written under (the
        invalid-list pruner keeps those: they decide whether acks count)."""
        found: set[int] = set()
        prefix = qkeys.LEASE_PREFIX
        with self._store.read() as view:
            for _, raw in view.scan(_META, prefix, prefix + b"\xff"):
                write_pointer = qkeys.decode_lease(raw).write_pointer
                if write_pointer in candidates:
                    found.add(write_pointer)
        return found

    def stats(self) -> list[tuple[str, str, QueueStats]]:
        """``(namespace, topic, stats)`` of every queue of every live topic (for
        ``/metrics``), used since the server started or not: after a restart, the depth
        of a queue no worker has come back to is what an operator must see."""
        names = self._messaging.topic_names()
        prefix = qkeys.QUEUE_PREFIX
        with self._store.read() as view:
            # Up to the prefix with its last byte raised: every queue record.
            found = [k for k, _ in view.scan(_META, prefix, prefix[:-1] + b"0")]
        out = []
        for key in found:
            topic_id, generation = qkeys.topic_of(key)
            if topic_id not in names:
                continue
            namespace, topic = names[topic_id]
            with contextlib.suppress(TidingsError):  # deleted meanwhile
                if self._messaging.identity(namespace, topic) != (topic_id, generation):
                    continue  # a queue of an older generation: dropped with the topic
                queue = qkeys.queue_name_of(key)
                out.append((namespace, topic, self.describe(namespace, topic, queue)))
        return out

    # --- internals ---------------------------------------------------------------------

    def _snapshot(self) -> Transaction:
        snapshot = self._tx.snapshot()
        assert snapshot is not None
        return snapshot

    def _qid(self, namespace: str, topic: str, queue: str) -> _QueueId:
        check_name(queue, "queue")
        topic_id, generation = self._messaging.identity(namespace, topic)
        return topic_id, generation, queue

    def _submit(self, q: _Queue, write: Callable[[WriteView], None]) -> Future[None]:
        """Queue a write of ``q``'s records (under its lock, so the store applies them in
        the order memory changed). A store that refuses the write at once (rather than
        with a failed future) is answered as one whose write failed: the caller's memory
        is already ahead of the store, and only the failed future's path (the queue
        marked for rebuild, and :meth:`_keep_from` told what the call changed) puts it
        back as it was."""
        try:
            done = self._store.submit(write)
        except BaseException as exc:
            done = _failed(exc)
        q.last_write = done
        return done

    def _in_memory(self, namespace: str, topic: str, queue: str) -> _Queue | None:
        """The queue's memory if it is loaded and usable (None: :meth:`_load` it)."""
        q = self._queues.get(self._qid(namespace, topic, queue))
        return None if q is None or q.broken else q

    def _require(self, namespace: str, topic: str, queue: str) -> _Queue:
        q = self._load(namespace, topic, self._qid(namespace, topic, queue))
        if q is None:
            raise QueueNotFound(f"topic {namespace}:{topic} has no queue {queue}")
        return q

    def _open(
        self,
        namespace: str,
        topic: str,
        queue: str,
        max_deliveries: int | None,
        dead_letter: str | None,
        start: str,
    ) -> _Queue:
        self.check_settings(topic, max_deliveries, dead_letter, start)
        qid = self._qid(namespace, topic, queue)
        q = self._load(namespace, topic, qid)
        if q is None:
            with self._lock:
                q = self._queues.get(qid)
                if q is None:
                    read = None
                    if start == "latest":
                        end = self._messaging.end(namespace, topic, self._snapshot())
                        read = end.newest_id
                        if end.last_stable_id is not None:
                            read = end.last_stable_id.previous()
                    record = QueueRecord(
                        max_deliveries or DEFAULT_MAX_DELIVERIES,
                        dead_letter or dead_letter_topic(topic),
                        start,
                        read,
                    )
                    self._store.apply(
                        _write_all([(qkeys.queue_key(*qid), qkeys.encode_queue(record))])
                    )
                    q = self._queues[qid] = _Queue(namespace, topic, qid, record)
        wanted_max = q.record.max_deliveries if max_deliveries is None else max_deliveries
        wanted_dlq = q.record.dead_letter_topic if dead_letter is None else dead_letter
        if (wanted_max, wanted_dlq) != (q.record.max_deliveries, q.record.dead_letter_topic):
            with q.lock:
                q.record = QueueRecord(wanted_max, wanted_dlq, q.record.start, q.record.read)
                # The read position as the store has it: memory's may be past leases
                # not written yet.
                stored = QueueRecord(wanted_max, wanted_dlq, q.record.start, q.durable_read)
                done = self._submit(
                    q, _write_all([(qkeys.queue_key(*q.qid), qkeys.encode_queue(stored))])
                )
            self._await(q, done)
        return q

    def _load(self, namespace: str, topic: str, qid: _QueueId) -> _Queue | None:
        """The queue's memory, rebuilt from its records on first use (None: no queue),
        or after a store write of it failed (keeping what the records cannot say:
        :meth:`_keep_from`)."""
        with self._lock:
            q = self._queues.get(qid)
            if q is not None and not q.broken:
                return q
            if q is None:
                return self._rebuild(namespace, topic, qid)
            # No write of the old memory may land after its records are read: its
            # callers are held off (and then turned away), its last write awaited.
            with q.lock:
                q.replaced = True
                last = q.last_write
                if last is not None:
                    futures.wait([last])
                return self._rebuild(namespace, topic, qid, q)

    def _rebuild(
        self, namespace: str, topic: str, qid: _QueueId, old: _Queue | None = None
    ) -> _Queue | None:
        with self._store.read() as view:
            raw = view.get(_META, qkeys.queue_key(*qid))
            if raw is None:
                return None
            start, stop = qkeys.leases_range(*qid)
            leases = [
                (qkeys.lease_no_of(k), qkeys.decode_lease(v))
                for k, v in view.scan(_META, start, stop)
            ]
        q = _Queue(namespace, topic, qid, qkeys.decode_queue(raw))
        snapshot = self._snapshot()
        resolved = {
            lease_no
            for lease_no, record in leases
            if _resolved_before(record, lease_no, snapshot, old)
        }
        found = self._messages(
            namespace,
            topic,
            [m for n, r in leases if n not in resolved for m, _ in r.entries],
        )
        now = self._now()
        for lease_no, record in leases:
            if lease_no in resolved:
                # Acked before this memory, which neither counts them nor knows who
                # acked them (as for any ack before a restart). The record goes with
                # the next write.
                q.leases[lease_no] = _Lease("", 0, 0, {}, durable=True)
                q.dirty.add(lease_no)
                q.next_lease = max(q.next_lease, lease_no + 1)
                continue
            owner, deadline, write_pointer = record.owner, record.deadline, record.write_pointer
            if write_pointer in snapshot.invalid:
                # Acked in a transaction that failed: back in the queue, as the next
                # call's settle would have them (the memory replaced may have handed
                # them out again already; the record goes with the next write).
                owner, deadline, write_pointer = "", 0, 0
                q.dirty.add(lease_no)
            lease = _Lease(owner, deadline, write_pointer, {}, durable=True)
            q.leases[lease_no] = lease
            q.next_lease = max(q.next_lease, lease_no + 1)
            for message_id, count in record.entries:
                message = found.get(message_id)
                if message is None:
                    continue  # past its retention meanwhile: nothing to deliver
                owners = [record.owner] if record.owner else []
                q.entries[message_id] = _Entry(message, count, lease_no, owners)
                lease.ids[message_id] = None
            if not write_pointer and (not owner or deadline <= now):
                lease.expired = bool(owner)
                q.available.extend(lease.ids)
        if old is not None:
            self._keep_from(old, q)
        heapq.heapify(q.available)
        self._queues[qid] = q
        return q

    def _keep_from(self, old: _Queue, q: _Queue) -> None:
        """Carry into ``q``, rebuilt from the records after a write of ``old`` failed,
        what only ``old`` knew. Leases no write recorded yet (a pop writes nothing)
        stay with their workers where the records leave their messages free, rather
        than go to the next pop while their workers still hold them; so do messages
        whose ack's write failed (the worker was told so, and may ack again), and
        those of a nack, release or extension whose write failed, as they were held
        before it, and those of a pop whose dead-lettering failed. A lease that ran out
        while nobody took its messages stays its worker's as well (to extend or ack).
        The other messages read since the last write that landed are the queue's again
        (a dead-lettering that failed goes again at the next pop). Where the records
        say a message is held (by a lease or a transaction) or acked, they win. The
        counters and the rates carry on, less what the calls that answered an error
        counted."""
        q.popped, q.acked, q.nacked = old.popped, old.acked, old.nacked
        q.redelivered, q.dead_lettered, q.expired = old.redelivered, old.dead_lettered, old.expired
        q.pop_rate, q.ack_rate, q.recent = old.pop_rate, old.ack_rate, old.recent
        # What old had of each message: its entry and lease, the acks that failed too.
        had: dict[MessageId, tuple[_Entry, _Lease | None]] = {
            m: (entry, old.leases.get(entry.lease)) for m, entry in old.entries.items()
        }
        for pop in old.dead_pops:
            if _landed(pop.write):
                continue
            # A pop that answered an error: as if it had not been made.
            failed = pop.lease
            for m in failed.ids:
                if m not in had:
                    continue  # acked since by a purge whose write landed
                entry = had[m][0]
                copy = _Entry(entry.item, entry.count, entry.lease, entry.owners)
                had[m] = (copy, pop.before.get(m))
            _unpop(failed, {m: had[m][0] for m in failed.ids if m in had})
            # Its dead messages are the queue's again, with the deliveries they had
            # since the records were written (at their last, they go at the next pop).
            for m, entry in pop.dead:
                had.setdefault(m, (entry, pop.before.get(m)))
            _undead(q.recent, pop.dead)
            q.popped -= pop.popped
            q.redelivered -= pop.redelivered
            q.dead_lettered -= pop.dead_lettered
            # The rates too: an operator reading them would see work that was not done
            # (a second of the window already past is not read any more anyway).
            q.pop_rate.add(-pop.popped, pop.at)
        for ack in old.unlanded:
            if not _landed(ack.write):
                q.acked -= len(ack.ids)  # the worker was told the ack failed
                q.ack_rate.add(-len(ack.ids), ack.at)
                # Nor does anyone remember it acked them (a purge would have them
                # answered "another worker acked it" then).
                for m in ack.ids:
                    q.recent.pop(_ID.pack(*m), None)
                for m, entry in zip(ack.ids, ack.entries, strict=True):
                    had[m] = (entry, ack.leases.get(entry.lease))
        for moved in old.moved:
            if _landed(moved.write):
                continue
            # A nack, release or extension that answered an error: its messages are
            # held as before it, where nothing moved them since.
            q.nacked -= moved.nacked
            for m, (into, held_by) in moved.leases.items():
                now_had = had.get(m)
                if now_had is not None and now_had[1] is into:
                    had[m] = (now_had[0], held_by)
        kept: dict[int, int] = {}  # id() of old's lease -> q's lease holding its messages

        def keeper(lease: _Lease | None) -> int | None:
            """The lease of ``q`` that keeps a message of ``lease`` with its worker
            (None: it is nobody's). One that ran out stays its worker's (to extend
            or ack) until another worker takes its messages, as in ``old``; one whose
            deadline passed unnoticed runs out at the next call, counted then."""
            if lease is None or not _held(lease):
                return None
            if id(lease) not in kept:
                lease_no = q.new_lease(lease.owner, lease.deadline, 0)
                # A transaction's ack keeps deadline 0 for a lease that had run out.
                q.leases[lease_no].expired = lease.expired or (
                    bool(lease.write_pointer) and not lease.deadline
                )
                kept[id(lease)] = lease_no
            return kept[id(lease)]

        read, old_read = q.record.read, old.record.read
        if old_read is not None and (read is None or old_read > read):
            returned: list[MessageId] = []
            for message in self._read_between(old, read, old_read):
                message_id = message.id
                if message_id in q.entries:
                    continue  # named by a record: as below
                before = had.get(message_id)
                lease_no = None
                if before is not None:
                    entry = _Entry(message, before[0].count, 0, list(before[0].owners))
                    lease_no = keeper(before[1])
                elif old.recent.get(_ID.pack(*message_id)) == _DEAD:
                    entry = _Entry(message, q.record.max_deliveries, 0, [])
                else:  # past its retention in old's eyes: the next pop tells
                    entry = _Entry(message, 0, 0, [])
                q.entries[message_id] = entry
                if lease_no is None:
                    returned.append(message_id)
                    continue
                q.put_in(lease_no, [message_id])
                if q.is_available(entry):  # its lease ran out
                    q.available.append(message_id)
            if returned:
                lease_no = q.new_lease("", 0, 0)
                q.put_in(lease_no, returned)
                q.available.extend(returned)
            # Written with the next write, with the leases above (all new, so dirty).
            q.record = _replace_read(q.record, old_read)
        for message_id, (was, lease) in had.items():
            now_in = q.entries.get(message_id)
            if now_in is not None and was.owners and now_in.owners == was.owners[-1:]:
                # Held by the worker the records name: the workers before it too, so
                # that one of them acking it is told it passed on, as before.
                now_in.owners = list(was.owners)
            if now_in is None or not q.is_available(now_in):
                continue  # acked or past retention, kept above, or held per the records
            # Its deliveries and workers as old knew them (a record of a returned
            # lease names no worker): the last worker may still ack it, as before.
            if was.count > now_in.count:
                now_in.count = was.count
                q.dirty.add(now_in.lease)
            now_in.owners = list(was.owners)
            lease_no = keeper(lease)
            if lease_no is None:
                continue
            q.dirty.update(q.take([message_id]))
            q.put_in(lease_no, [message_id])

    def _read_between(self, q: _Queue, after: MessageId | None, last: MessageId) -> list[Message]:
        """The topic's messages after ``after`` up to ``last`` as the queue's pops read
        them (read-committed: the range was decided when they read it)."""
        out: list[Message] = []
        start, inclusive = after, after is None
        snapshot = self._snapshot()
        while True:
            page = self._messaging.fetch(
                q.namespace,
                q.topic,
                start=start,
                inclusive=inclusive,
                limit=1000,
                transaction=snapshot,
                count=False,
            )
            out.extend(m for m in page if m.id <= last)
            if len(page) < 1000 or page[-1].id >= last:
                return out
            start, inclusive = page[-1].id, False

    def _messages(
        self, namespace: str, topic: str, ids: Sequence[MessageId]
    ) -> dict[MessageId, Message]:
        """The messages with these ids that the topic still holds, read page by page
        from each id not yet found."""
        found: dict[MessageId, Message] = {}
        for message_id in sorted(ids):
            if message_id in found:
                continue
            page = self._messaging.fetch(
                namespace, topic, start=message_id, inclusive=True, limit=1000, count=False
            )
            found.update((m.id, m) for m in page)
        wanted = set(ids)
        return {k: v for k, v in found.items() if k in wanted}

    def _settle(self, q: _Queue, snapshot: Transaction) -> None:
        """Bring the queue up to now: transactions holding acks that ended resolve (acked
        if committed, back to the queue if not); leases past their deadline return
        their messages. Writes nothing: the leases it changes are written with the
        queue's next write (a lease's record under a pointer that ended resolves the
        same way after a restart, and keeps that pointer off the pruned invalid list
        until then; a deadline that passed says the same)."""
        self._unrefuse(q)
        for lease_no, lease in list(q.leases.items()):
            wp = lease.write_pointer
            if not wp:
                continue
            if wp in snapshot.invalid:
                lease.write_pointer, lease.owner, lease.deadline = 0, "", 0
                q.available.extend(lease.ids)
                heapq.heapify(q.available)
                q.dirty.add(lease_no)
            elif is_visible(snapshot, wp):
                for message_id in lease.ids:
                    del q.entries[message_id]
                q.remember_acked(lease.ids, lease.owner)
                q.acked += len(lease.ids)
                q.ack_rate.add(len(lease.ids), time.monotonic())
                lease.ids.clear()
                lease.write_pointer, lease.owner, lease.deadline = 0, "", 0
                q.dirty.add(lease_no)
        now = self._now()
        for lease in q.leases.values():
            if lease.active() and lease.deadline <= now:
                lease.expired = True
                q.expired += len(lease.ids)
                for message_id in lease.ids:
                    heapq.heappush(q.available, message_id)

    def _unrefuse(self, q: _Queue) -> None:
        """Memory as the store has it after acks it refused (see :func:`_ack_write`):
        their messages back with their workers, or in the queue where the worker's
        lease had run out."""
        while q.refused:
            write_pointer = q.refused.pop()
            for lease_no, lease in q.leases.items():
                if lease.write_pointer != write_pointer:
                    continue
                lease.write_pointer = 0
                # Written again with the next write: an earlier ack under the same
                # pointer, which landed, still has the pointer in its record.
                q.dirty.add(lease_no)
                if not lease.deadline:
                    lease.owner = ""
                    q.available.extend(lease.ids)
                    heapq.heapify(q.available)

    def _claim(
        self,
        q: _Queue,
        consumer: str,
        ids: Sequence[MessageId],
        write_pointer: int | None,
        *,
        skipped: list[MessageId] | None = None,
    ) -> list[MessageId]:
        """The messages of ``ids`` the call may act on (those it acked already are left
        out), or the error naming those it may not. ``skipped``: raise nothing; every
        id the call may not act on (or that was acked) is added to it instead."""
        unknown: list[MessageId] = []
        #: Read, held by no lease, and no longer in the topic.
        gone: list[MessageId] = []
        conflicts: list[tuple[MessageId, str]] = []
        todo: dict[MessageId, None] = {}
        #: Read, held by no lease and not among the acks remembered: acked, by a worker
        #: no longer known (before a restart, or long ago), if the topic holds it.
        forgotten: dict[MessageId, None] = {}
        read = q.record.read
        for message_id in ids:
            entry = q.entries.get(message_id)
            if entry is None:
                acker = q.recent.get(_ID.pack(*message_id))
                if read is None or message_id > read:
                    unknown.append(message_id)
                elif acker is None:
                    forgotten[message_id] = None
                elif acker == _DEAD:
                    conflicts.append((message_id, "it was moved to the dead-letter topic"))
                elif acker != consumer:
                    conflicts.append((message_id, "another worker acked it"))
                elif write_pointer is not None:
                    conflicts.append((message_id, "it was acked already, outside this transaction"))
                elif skipped is not None:
                    skipped.append(message_id)
                continue
            lease = q.leases[entry.lease]
            if lease.write_pointer:
                if lease.write_pointer != write_pointer:
                    conflicts.append((message_id, "a transaction still open acked it"))
                continue  # acked in this transaction already
            if consumer not in entry.owners:
                unknown.append(message_id)
            elif (lease.owner if lease.active() else entry.owners[-1]) != consumer:
                conflicts.append((message_id, "its lease passed to another worker"))
            else:
                todo[message_id] = None
        if forgotten:
            # A plain ack sent again after its answer was lost (the server restarted
            # meanwhile) is answered as done, as before the restart; a transactional
            # one cannot tell whether it conflicts, so it is refused as before.
            if write_pointer is not None:
                unknown.extend(forgotten)
            else:
                held = self._messaging.held_ids(q.namespace, q.topic, list(forgotten))
                for message_id in forgotten:
                    if message_id not in held:
                        gone.append(message_id)
                    elif skipped is not None:
                        skipped.append(message_id)
        if skipped is not None:
            left = {*unknown, *gone, *(m for m, _ in conflicts), *skipped}
            skipped[:] = [m for m in dict.fromkeys(ids) if m in left]
            return list(todo)
        if unknown or gone:
            said = []
            if unknown:
                said.append(
                    f"{len(unknown)} message(s) were never delivered to this worker by "
                    f"queue {q.qid[2]} (or were acked already): {_ids_text(unknown)}"
                )
            if gone:
                # Retention deleted them after their lease ran out (or the server
                # restarted): the queue no longer knows who held them, nor can it tell
                # them from ids never in the topic. Never delivered again either way.
                said.append(
                    f"{len(gone)} message(s) are not in topic {q.topic} any more (past "
                    "its retention or their own expiry, or never in it) and queue "
                    f"{q.qid[2]} holds no lease of them: nothing to ack, and they are not "
                    f"delivered again: {_ids_text(gone)}"
                )
            raise NotDelivered("; ".join(said))
        if conflicts:
            reasons = sorted({why for _, why in conflicts})
            raise AckConflict(
                f"{len(conflicts)} message(s) of queue {q.qid[2]} cannot be acked by this "
                f"worker ({'; '.join(reasons)}): {_ids_text([m for m, _ in conflicts])}"
            )
        return list(todo)

    def _dead_letter(
        self,
        q: _Queue,
        dead: list[tuple[MessageId, _Entry]],
        writes: list[tuple[bytes, bytes | None]],
    ) -> Future[None]:
        target = q.record.dead_letter_topic
        with contextlib.suppress(TopicAlreadyExists):
            self._messaging.create_topic(q.namespace, target)
        records = []
        for message_id, entry in sorted(dead, key=_first):
            message = item_message(entry.item)
            headers = {
                **message.headers,
                "tidings-dead-letter-id": message_id.hex.encode("ascii"),
                "tidings-dead-letter-topic": q.topic.encode("ascii"),
                "tidings-dead-letter-queue": q.qid[2].encode("ascii"),
                "tidings-delivery-count": str(entry.count).encode("ascii"),
            }
            records.append(Record(message.payload, message.key, headers))
        done = self._messaging.publish_with_future(q.namespace, target, records, _write_all(writes))
        q.last_write = done
        return done

    def _await(self, q: _Queue, done: Future[None]) -> None:
        try:
            done.result()
        except BaseException:
            # Memory ran ahead of a write that failed: rebuild it from the records.
            q.broken = True
            raise

    def _unread(
        self, namespace: str, topic: str, read: MessageId | None, snapshot: Transaction
    ) -> tuple[int, bool]:
        count = 0
        start = read
        page_size = self._messaging.config.fetch_max_limit
        while count < _DEPTH_BUDGET:
            page = self._messaging.fetch_ids(
                namespace,
                topic,
                start=start,
                inclusive=start is None,
                limit=page_size,
                transaction=snapshot,
                count=False,  # counting the depth is no poll
            )
            count += len(page)
            if len(page) < page_size:
                return count, True
            start = page[-1]
        return count, False

    def _notify(self, namespace: str, topic: str) -> None:
        for fn in self._listeners:
            fn(namespace, topic)


def _unpop(lease: _Lease, entries: dict[MessageId, _Entry]) -> None:
    """Undo a pop whose answer was an error: its lease is nobody's, and its messages'
    delivery counts and workers are as before it."""
    lease.owner = ""
    for message_id in lease.ids:
        entry = entries.get(message_id)
        if entry is None:
            continue
        entry.count -= 1
        entry.owners = entry.owners[:-1]


def _undead(recent: dict[bytes, str], dead: Iterable[tuple[MessageId, _Entry]]) -> None:
    """Forget that messages whose dead-lettering failed were acked as dead letters."""
    pack = _ID.pack
    for message_id, _ in dead:
        key = pack(*message_id)
        if recent.get(key) == _DEAD:
            del recent[key]


def _resolved_before(
    record: LeaseRecord, lease_no: int, snapshot: Transaction, old: _Queue | None
) -> bool:
    """Whether a lease record holds acks of a transaction that committed before the
    memory being built: before a restart, or (after a failed write) seen resolved by
    the memory it replaces, which counted them then."""
    write_pointer = record.write_pointer
    if not write_pointer or not is_visible(snapshot, write_pointer):
        return False
    if old is None:
        return True
    was = old.leases.get(lease_no)
    return was is None or was.write_pointer != write_pointer


def _as_was(lease: _Lease) -> _Lease:
    """A copy of a lease's owner, deadline and state (not its messages)."""
    return _Lease(
        lease.owner,
        lease.deadline,
        lease.write_pointer,
        {},
        lease.expired,
        answered_after=lease.answered_after,
    )


def _leases_of(q: _Queue, ids: Iterable[MessageId]) -> dict[MessageId, _Lease]:
    """The lease each message is held by, as it is now (one copy per lease)."""
    copies: dict[int, _Lease] = {}
    out: dict[MessageId, _Lease] = {}
    for message_id in ids:
        lease_no = q.entries[message_id].lease
        if lease_no not in copies:
            copies[lease_no] = _as_was(q.leases[lease_no])
        out[message_id] = copies[lease_no]
    return out


def _failed(exc: BaseException) -> Future[None]:
    """The future of a write refused before it was queued."""
    done: Future[None] = Future()
    done.set_running_or_notify_cancel()
    done.set_exception(exc)
    return done


def _landed(write: Future[None]) -> bool:
    return write.done() and not write.cancelled() and write.exception() is None


class _Pending(Protocol):
    """What a call changed in memory, kept until its store write is known to land."""

    write: Future[None]


_P = TypeVar("_P", bound=_Pending)


def _pend(pending: deque[_P], item: _P) -> None:
    """Keep ``item`` last in ``pending`` (oldest first), first letting go of those
    whose writes landed: a rebuild only needs what may still fail."""
    while pending and _landed(pending[0].write):
        pending.popleft()
    pending.append(item)


def _held(lease: _Lease) -> bool:
    """Whether this lease of a memory being replaced is a worker's (held, or run out
    while nobody took its messages): the pop that made it answered (not one whose
    dead-lettering failed)."""
    if not lease.owner:
        return False
    return lease.answered_after is None or _landed(lease.answered_after)


def _current(q: _Queue, may_wait: bool = True) -> None:
    """Refuse a call that took the queue's memory just before it was rebuilt (after a
    failed write): changed, it would hand out or write what the queue no longer has.
    On the event loop (``may_wait`` false) the caller goes to a worker, which loads the
    rebuilt memory; elsewhere the worker asks again."""
    if not q.replaced:
        return
    if not may_wait:
        raise WouldWait
    raise ServiceUnavailable(f"queue {q.qid[2]} was just reloaded from the store: retry")


def _item_bytes(item: Message | bytes) -> int:
    """About the bytes a leased message counts for in a pop's ``max_bytes``: an
    answer item's payload, key and headers as it encodes them (all but its id), or a
    message's payload and key."""
    if type(item) is bytes:
        return len(item) - 21  # the id: its length byte and 20 bytes
    assert isinstance(item, Message)
    return len(item.payload) + (len(item.key) if item.key is not None else 0)


def _same_settings(
    record: QueueRecord, max_deliveries: int | None, dead_letter: str | None
) -> bool:
    """Whether a pop's settings leave the queue's as they are."""
    return (max_deliveries is None or max_deliveries == record.max_deliveries) and (
        dead_letter is None or dead_letter == record.dead_letter_topic
    )


def _settle_from(
    q: _Queue, written: Future[None], done: Future[None], refused: Sequence[TidingsError] = ()
) -> None:
    """Pass a store write's outcome on to the future a caller waits on (``refused``:
    the error that refused a transactional ack in that write, which landed)."""
    exc: BaseException | None
    if written.cancelled():
        exc = ServerError("a queue's store write was cancelled")
    else:
        exc = written.exception()
    if exc is not None:
        q.broken = True  # memory ran ahead of a write that failed: rebuild it
    elif refused:
        exc = refused[0]
    if done.set_running_or_notify_cancel():
        if exc is not None:
            done.set_exception(exc)
        else:
            done.set_result(None)


def _first(pair: tuple[MessageId, _Entry]) -> MessageId:
    return pair[0]


def _replace_read(record: QueueRecord, read: MessageId) -> QueueRecord:
    return QueueRecord(record.max_deliveries, record.dead_letter_topic, record.start, read)


def _put_all(view: WriteView, writes: list[tuple[bytes, bytes | None]]) -> None:
    """Each key's new record, or its deletion where the value is None."""
    for key, value in writes:
        if value is None:
            view.delete(_META, key)
        else:
            view.put(_META, key, value)


def _write_all(
    writes: list[tuple[bytes, bytes | None]],
    tx: TransactionManager | None = None,
    write_pointer: int | None = None,
) -> Callable[[WriteView], None]:
    def write(view: WriteView) -> None:
        if tx is not None and write_pointer is not None:
            # In the write itself, as publishes are: nothing lands under a transaction
            # that ended, so pruning the invalid list stays safe.
            tx.check_writable(write_pointer, action=_ACK_UNDER)
        _put_all(view, writes)

    return write


def _ack_write(
    writes: list[tuple[bytes, bytes | None]],
    held_by: dict[bytes, bytes],
    tx: TransactionManager,
    write_pointer: int,
    q: _Queue,
    refused: list[TidingsError],
) -> Callable[[WriteView], None]:
    """The store write of a transactional ack: ``writes``, unless the transaction ended
    before it lands (nothing may be written under an ended pointer: pruning its invalid
    entry would make it count); then the leases under the pointer are written as
    ``held_by`` has them, and the error goes in ``refused`` and the pointer in
    ``q.refused``, for memory to follow at the queue's next call."""

    def write(view: WriteView) -> None:
        chosen = writes
        try:
            tx.check_writable(write_pointer, action=_ACK_UNDER)
        except TidingsError as exc:
            refused.append(exc)
            q.refused.add(write_pointer)
            chosen = [(key, held_by.get(key, value)) for key, value in writes]
        _put_all(view, chosen)

    return write


def _check_consumer(consumer: object) -> None:
    if not isinstance(consumer, str) or not 1 <= len(consumer) <= 64 or not _alnum(consumer):
        raise BadRequest("a consumer id is 1-64 letters and digits")


def _check_ids(ids: Sequence[MessageId]) -> None:
    if not ids:
        raise BadRequest("an ack, nack or extend names at least one message id")


def _ids_text(ids: Sequence[MessageId]) -> str:
    shown = ", ".join(m.hex for m in ids[:10])
    return shown if len(ids) <= 10 else f"{shown} and {len(ids) - 10} more"


def _alnum(text: str) -> bool:
    # ASCII only: str.isalnum() takes any script's letters, the stored form does not.
    return text.isascii() and text.isalnum()
