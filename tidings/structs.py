"""Small immutable value types shared by every layer (server, client, core, Spark).

They hold data only; encodings live in ``tidings.codec`` and ``tidings.codec.transaction``.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import NamedTuple

from tidings.errors import InvalidMessageId

__all__ = [
    "NO_HEADERS",
    "GroupAssignment",
    "GroupInfo",
    "GroupPartition",
    "Message",
    "MessageId",
    "PayloadRange",
    "ProducerInfo",
    "QueueStats",
    "Record",
    "RollbackInfo",
    "TopicEnd",
    "TopicMetadata",
    "TopicStats",
    "Transaction",
    "TransactionEnd",
    "TransactionState",
]

#: The one layout of a message id: publish_ts (8) | seq (2) | write_ts (8) | p_seq (2).
MESSAGE_ID_LAYOUT = ">QHQH"
_ID = struct.Struct(MESSAGE_ID_LAYOUT)
MESSAGE_ID_SIZE = _ID.size  # 20


class MessageId(NamedTuple):
    """A message's position in its topic: ``publish_ts | seq | write_ts | p_seq``.

    Ids compare (and their 20-byte forms sort) exactly in the order every consumer sees.
    ``write_ts`` and ``p_seq`` are 0 unless the message was stored in the Payload Table.
    A NamedTuple rather than a frozen dataclass: consumers build one per message, and
    a frozen dataclass costs several times more to construct (measured in fetch).
    """

    publish_ts: int
    seq: int
    write_ts: int = 0
    p_seq: int = 0

    def to_bytes(self) -> bytes:
        """The 20-byte big-endian form (byte order equals id order)."""
        return _ID.pack(*self)

    @property
    def hex(self) -> str:
        """The 40-character lower-case hex form used in URLs, JSON and the CLI."""
        return self.to_bytes().hex()

    def previous(self) -> MessageId:
        """The greatest id below this one: a position "after" it is "at" this id."""
        ts, seq, wts, pseq = self
        top64, top16 = 0xFFFFFFFFFFFFFFFF, 0xFFFF
        if pseq:
            return MessageId(ts, seq, wts, pseq - 1)
        if wts:
            return MessageId(ts, seq, wts - 1, top16)
        if seq:
            return MessageId(ts, seq - 1, top64, top16)
        return MessageId(ts - 1, top16, top64, top16)

    @classmethod
    def from_bytes(cls, raw: bytes) -> MessageId:
        """Parse the 20-byte form; raises :class:`InvalidMessageId` on any other length."""
        if len(raw) != MESSAGE_ID_SIZE:
            raise InvalidMessageId(f"a message id is {MESSAGE_ID_SIZE} bytes, got {len(raw)}")
        return cls._make(_ID.unpack(raw))

    @classmethod
    def from_hex(cls, text: str) -> MessageId:
        """Parse the 40-character hex form; raises :class:`InvalidMessageId`."""
        if len(text) != 2 * MESSAGE_ID_SIZE:
            raise InvalidMessageId(f"a message id is 40 hex characters, got {len(text)}")
        try:
            raw = bytes.fromhex(text)
        except ValueError:
            raise InvalidMessageId(f"not a hex message id: {text!r}") from None
        return cls.from_bytes(raw)

    def __str__(self) -> str:
        return self.hex


#: The headers of a message without any (shared, read-only).
NO_HEADERS: Mapping[str, bytes] = MappingProxyType({})


class Record(NamedTuple):
    """A message to publish: a payload plus optional key, headers and a shorter TTL.

    ``ttl`` (seconds) may only shorten the topic's TTL for this one message.
    """

    payload: bytes
    key: bytes | None = None
    headers: Mapping[str, bytes] = NO_HEADERS
    ttl: int | None = None


class Message(NamedTuple):
    """A consumed message. ``publish_time`` is milliseconds since the epoch.

    ``write_pointer`` is the transaction that published it (None if non-transactional);
    it is negative when that transaction was rolled back (seen only by
    non-transactional consumers). Only messages read in the server's process carry it:
    a poll's answer has no such field, so the HTTP clients' messages always have None.

    ``delivery_count`` is set on messages a queue hands out (:meth:`Client.queue`): 1 on
    the first delivery to the queue's group, one more on each redelivery. Messages read
    any other way carry 0.
    """

    id: MessageId
    payload: bytes
    key: bytes | None = None
    headers: Mapping[str, bytes] = NO_HEADERS
    write_pointer: int | None = None
    delivery_count: int = 0

    @property
    def publish_time(self) -> int:
        """Publish time in milliseconds since the epoch (from the id)."""
        return self.id.publish_ts


class PayloadRange(NamedTuple):
    """The Payload Table rows one ``store`` wrote: from ``(first_ts, first_seq)`` to
    ``(last_ts, last_seq)`` inclusive, the ``write_ts | p_seq`` of its first and last row.

    A store assigns its rows one contiguous run of positions in a single write, so the
    range holds exactly that store's rows and no other's. A pointer publish that names
    ranges exposes only the rows inside them (a Spark sink publishes only the ranges of
    the task attempts that succeeded).
    """

    first_ts: int
    first_seq: int
    last_ts: int
    last_seq: int

    @property
    def first(self) -> tuple[int, int]:
        """``(first_ts, first_seq)``."""
        return self.first_ts, self.first_seq

    @property
    def last(self) -> tuple[int, int]:
        """``(last_ts, last_seq)``."""
        return self.last_ts, self.last_seq


@dataclass(frozen=True, slots=True)
class TopicMetadata:
    """A topic as the Metadata Table holds it. ``ttl`` is in seconds."""

    namespace: str
    name: str
    ttl: int
    generation: int
    properties: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class RollbackInfo:
    """What a transactional publish wrote, enough to roll exactly those entries back.

    Mirrors CDAP TMS's PublishResponse: the entries are the Message Table rows from
    ``(start_ts, start_seq)`` to ``(end_ts, end_seq)`` inclusive, all carrying
    ``write_pointer``.
    """

    write_pointer: int
    start_ts: int
    start_seq: int
    end_ts: int
    end_seq: int


@dataclass(frozen=True, slots=True)
class Transaction:
    """A transaction snapshot (Tephra): what the holder of ``write_pointer`` may see.

    ``invalid`` and ``in_progress`` are sorted ascending.
    """

    read_pointer: int
    write_pointer: int
    invalid: tuple[int, ...] = ()
    in_progress: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class TransactionEnd:
    """How an abort or invalidate left a transaction.

    ``outcome`` is how it ended: ``"aborted"``, or invalid: ``"invalidated"``,
    ``"timedOut"`` (its timeout passed), ``"fenced"`` (its transactional id was
    registered again) or ``"unlogged"`` (the service stopped before its begin was
    durable). ``already`` is True if it had ended so before the call, which then
    changed nothing: an abort of a transaction that timed out answers
    ``TransactionEnd("timedOut", already=True)``.
    """

    outcome: str
    already: bool = False

    @property
    def aborted(self) -> bool:
        """The transaction is aborted (by this call or an earlier one), not invalid."""
        return self.outcome == "aborted"


@dataclass(frozen=True, slots=True)
class TransactionState:
    """The transaction service's state: ``in_progress`` maps write pointer to expiry (ms)."""

    read_pointer: int
    last_write_pointer: int
    in_progress: Mapping[int, int]
    invalid: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ProducerInfo:
    """A registered transactional id (KIP-98): its producer id and current epoch."""

    transactional_id: str
    producer_id: int
    epoch: int


