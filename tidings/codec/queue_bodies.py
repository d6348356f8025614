"""The JSON bodies of the queue endpoints (docs/api.md, "Queues"), read and written by
both ends. Message ids travel as base64 of their 20 bytes, as in poll answers."""

from __future__ import annotations

import binascii
import struct
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from tidings.codec.admin import start_name
from tidings.codec.json_bodies import integer, only
from tidings.errors import BadRequest, ServerError
from tidings.names import INT64_MAX, NAME_PATTERN
from tidings.structs import MESSAGE_ID_LAYOUT, MessageId, QueueStats

__all__ = [
    "ACK_FIELDS",
    "DELIVERY_COUNTS_HEADER",
    "PopRequest",
    "TransactionAck",
    "read_transaction_acks",
    "transaction_acks_avro",
    "transaction_acks_json",
    "ack_request",
    "consumer_request",
    "delivery_counts",
    "pop_request",
    "queue_json",
    "read_ack_request",
    "read_consumer_request",
    "read_delivery_counts",
    "read_pop_request",
    "read_count",
    "read_queue",
    "read_queue_names",
    "read_rollback_request",
    "rollback_request",
]

_ID = struct.Struct(MESSAGE_ID_LAYOUT)

#: A pop answer's header: each message's delivery count, in order, comma-separated.
DELIVERY_COUNTS_HEADER = "Tidings-Delivery-Counts"


# The fields each request body may have: any other is refused (json_bodies.only).
_POP_FIELDS = frozenset(
    {
        "consumerId",
        "maxMessages",
        "ackTimeoutMs",
        "maxDeliveries",
        "deadLetterTopic",
        "start",
        "ackIds",
    }
)
_CONSUMER_FIELDS = frozenset({"consumerId"})
#: An ack or nack body's fields.
ACK_FIELDS = frozenset({"consumerId", "ids", "transactionWritePointer"})
_EXTEND_FIELDS = ACK_FIELDS | {"ackTimeoutMs"}
_ROLLBACK_FIELDS = frozenset({"transactionWritePointer", "keepLeases"})
_TRANSACTION_ACK_FIELDS = ACK_FIELDS | {"topic", "queue"}


class PopRequest(NamedTuple):
    """The fields of a pop body."""

    consumer: str
    max_messages: int
    ack_timeout_ms: int | None
    max_deliveries: int | None
    dead_letter_topic: str | None
    start: str
    #: Ids this worker acks before the pop, in the same request (``ackIds``).
    ack_ids: list[MessageId]


def _consumer(obj: Mapping[str, Any]) -> str:
    value = obj.get("consumerId")
    if (
        not isinstance(value, str)
        or not 1 <= len(value) <= 64
        or not value.isascii()
        or not value.isalnum()
    ):
        raise BadRequest("consumerId is required: 1-64 letters and digits")
    return value


def _opt_str(obj: Mapping[str, Any], field: str) -> str | None:
    value = obj.get(field)
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise BadRequest(f"{field} must be a non-empty string")
    return value


def pop_request(
    consumer: str,
    max_messages: int,
    ack_timeout_ms: int | None = None,
    max_deliveries: int | None = None,
    dead_letter_topic: str | None = None,
    start: str | None = None,
    ack_ids: Sequence[MessageId] = (),
) -> dict[str, Any]:
    """A pop body; None fields are left out (the queue's or the server's default).
    ``ack_ids``: this worker's messages to ack first, in the same request."""
    body: dict[str, Any] = {"consumerId": consumer, "maxMessages": max_messages}
    if ack_ids:
        body["ackIds"] = _base64_ids(ack_ids)
    for name, value in (
        ("ackTimeoutMs", ack_timeout_ms),
        ("maxDeliveries", max_deliveries),
        ("deadLetterTopic", dead_letter_topic),
        ("start", start),
    ):
        if value is not None:
            body[name] = value
    return body


