"""The Avro schemas of the REST API (CDAP TMS's) and the hand-written fast paths.

``*_EXT`` schemas add message keys, headers and per-message TTLs (the
``avro/binary; schema=tidings`` medium). fastavro reads and writes every schema; the
hot bodies, whose layout is simple, are also written (and the poll response read)
directly, each fast path justified by a figure in BENCHMARKS.md and checked against
fastavro in tests/test_codec_wire_avro.py.
"""

from __future__ import annotations

import io
import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import fastavro

from tidings.codec.media import AVRO_EXT, JSON, Media
from tidings.errors import BadRequest
from tidings.structs import MESSAGE_ID_LAYOUT, NO_HEADERS, Message, MessageId

__all__ = [
    "CONSUME_REQUEST",
    "MESSAGES",
    "MESSAGES_EXT",
    "MESSAGE_IDS",
    "PUBLISH_REQUEST",
    "PUBLISH_REQUEST_EXT",
    "PUBLISH_RESPONSE",
    "SCHEMAS",
    "TRANSACTION_PUBLISH_REQUEST",
    "TRANSACTION_PUBLISH_REQUEST_V1",
    "ITEM_ID",
    "AvroItems",
    "read",
    "item_message",
    "read_ids",
    "read_long",
    "read_messages",
    "varint",
    "write",
    "write_consume_request",
    "write_ids",
    "write_messages",
    "write_publish",
    "write_publish_ext",
]

_ID_STRUCT = struct.Struct(MESSAGE_ID_LAYOUT)
# An id in an Avro array<bytes>: its length (20, one zigzag byte), then the id.
_ID_ITEM = struct.Struct(">B" + MESSAGE_ID_LAYOUT[1:])
_ID_LENGTH = b"\x28"
_ID_AFTER_LENGTH = struct.Struct(">x" + MESSAGE_ID_LAYOUT[1:])
_new_id = partial(tuple.__new__, MessageId)

_EXTRAS = {
    "type": "record",
    "name": "MessageExtras",
    "fields": [
        {"name": "key", "type": ["null", "bytes"], "default": None},
        {"name": "headers", "type": {"type": "map", "values": "bytes"}, "default": {}},
        {"name": "ttl", "type": ["null", "long"], "default": None},
    ],
}
PUBLISH_REQUEST = fastavro.parse_schema(
    {
        "type": "record",
        "name": "PublishRequest",
        "fields": [
            {"name": "transactionWritePointer", "type": ["long", "null"]},
            {"name": "messages", "type": {"type": "array", "items": "bytes"}},
        ],
    }
)
PUBLISH_REQUEST_EXT = fastavro.parse_schema(
    {
        "type": "record",
        "name": "PublishRequest",
        "fields": [
            {"name": "transactionWritePointer", "type": ["long", "null"]},
            {"name": "messages", "type": {"type": "array", "items": "bytes"}},
            {
                "name": "extras",
                "type": ["null", {"type": "array", "items": _EXTRAS}],
                "default": None,
            },
        ],
    }
)
PUBLISH_RESPONSE = fastavro.parse_schema(
    {
        "type": "record",
        "name": "PublishResponse",
        "fields": [
            {"name": "transactionWritePointer", "type": ["long", "null"]},
            {"name": "startTimestamp", "type": "long"},
            {"name": "startSequenceId", "type": "int"},
            {"name": "endTimestamp", "type": "long"},
            {"name": "endSequenceId", "type": "int"},
        ],
    }
)
CONSUME_REQUEST = fastavro.parse_schema(
    {
        "type": "record",
        "name": "ConsumeRequest",
        "fields": [
            {"name": "startFrom", "type": ["bytes", "long", "null"]},
            {"name": "inclusive", "type": "boolean", "default": True},
            {"name": "limit", "type": ["int", "null"]},
            {"name": "transaction", "type": ["bytes", "null"]},
        ],
    }
)
MESSAGES = fastavro.parse_schema(
    {
        "type": "array",
        "items": {
            "type": "record",
            "name": "Message",
            "fields": [
                {"name": "id", "type": "bytes"},
                {"name": "payload", "type": "bytes"},
            ],
        },
    }
)
MESSAGES_EXT = fastavro.parse_schema(
    {
        "type": "array",
        "items": {
            "type": "record",
            "name": "Message",
            "fields": [
                {"name": "id", "type": "bytes"},
                {"name": "payload", "type": "bytes"},
                {"name": "key", "type": ["null", "bytes"], "default": None},
                {"name": "headers", "type": {"type": "map", "values": "bytes"}, "default": {}},
            ],
        },
    }
)

