"""Keys and values of queue state in the Metadata table (prefix ``que.``).

::

    que.q/{topic_id (4)}{generation (4)}{queue}                 -> queue record (JSON)
    que.l/{topic_id (4)}{generation (4)}{len (1)}{queue}{lease (8)}
                                                                -> lease record

A queue belongs to one topic generation, like a consumer group. Its record holds its
settings and its **read position**: every message at or before it was handed out at
least once. The ack state is what is *not* acked: each message at or before the read
position that is not acked sits in exactly one lease record (leased to a worker until
a deadline, returned to the queue, or acked inside a transaction still open); every
other message up to the read position is acked. So the ack state is as large as the
messages in flight, never the topic, and it compacts itself: an ack deletes or
shrinks a lease record (Pulsar's cursor with ack holes, where the cursor is the
oldest lease entry and the holes are the lease entries).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import orjson

from tidings.structs import MessageId

__all__ = [
    "LEASE_PREFIX",
    "QUEUE_PREFIX",
    "LeaseRecord",
    "QueueRecord",
    "decode_lease",
    "decode_queue",
    "encode_lease",
    "encode_queue",
    "lease_key",
    "lease_no_of",
    "leases_range",
    "queue_key",
    "queue_name_of",
    "queues_range",
    "topic_of",
    "topic_range",
]

QUEUE_PREFIX = b"que.q/"
LEASE_PREFIX = b"que.l/"
_TOPIC = struct.Struct(">II")
_LEASE_HEAD = struct.Struct(">qqB")  # deadline (ms), write pointer, owner length
_ENTRY = struct.Struct(">20sH")  # message id, delivery count
_LEASE_NO = struct.Struct(">Q")


@dataclass(frozen=True, slots=True)
class QueueRecord:
    """A queue's settings and read position (None: nothing handed out yet)."""

    max_deliveries: int
    dead_letter_topic: str
    start: str = "earliest"
    read: MessageId | None = None


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    """Messages handed out together and not acked: ``owner`` holds them until
    ``deadline`` (ms since the epoch). ``owner`` empty: returned to the queue.
    ``write_pointer`` non-zero: acked inside that transaction, which has not ended."""

    owner: str
    deadline: int
    write_pointer: int
    entries: tuple[tuple[MessageId, int], ...]  # (message id, delivery count)


def encode_queue(record: QueueRecord) -> bytes:
    """The stored form of a queue record."""
    return orjson.dumps(
        {
            "maxDeliveries": record.max_deliveries,
            "deadLetterTopic": record.dead_letter_topic,
            "start": record.start,
            "read": None if record.read is None else record.read.hex,
        }
    )


def decode_queue(raw: bytes) -> QueueRecord:
    """Inverse of :func:`encode_queue`."""
    obj = orjson.loads(raw)
    read = obj["read"]
    return QueueRecord(
        int(obj["maxDeliveries"]),
        str(obj["deadLetterTopic"]),
        str(obj["start"]),
        None if read is None else MessageId.from_hex(read),
    )


def encode_lease(record: LeaseRecord) -> bytes:
    """The stored form of a lease record."""
    owner = record.owner.encode("ascii")
    parts = [_LEASE_HEAD.pack(record.deadline, record.write_pointer, len(owner)), owner]
    parts.extend(_ENTRY.pack(m.to_bytes(), count) for m, count in record.entries)
    return b"".join(parts)


def decode_lease(raw: bytes) -> LeaseRecord:
    """Inverse of :func:`encode_lease`."""
    deadline, write_pointer, owner_len = _LEASE_HEAD.unpack_from(raw)
    pos = _LEASE_HEAD.size
    owner = raw[pos : pos + owner_len].decode("ascii")
    pos += owner_len
    entries = tuple(
        (MessageId.from_bytes(raw_id), count) for raw_id, count in _ENTRY.iter_unpack(raw[pos:])
    )
    return LeaseRecord(owner, deadline, write_pointer, entries)


def queue_key(topic_id: int, generation: int, queue: str) -> bytes:
    """Key of a queue's record."""
    return QUEUE_PREFIX + _TOPIC.pack(topic_id, generation) + queue.encode("ascii")


def queues_range(topic_id: int, generation: int) -> tuple[bytes, bytes]:
    """Keys of every queue record of one topic generation."""
    prefix = QUEUE_PREFIX + _TOPIC.pack(topic_id, generation)
    return prefix, QUEUE_PREFIX + _TOPIC.pack(topic_id, generation + 1)


def queue_name_of(key: bytes) -> str:
    """The queue name in a queue record's key."""
    return key[len(QUEUE_PREFIX) + _TOPIC.size :].decode("ascii")


def topic_of(key: bytes) -> tuple[int, int]:
    """``(topic id, generation)`` of a queue or lease key."""
    topic_id, generation = _TOPIC.unpack_from(key, len(QUEUE_PREFIX))
    return int(topic_id), int(generation)


def _lease_prefix(topic_id: int, generation: int, queue: str) -> bytes:
    name = queue.encode("ascii")
    return LEASE_PREFIX + _TOPIC.pack(topic_id, generation) + bytes((len(name),)) + name


def lease_key(topic_id: int, generation: int, queue: str, lease: int) -> bytes:
    """Key of one lease record of a queue."""
    return _lease_prefix(topic_id, generation, queue) + _LEASE_NO.pack(lease)


def leases_range(topic_id: int, generation: int, queue: str) -> tuple[bytes, bytes]:
    """Keys of every lease record of one queue, in lease order."""
    prefix = _lease_prefix(topic_id, generation, queue)
    return prefix, prefix + b"\xff" * 9


def lease_no_of(key: bytes) -> int:
    """The lease number at the end of a lease key."""
    return int(_LEASE_NO.unpack_from(key, len(key) - _LEASE_NO.size)[0])


def topic_range(topic_id: int) -> list[tuple[bytes, bytes]]:
    """Every queue key of a topic, all generations (dropped with the topic)."""
    return [
        (prefix + _TOPIC.pack(topic_id, 0), prefix + _TOPIC.pack(topic_id + 1, 0))
        for prefix in (QUEUE_PREFIX, LEASE_PREFIX)
    ]