def read_pop_request(obj: Mapping[str, Any]) -> PopRequest:
    """The fields of a pop body (BadRequest for anything malformed or out of range)."""
    only(obj, _POP_FIELDS, "pop request")
    max_messages = integer(obj.get("maxMessages", 1), "maxMessages", 1, INT64_MAX, optional=False)
    assert max_messages is not None
    ack_timeout = integer(obj.get("ackTimeoutMs"), "ackTimeoutMs", 1, INT64_MAX, optional=True)
    max_deliveries = integer(obj.get("maxDeliveries"), "maxDeliveries", 1, INT64_MAX, optional=True)
    raw_acks = obj.get("ackIds")
    if raw_acks is not None and not isinstance(raw_acks, list):
        raise BadRequest("ackIds must be a list of message ids (base64)")
    return PopRequest(
        _consumer(obj),
        max_messages,
        ack_timeout,
        max_deliveries,
        _opt_str(obj, "deadLetterTopic"),
        start_name(_opt_str(obj, "start")) or "earliest",
        _read_ids(raw_acks, binary=False) if raw_acks else [],
    )


def consumer_request(consumer: str) -> dict[str, Any]:
    """A release (close) body."""
    return {"consumerId": consumer}


def read_consumer_request(obj: Mapping[str, Any]) -> str:
    """The consumer id of a release body."""
    only(obj, _CONSUMER_FIELDS, "release request")
    return _consumer(obj)


def ack_request(
    consumer: str, ids: Sequence[MessageId], write_pointer: int | None = None
) -> dict[str, Any]:
    """An ack or nack body (``write_pointer``: ack inside that transaction)."""
    body: dict[str, Any] = {"consumerId": consumer, "ids": _base64_ids(ids)}
    if write_pointer is not None:
        body["transactionWritePointer"] = write_pointer
    return body


def read_ack_request(
    obj: Mapping[str, Any],
    *,
    binary: bool = False,
    fields: frozenset[str] = ACK_FIELDS,
    what: str = "ack request",
) -> tuple[str, list[MessageId], int | None]:
    """Consumer, ids and write pointer (None: not in a transaction) of an ack or nack
    body; BadRequest naming every malformed id. ``binary``: the ids are bytes (an Avro
    body's), not base64; ``fields``: those the body may have (``what`` names it in the
    error for any other)."""
    only(obj, fields, what)
    consumer = _consumer(obj)
    raw = obj.get("ids")
    if not isinstance(raw, list) or not raw:
        raise BadRequest("ids must be a non-empty list of message ids (base64)")
    ids = _read_ids(raw, binary=binary)
    write_pointer = integer(
        obj.get("transactionWritePointer"), "transactionWritePointer", 1, INT64_MAX, optional=True
    )
    return consumer, ids, write_pointer


def _base64_ids(ids: Sequence[MessageId]) -> list[str]:
    encode, pack = binascii.b2a_base64, _ID.pack
    return [encode(pack(*i), newline=False).decode("ascii") for i in ids]


def _read_ids(raw: list[Any], *, binary: bool) -> list[MessageId]:
    """The message ids of a body's list; BadRequest naming every malformed one."""
    ids: list[MessageId] = []
    bad: list[str] = []
    # Inline for the usual case (an ack names ~100 ids): a malformed id of any kind
    # (not a string, not ASCII, not base64, not 20 bytes) raises, and is looked at
    # again one by one.
    unpack, new, cls = _ID.unpack, tuple.__new__, MessageId
    try:
        if binary:
            ids = [new(cls, unpack(value)) for value in raw]
        else:
            decode = binascii.a2b_base64
            ids = [new(cls, unpack(decode(value, strict_mode=True))) for value in raw]
    except (TypeError, ValueError, struct.error):
        ids = []
        for value in raw:
            parsed = _binary_id(value) if binary else _message_id(value)
            if parsed is None:
                bad.append(repr(value)[:60])
            else:
                ids.append(parsed)
    if bad:
        shown = ", ".join(bad[:10]) + ("" if len(bad) <= 10 else f" and {len(bad) - 10} more")
        form = "20 bytes" if binary else "20 bytes in base64"
        raise BadRequest(f"{len(bad)} id(s) are not message ids ({form}): {shown}")
    return ids


def extend_request(
    consumer: str, ids: Sequence[MessageId], ack_timeout_ms: int | None = None
) -> dict[str, Any]:
    """An extend body (``ack_timeout_ms`` None: the server's default)."""
    body: dict[str, Any] = {"consumerId": consumer, "ids": _base64_ids(ids)}
    if ack_timeout_ms is not None:
        body["ackTimeoutMs"] = ack_timeout_ms
    return body