#: The answer of a poll with ``fields=id``: the ids of the messages it would return.
MESSAGE_IDS = fastavro.parse_schema({"type": "array", "items": "bytes"})

#: A one-request transaction (``POST /v1/namespaces/{ns}/transactions/publish``) in the
#: ``avro/binary; schema=tidings`` medium: the JSON body's fields, each topic's messages
#: as a whole ``PublishRequestExt`` body (write pointer null), message ids as bytes.
TRANSACTION_PUBLISH_REQUEST = fastavro.parse_schema(
    {
        "type": "record",
        "name": "TransactionPublishRequest",
        "fields": [
            {"name": "timeout", "type": ["null", "double"], "default": None},
            {"name": "transactionalId", "type": ["null", "string"], "default": None},
            {"name": "epoch", "type": ["null", "long"], "default": None},
            {
                "name": "topics",
                "type": {
                    "type": "array",
                    "items": {
                        "type": "record",
                        "name": "TopicPublish",
                        "fields": [
                            {"name": "topic", "type": "string"},
                            {"name": "body", "type": "bytes"},
                        ],
                    },
                },
                "default": [],
            },
            {
                "name": "acks",
                "type": {
                    "type": "array",
                    "items": {
                        "type": "record",
                        "name": "TransactionAck",
                        "fields": [
                            {"name": "topic", "type": "string"},
                            {"name": "queue", "type": "string"},
                            {"name": "consumerId", "type": "string"},
                            {"name": "ids", "type": {"type": "array", "items": "bytes"}},
                        ],
                    },
                },
                "default": [],
            },
            {
                "name": "groupCommits",
                "type": {
                    "type": "array",
                    "items": {
                        "type": "record",
                        "name": "TransactionGroupCommit",
                        "fields": [
                            {"name": "topic", "type": "string"},
                            {"name": "group", "type": "string"},
                            {"name": "memberId", "type": "string"},
                            {
                                "name": "positions",
                                "type": {
                                    "type": "array",
                                    "items": {
                                        "type": "record",
                                        "name": "GroupPosition",
                                        "fields": [
                                            {"name": "partition", "type": "long"},
                                            {"name": "id", "type": "bytes"},
                                        ],
                                    },
                                },
                            },
                        ],
                    },
                },
                "default": [],
            },
            # Added last, so a body written before it is this schema's body cut short
            # there (read by TRANSACTION_PUBLISH_REQUEST_V1), and means what it meant.
            {
                "name": "groupCommitGenerations",
                "type": {
                    "type": "array",
                    "items": {
                        "type": "record",
                        "name": "GroupCommitGenerations",
                        "fields": [
                            {"name": "generation", "type": ["null", "long"], "default": None},
                            {
                                "name": "positions",
                                "type": {"type": "array", "items": ["null", "long"]},
                                "default": [],
                            },
                        ],
                    },
                },
                "default": [],
            },
        ],
    }
)

#: The body as written before ``groupCommitGenerations`` was added (no generations:
#: the server goes by the newest it told each member).
_CURRENT: dict[str, Any] = TRANSACTION_PUBLISH_REQUEST  # type: ignore[assignment]
TRANSACTION_PUBLISH_REQUEST_V1 = fastavro.parse_schema(
    {**_CURRENT, "name": "TransactionPublishRequestV1", "fields": _CURRENT["fields"][:-1]},
    named_schemas={},
)

#: Every Avro schema of the API by name, for docs and the OpenAPI document.
SCHEMAS: dict[str, Any] = {
    "PublishRequest": PUBLISH_REQUEST,
    "PublishRequestExt": PUBLISH_REQUEST_EXT,
    "PublishResponse": PUBLISH_RESPONSE,
    "ConsumeRequest": CONSUME_REQUEST,
    "Messages": MESSAGES,
    "MessagesExt": MESSAGES_EXT,
    "MessageIds": MESSAGE_IDS,
    "TransactionPublishRequest": TRANSACTION_PUBLISH_REQUEST,
}