@dataclass(frozen=True, slots=True)
class TopicStats:
    """A topic's live contents and traffic, as ``GET .../topics/{t}/stats`` reports them."""

    namespace: str
    topic: str
    message_count: int
    bytes: int
    oldest_id: MessageId | None
    newest_id: MessageId | None
    oldest_time: int | None
    newest_time: int | None
    messages_published: int
    bytes_published: int
    fetches: int
    publish_rate: float
    fetch_rate: float
    #: The first message of the oldest transaction still open on the topic (None: none
    #: is, or the server cannot tell); see :class:`TopicEnd`.
    last_stable_id: MessageId | None = None
    #: Each consumer group of the topic with its lag in messages.
    group_lags: Mapping[str, int | None] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class GroupAssignment:
    """What a consumer-group member learns on join, heartbeat and poll: its id, the
    group's generation (one per rebalance) and the partitions it owns of
    ``partition_count``; ``owned_since``, where the server tells it (else empty), the
    generation since which the member has held each of ``partitions`` without a break
    (one per partition, in their order): newer than the member last heard, the
    partition moved away and came back meanwhile."""

    member_id: str
    generation: int
    partitions: tuple[int, ...]
    partition_count: int
    owned_since: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class GroupPartition:
    """One partition of a consumer group: its owner, committed position (the id of the
    last message consumed; None: none yet) and lag (read-committed messages after the
    position; a lower bound where ``lag_exact`` is False). Without a position the lag
    counts from where a member would start: every message for a group starting at
    "earliest"; None for one starting at "latest", which has no place to count from
    (Kafka's "-")."""

    partition: int
    owner: str | None
    position: MessageId | None
    lag: int | None
    lag_exact: bool = True


@dataclass(frozen=True, slots=True)
class GroupInfo:
    """A consumer group as ``describe`` shows it."""

    group: str
    partition_count: int
    generation: int
    start: str
    members: Mapping[str, tuple[int, ...]]
    partitions: tuple[GroupPartition, ...]
    end: MessageId | None

    @property
    def lag(self) -> int | None:
        """The group's total lag, in messages: the sum over the partitions that have a
        lag (None where none has: a group starting at "latest" that committed nothing)."""
        known = [p.lag for p in self.partitions if p.lag is not None]
        return sum(known) if known else None


@dataclass(frozen=True, slots=True)
class QueueStats:
    """A queue (:meth:`Client.queue`) as ``describe`` shows it.

    ``cursor``: every message at or before it is acked (or dead-lettered); ``read``:
    every message at or before it was handed out at least once. ``pending``: messages
    leased to workers now (with those acked in transactions still open); ``waiting``:
    messages available now (returned ones and those not read yet; a lower bound where
    ``waiting_exact`` is False). ``consumers``: each worker's leased messages. The
    counters and rates count since the server started; ``pushed`` counts messages
    published to the topic (every group of it gets each one). ``ack_state``: the lease
    entries the queue keeps (its whole ack state: the messages in flight)."""

    queue: str
    max_deliveries: int
    dead_letter_topic: str
    start: str
    cursor: MessageId | None
    read: MessageId | None
    pending: int
    waiting: int
    waiting_exact: bool
    consumers: Mapping[str, int]
    pushed: int
    popped: int
    acked: int
    nacked: int
    redelivered: int
    dead_lettered: int
    expired: int
    pop_rate: float
    ack_rate: float
    ack_state: int


@dataclass(frozen=True, slots=True)
class TopicEnd:
    """Where a topic ends now. ``newest_id``: its newest message (None: empty).
    ``last_stable_id``: the first message of the oldest transaction still open on it
    (Kafka's last stable offset), None when none is open (or it cannot be known, when
    ``stable_known`` is False: the server runs no transaction service). A
    read-committed reader starting at "latest" starts at ``last_stable_id`` (inclusive)
    if set, else after ``newest_id``: then it misses no transaction that commits later."""

    newest_id: MessageId | None
    last_stable_id: MessageId | None
    stable_known: bool = True