def read_extend_request(obj: Mapping[str, Any]) -> tuple[str, list[MessageId], int | None]:
    """Consumer, ids and lease length (None: the default) of an extend body."""
    consumer, ids, write_pointer = read_ack_request(
        obj, fields=_EXTEND_FIELDS, what="extend request"
    )
    if write_pointer is not None:
        raise BadRequest("an extend takes effect at once: it takes no transaction")
    ack_timeout = integer(obj.get("ackTimeoutMs"), "ackTimeoutMs", 1, INT64_MAX, optional=True)
    return consumer, ids, ack_timeout


def nack_json(skipped: Sequence[MessageId]) -> dict[str, Any]:
    """A nack's answer: the ids it did not give back (the worker no longer held them)."""
    return {"skipped": _base64_ids(skipped)}


def read_nack(obj: Any) -> list[MessageId]:
    """The skipped ids of a nack's or an extend's answer (none from a server that does
    not say)."""
    if not isinstance(obj, dict):
        raise ServerError(f"malformed nack answer: {obj!r}"[:200])
    raw = obj.get("skipped", [])
    if not isinstance(raw, list):
        raise ServerError(f"malformed nack answer: skipped is {raw!r}"[:200])
    try:
        return _read_ids(raw, binary=False)
    except BadRequest as exc:
        raise ServerError(f"malformed nack answer: {exc}") from exc


def rollback_request(write_pointer: int, keep_leases: bool = False) -> dict[str, Any]:
    """A rollback body: the aborted transaction's write pointer (``keep_leases``: the
    messages go back to the leases of the workers that acked them)."""
    body: dict[str, Any] = {"transactionWritePointer": write_pointer}
    if keep_leases:
        body["keepLeases"] = True
    return body


def read_rollback_keeps_leases(obj: Mapping[str, Any]) -> bool:
    """Whether a rollback body asks to give the messages back to their workers."""
    keep = obj.get("keepLeases", False)
    if not isinstance(keep, bool):
        raise BadRequest(f"keepLeases must be true or false, got {keep!r}"[:200])
    return keep


def read_rollback_request(obj: Mapping[str, Any]) -> int:
    """The write pointer of a rollback body."""
    only(obj, _ROLLBACK_FIELDS, "rollback request")
    write_pointer = integer(
        obj.get("transactionWritePointer"), "transactionWritePointer", 1, INT64_MAX, optional=False
    )
    assert write_pointer is not None
    return write_pointer


class TransactionAck(NamedTuple):
    """Acks of one queue that ride in a one-request transaction."""

    topic: str
    queue: str
    consumer: str
    ids: list[MessageId]


def transaction_acks_json(acks: Sequence[TransactionAck]) -> list[dict[str, Any]]:
    """The ``acks`` of a one-request transaction body."""
    return [{"topic": a.topic, "queue": a.queue, **ack_request(a.consumer, a.ids)} for a in acks]


def transaction_acks_avro(acks: Sequence[TransactionAck]) -> list[dict[str, Any]]:
    """The ``acks`` of a one-request transaction's Avro body (ids as bytes)."""
    return [
        {
            "topic": a.topic,
            "queue": a.queue,
            "consumerId": a.consumer,
            "ids": [i.to_bytes() for i in a.ids],
        }
        for a in acks
    ]


def read_transaction_acks(obj: Mapping[str, Any], *, binary: bool = False) -> list[TransactionAck]:
    """The ``acks`` of a one-request transaction body (none if absent); ``binary``: of
    the Avro body, ids as bytes."""
    raw = obj.get("acks")
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise BadRequest("acks must be a list of {topic, queue, consumerId, ids} objects")
    out: list[TransactionAck] = []
    for i, item in enumerate(raw):
        if not isinstance(item, dict):
            raise BadRequest(f"acks[{i}] must be an object")
        if item.get("transactionWritePointer") is not None:
            raise BadRequest("the server assigns the write pointer; do not send one")
        names = []
        for field in ("topic", "queue"):
            value = item.get(field)
            if not isinstance(value, str) or NAME_PATTERN.fullmatch(value) is None:
                raise BadRequest(f"acks[{i}].{field} must be a name of [A-Za-z0-9_-]{{1,128}}")
            names.append(value)
        consumer, ids, _ = read_ack_request(
            item, binary=binary, fields=_TRANSACTION_ACK_FIELDS, what=f"acks[{i}]"
        )
        out.append(TransactionAck(names[0], names[1], consumer, ids))
    return out


def _binary_id(value: object) -> MessageId | None:
    if not isinstance(value, bytes) or len(value) != 20:
        return None
    return MessageId.from_bytes(value)