def read(body: bytes, schema: Any, what: str) -> Any:
    """Decode ``body`` with fastavro; :class:`BadRequest` naming ``what`` if it is not
    exactly one value of ``schema``."""
    buf = io.BytesIO(body)
    try:
        value = fastavro.schemaless_reader(buf, schema, None)
    except Exception as exc:  # fastavro raises many types on garbage; all mean "bad body"
        raise BadRequest(f"malformed Avro {what}: {type(exc).__name__}") from None
    if buf.tell() != len(body):
        raise BadRequest(f"malformed Avro {what}: trailing bytes")
    return value


def write(value: Any, schema: Any) -> bytes:
    """Encode ``value`` with fastavro (the bodies that are not on a hot path)."""
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, schema, value)
    return buf.getvalue()


def _zigzag(n: int) -> bytes:
    """Avro's zig-zag varint of a long."""
    n = (n << 1) ^ (n >> 63)
    out = bytearray()
    while n & ~0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


# Payload lengths under 16 KiB are the common case; a table lookup beats the loop.
_SMALL = tuple(_zigzag(n) for n in range(16384))


def varint(n: int) -> bytes:
    """Avro's zig-zag varint of a long, from the table when it is small."""
    return _SMALL[n] if 0 <= n < 16384 else _zigzag(n)


def read_long(buf: bytes, pos: int) -> tuple[int, int]:
    """Avro zig-zag varint at ``pos``: (value, next position)."""
    b = buf[pos]
    n = b & 0x7F
    shift = 7
    while b & 0x80:
        pos += 1
        b = buf[pos]
        n |= (b & 0x7F) << shift
        shift += 7
        if shift > 70:
            raise ValueError("varint too long")
    return (n >> 1) ^ -(n & 1), pos + 1


# BENCHMARKS.md, "Where the time goes", Publish (W1): the publish body is the
# producer's hot path; fastavro's generic writer cost ~1 us per message, this 0.15.
def write_publish(write_pointer: int | None, payloads: Sequence[bytes], *, extended: bool) -> bytes:
    """A PublishRequest of plain payloads (no extras)."""
    parts = [b"\x02" if write_pointer is None else b"\x00" + varint(write_pointer)]
    if payloads:
        _add_payloads(parts, payloads)
    parts.append(b"\x00")
    if extended:
        parts.append(b"\x00")  # extras: the union's null branch
    return b"".join(parts)


def _add_payloads(parts: list[bytes], payloads: Sequence[bytes]) -> None:
    """The payloads' block (a count, then each length and payload) onto ``parts``."""
    small, zigzag = _SMALL, _zigzag
    parts.append(varint(len(payloads)))
    for payload in payloads:
        n = len(payload)
        parts.append(small[n] if n < 16384 else zigzag(n))
        parts.append(payload)


def _add_headers(add: Callable[[bytes], None], headers: Mapping[str, bytes]) -> None:
    """A non-empty headers map's one block (its count, then each name and value), the
    block's end left to the caller."""
    add(varint(len(headers)))
    for name, value in headers.items():
        raw = name.encode()
        add(varint(len(raw)))
        add(raw)
        add(varint(len(value)))
        add(value)


#: What comes before a key in the extras of a keyed record without headers or TTL: the
#: previous record's empty headers map and null TTL, the key union's bytes branch, and
#: the key's length (by the key's length; longer keys take the general loop).
_KEY_HEADS = tuple(b"\x00\x00\x02" + _SMALL[n] for n in range(256))


# BENCHMARKS.md, "Consumer groups": keyed records (a group's copier, keyed producers)
# went through fastavro's generic writer, ~10x this path's cost per message.
def write_publish_ext(
    write_pointer: int | None, records: Sequence[tuple[bytes, bytes | None, Any, int | None]]
) -> bytes:
    """A PublishRequestExt with ``extras``: ``(payload, key, headers, ttl)`` per message."""
    parts = [b"\x02" if write_pointer is None else b"\x00" + varint(write_pointer)]
    if not records:
        parts.append(b"\x00\x02\x00")  # no payloads; an empty extras array
        return b"".join(parts)
    payloads, keys, headers, ttls = zip(*records, strict=True)
    _add_payloads(parts, payloads)
    parts.append(b"\x00\x02")  # the payloads' end; extras: the union's array branch
    parts.append(varint(len(records)))
    add = parts.append
    if (
        None not in keys
        and not any(headers)
        and ttls.count(None) == len(ttls)
        and max(map(len, keys)) < len(_KEY_HEADS)
    ):
        # Every record keyed and nothing else (a keyed producer's, a copier's): each
        # record's extras are its key between fixed bytes, two list items per record.
        # BENCHMARKS.md, "Keyed publishes in two items per record": half the cost.
        heads, first = _KEY_HEADS, len(parts)
        for key in keys:
            add(heads[len(key)])
            add(key)
        parts[first] = parts[first][2:]  # the first record has no record before it
        add(b"\x00\x00\x00")  # the last record's headers and TTL, the array's end
        return b"".join(parts)
    for key, entries, ttl in zip(keys, headers, ttls, strict=True):
        if key is None:
            add(b"\x00")
        else:
            add(b"\x02")
            add(varint(len(key)))
            add(key)
        if entries:
            _add_headers(add, entries)
        add(b"\x00")
        add(b"\x00" if ttl is None else b"\x02" + varint(ttl))
    parts.append(b"\x00")
    return b"".join(parts)