def _message_id(value: object) -> MessageId | None:
    if not isinstance(value, str):
        return None
    try:
        raw = binascii.a2b_base64(value.encode("ascii"), strict_mode=True)
    except (binascii.Error, UnicodeEncodeError):
        return None
    return MessageId.from_bytes(raw) if len(raw) == 20 else None


def delivery_counts(counts: Sequence[int]) -> str:
    """The delivery-counts header of a pop answer."""
    return ",".join(map(str, counts))


def read_delivery_counts(header: str | None, count: int) -> list[int]:
    """Inverse of :func:`delivery_counts`, checked against the answer's message count."""
    if not header:
        values: list[int] = []
    else:
        try:
            values = [int(v) for v in header.split(",")]
        except ValueError:
            values = []
    if len(values) != count:
        raise ServerError(f"a pop answer with {count} messages had delivery counts {header!r}")
    return values


def _hex(value: MessageId | None) -> str | None:
    return None if value is None else value.hex


def queue_json(stats: QueueStats) -> dict[str, Any]:
    """A queue as ``describe`` answers it; ids in hex."""
    return {
        "queue": stats.queue,
        "maxDeliveries": stats.max_deliveries,
        "deadLetterTopic": stats.dead_letter_topic,
        "start": stats.start,
        "cursor": _hex(stats.cursor),
        "read": _hex(stats.read),
        "pending": stats.pending,
        "waiting": stats.waiting,
        "waitingExact": stats.waiting_exact,
        "consumers": [{"consumerId": c, "pending": n} for c, n in sorted(stats.consumers.items())],
        "pushed": stats.pushed,
        "popped": stats.popped,
        "acked": stats.acked,
        "nacked": stats.nacked,
        "redelivered": stats.redelivered,
        "deadLettered": stats.dead_lettered,
        "expired": stats.expired,
        "popRate": stats.pop_rate,
        "ackRate": stats.ack_rate,
        "ackState": stats.ack_state,
    }


def _field(obj: Any, name: str, kind: type | tuple[type, ...]) -> Any:
    if not isinstance(obj, dict) or not isinstance(obj.get(name), kind):
        raise ServerError(f"unexpected answer from the server: no {name!r} in {obj!r:.200}")
    return obj[name]


def _opt_id(obj: Any, name: str) -> MessageId | None:
    value = obj.get(name) if isinstance(obj, dict) else None
    return MessageId.from_hex(value) if isinstance(value, str) else None


def read_queue(obj: Any) -> QueueStats:
    """The :class:`QueueStats` in an answer written by :func:`queue_json`."""
    counts = {
        name: int(_field(obj, name, int))
        for name in (
            "maxDeliveries", "pending", "waiting", "pushed", "popped", "acked", "nacked",
            "redelivered", "deadLettered", "expired", "ackState",
        )
    }  # fmt: skip
    return QueueStats(
        queue=_field(obj, "queue", str),
        max_deliveries=counts["maxDeliveries"],
        dead_letter_topic=_field(obj, "deadLetterTopic", str),
        start=_field(obj, "start", str),
        cursor=_opt_id(obj, "cursor"),
        read=_opt_id(obj, "read"),
        pending=counts["pending"],
        waiting=counts["waiting"],
        waiting_exact=bool(_field(obj, "waitingExact", bool)),
        consumers={
            _field(c, "consumerId", str): int(_field(c, "pending", int))
            for c in _field(obj, "consumers", list)
        },
        pushed=counts["pushed"],
        popped=counts["popped"],
        acked=counts["acked"],
        nacked=counts["nacked"],
        redelivered=counts["redelivered"],
        dead_lettered=counts["deadLettered"],
        expired=counts["expired"],
        pop_rate=float(_field(obj, "popRate", (int, float))),
        ack_rate=float(_field(obj, "ackRate", (int, float))),
        ack_state=counts["ackState"],
    )


def read_count(obj: Any, name: str) -> int:
    """The count in a release (``released``) or purge (``purged``) answer."""
    return int(_field(obj, name, int))


def read_queue_names(obj: Any) -> list[tuple[str, str]]:
    """``(topic, queue)`` pairs of a namespace's queue list."""
    if not isinstance(obj, list):
        raise ServerError(f"unexpected answer from the server: {obj!r:.200}")
    return [(_field(item, "topic", str), _field(item, "queue", str)) for item in obj]