# BENCHMARKS.md, "Where the time goes", Read (W2): a consumer sends one per page and
# fastavro's generic writer took ~25 us of it under load.
def write_consume_request(
    start: bytes | int | None, inclusive: bool, limit: int | None, transaction: bytes | None
) -> bytes:
    """A ConsumeRequest; each union is its branch index, then the value."""
    parts: list[bytes]
    if isinstance(start, bytes):
        parts = [b"\x00", varint(len(start)), start]
    elif start is None:
        parts = [b"\x04"]
    else:
        parts = [b"\x02", varint(start)]  # a timestamp: the union's long branch
    parts.append(b"\x01" if inclusive else b"\x00")
    parts.append(b"\x02" if limit is None else b"\x00" + varint(limit))
    if transaction is None:
        parts.append(b"\x02")
    else:
        parts += (b"\x00", varint(len(transaction)), transaction)
    return b"".join(parts)


@dataclass(frozen=True, slots=True)
class AvroItems:
    """How the messaging core writes plain messages straight into an Avro poll response."""

    suffix: bytes  # after the payload: b"" (CDAP TMS schema) or null key + empty headers
    small: tuple[bytes, ...]  # zig-zag varints of 0..16383
    zigzag: Callable[[int], bytes]

    @classmethod
    def for_media(cls, media: Media) -> AvroItems | None:
        """The item layout of ``media``; None for JSON (no pre-encoding)."""
        if media is JSON:
            return None
        return cls(b"\x00\x00" if media is AVRO_EXT else b"", _SMALL, _zigzag)


# BENCHMARKS.md, "Where the time goes", Read (W2): the poll response is the one large
# body the server writes; fastavro's generic writer spends ~2.5 us per Message record,
# this ~0.25 us (and items the core pre-encoded from LMDB rows are copied as they are).
def write_messages(messages: Sequence[Message | bytes], *, extended: bool) -> bytes:
    """A poll response from messages and pre-encoded items (see :class:`AvroItems`)."""
    if not messages:
        return b"\x00"
    small, long_, pack_id = _SMALL, varint, _ID_ITEM.pack
    parts: list[bytes] = [long_(len(messages))]
    add = parts.append
    for m in messages:
        if type(m) is bytes:
            add(m)
            continue
        assert isinstance(m, Message)
        payload = m.payload
        add(pack_id(0x28, *m.id))  # the id's length (always 20), then the id
        add(small[len(payload)] if len(payload) < 16384 else _zigzag(len(payload)))
        add(payload)
        if extended:
            key = m.key
            if key is None:
                add(b"\x00")
            else:
                add(b"\x02")
                add(small[len(key)] if len(key) < 16384 else _zigzag(len(key)))
                add(key)
            headers = m.headers
            if headers:
                _add_headers(add, headers)
            add(b"\x00")
    add(b"\x00")
    return b"".join(parts)


def write_ids(ids: Sequence[bytes]) -> bytes:
    """An ``array<bytes>`` of 20-byte ids in one block."""
    if not ids:
        return b"\x00"
    # The count, then each id as a 20-byte Avro bytes (length 0x28), then the end.
    return b"".join([_zigzag(len(ids)), b"\x28", b"\x28".join(ids), b"\x00"])


def read_ids(body: bytes) -> list[MessageId]:
    """The ids of an ``array<bytes>`` body; :class:`BadRequest` if it is not one."""
    if not body:
        return []
    # The layout the server writes (one block of 21-byte items) is read in place;
    # anything else that is valid Avro goes through fastavro.
    try:
        count, pos = read_long(body, 0)
    except (IndexError, ValueError):
        count = pos = 0
    if count > 0 and len(body) == pos + 21 * count + 1 and body[-1] == 0:
        items = memoryview(body)[pos : pos + 21 * count]
        # Every item's length byte at once, then the ids unpacked past it into tuples:
        # 4.5 -> 1.8 ms per 10,000 ids (a Spark driver scans tens of thousands per
        # micro-batch) against a check and a slice per item.
        if items[::21] == _ID_LENGTH * count:
            return list(map(_new_id, _ID_AFTER_LENGTH.iter_unpack(items)))
    raw = read(body, MESSAGE_IDS, "id list")
    return [MessageId.from_bytes(item) for item in raw]


# BENCHMARKS.md, "Where the time goes", Read (W2): reading a large poll response is
# the consumer's hot path; fastavro built a dict per record (13 us per message with
# the objects after it), this reads the layout directly, ids unpacked in place (1.7 us).
def read_messages(body: bytes, *, extended: bool) -> list[Message]:
    """The messages of a poll response; ValueError, IndexError or struct.error on a
    malformed body."""
    out: list[Message] = []
    append, new = out.append, tuple.__new__
    unpack_id, read_long_ = _ID_STRUCT.unpack_from, read_long
    end = len(body)
    pos = 0
    while True:
        count, pos = read_long_(body, pos)
        if count == 0:
            break
        if count < 0:  # a block with its size in bytes, which we do not need
            count = -count
            _, pos = read_long_(body, pos)
        for _ in range(count):
            if body[pos] != 0x28:  # the id's length, always 20
                raise ValueError("message id is not 20 bytes")
            message_id = new(MessageId, unpack_id(body, pos + 1))
            pos += 21
            size, pos = read_long_(body, pos)
            if size < 0 or pos + size > end:
                raise ValueError("bad payload length")
            payload = body[pos : pos + size]
            pos += size
            if not extended:
                append(new(Message, (message_id, payload, None, NO_HEADERS, None, 0)))
                continue
            if body[pos] == 0 and body[pos + 1] == 0:  # no key, no headers: the usual case
                pos += 2
                append(new(Message, (message_id, payload, None, NO_HEADERS, None, 0)))
                continue
            size = body[pos + 1]
            if body[pos] == 2 and size < 0x80 and not size & 1:
                # A key under 64 bytes (its length one zig-zag byte), then maybe no
                # headers: a keyed topic's usual case, without three read_long calls.
                key_end = pos + 2 + (size >> 1)
                if key_end < end and body[key_end] == 0:
                    short_key = body[pos + 2 : key_end]
                    pos = key_end + 1
                    append(new(Message, (message_id, payload, short_key, NO_HEADERS, None, 0)))
                    continue
            branch = body[pos]
            pos += 1
            key = None
            if branch == 2:
                size, pos = read_long_(body, pos)
                if size < 0 or pos + size > end:
                    raise ValueError("bad key length")
                key = body[pos : pos + size]
                pos += size
            elif branch != 0:
                raise ValueError("bad key union branch")
            headers: Mapping[str, bytes] = NO_HEADERS
            pairs, pos = read_long_(body, pos)
            if pairs:
                built: dict[str, bytes] = {}
                while pairs:
                    if pairs < 0:
                        pairs = -pairs
                        _, pos = read_long_(body, pos)
                    for _ in range(pairs):
                        size, pos = read_long_(body, pos)
                        if size < 0 or pos + size > end:
                            raise ValueError("bad header name length")
                        name = body[pos : pos + size].decode()
                        pos += size
                        size, pos = read_long_(body, pos)
                        if size < 0 or pos + size > end:
                            raise ValueError("bad header value length")
                        built[name] = body[pos : pos + size]
                        pos += size
                    pairs, pos = read_long_(body, pos)
                headers = built
            append(new(Message, (message_id, payload, key, headers, None, 0)))
    if pos != end:
        raise ValueError("trailing bytes")
    return out


#: An item's id after its length byte, as MessageId.to_bytes() writes it:
#: ``ITEM_ID.unpack_from(item, 1)`` gives its fields (for loops that build many ids).
ITEM_ID = struct.Struct(MESSAGE_ID_LAYOUT)


def item_message(item: Message | bytes) -> Message:
    """The message of an item of an extended poll response (or the message itself)."""
    if type(item) is bytes:
        # One item is an Avro array of one: the block's count (1), the item, the end.
        return read_messages(b"\x02" + item + b"\x00", extended=True)[0]
    assert isinstance(item, Message)
    return item
