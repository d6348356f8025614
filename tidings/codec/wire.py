"""Request and response bodies of the REST API, in JSON and Avro binary (seed 000).

The server decodes what clients send and the client decodes what the server answers
with the same functions, so the two cannot drift. Three media:

- ``application/json``: Avro ``bytes`` fields are standard base64 strings; a JSON number
  in ``startFrom`` is a timestamp in ms. Extra fields (``extras`` on publish, ``key`` and
  ``headers`` on messages) are additions a seed-only client simply ignores.
- ``avro/binary``: exactly the seed's schemas, so a seed-only client works unchanged.
- ``avro/binary; schema=tidings``: the seed's schemas extended with message keys,
  headers and per-message TTLs (``*_EXT`` below). Avro binary carries no field names, so
  the extension needs its own media type rather than optional fields.

Every decoder raises :class:`~tidings.errors.BadRequest` (never anything else) for a
body it cannot accept.
"""

from __future__ import annotations

import binascii
import enum
import gc
import io
import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import fastavro
import orjson

from tidings.errors import BadRequest, InvalidMessageId, UnsupportedMediaType
from tidings.names import INT64_MAX, INT64_MIN
from tidings.structs import (
    MESSAGE_ID_LAYOUT,
    MESSAGE_ID_SIZE,
    NO_HEADERS,
    Message,
    MessageId,
    PayloadRange,
    Record,
    RollbackInfo,
)

_ID_STRUCT = struct.Struct(MESSAGE_ID_LAYOUT)
# An id in an Avro array<bytes>: its length (20, one zigzag byte), then the id.
_ID_ITEM = struct.Struct(">B" + MESSAGE_ID_LAYOUT[1:])

__all__ = [
    "AVRO",
    "AVRO_EXT",
    "AvroItems",
    "JSON",
    "ConsumeRequest",
    "Media",
    "PublishRequest",
    "avro_messages",
    "b64decode",
    "b64encode",
    "decode_consume_request",
    "decode_message_ids",
    "decode_messages",
    "decode_publish_request",
    "format_payload_range",
    "parse_payload_range",
    "payload_ranges_json",
    "publish_request_from_json",
    "decode_rollback_info",
    "encode_consume_request",
    "encode_message_ids",
    "encode_messages",
    "encode_raw_message_ids",
    "encode_publish_request",
    "encode_rollback_info",
    "media_for",
]

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


class Media(enum.Enum):
    """A body encoding; ``value`` is the Content-Type the server answers with."""

    JSON = "application/json"
    AVRO = "avro/binary"
    AVRO_EXT = "avro/binary; schema=tidings"


JSON, AVRO, AVRO_EXT = Media.JSON, Media.AVRO, Media.AVRO_EXT


def media_for(content_type: str | None) -> Media:
    """The medium a Content-Type header names; no header means JSON.

    Raises :class:`UnsupportedMediaType` for anything else.
    """
    if not content_type:
        return JSON
    main, _, params = content_type.partition(";")
    main = main.strip().lower()
    if main == "application/json":
        return JSON
    if main == "avro/binary":
        for param in params.split(";"):
            name, _, value = param.partition("=")
            if name.strip().lower() == "schema" and value.strip().strip('"').lower() == "tidings":
                return AVRO_EXT
        return AVRO
    raise UnsupportedMediaType(
        f"unsupported Content-Type {content_type!r}; use application/json or avro/binary"
    )


# --- Avro schemas (seed 000 "REST API"; *_EXT add keys, headers, per-message ttl) ---

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

#: Every Avro schema of the API by name, for docs and the OpenAPI document.
SCHEMAS: dict[str, Any] = {
    "PublishRequest": PUBLISH_REQUEST,
    "PublishRequestExt": PUBLISH_REQUEST_EXT,
    "PublishResponse": PUBLISH_RESPONSE,
    "ConsumeRequest": CONSUME_REQUEST,
    "Messages": MESSAGES,
    "MessagesExt": MESSAGES_EXT,
    "MessageIds": MESSAGE_IDS,
}


# --- helpers ---


_a2b = binascii.a2b_base64
_b2a = binascii.b2a_base64


def b64encode(raw: bytes) -> str:
    """Standard base64 with padding, no newline."""
    return binascii.b2a_base64(raw, newline=False).decode("ascii")


def b64decode(text: object, what: str) -> bytes:
    """Strict standard base64; :class:`BadRequest` naming ``what`` otherwise."""
    if not isinstance(text, str):
        raise BadRequest(f"{what} must be a base64 string")
    try:
        return binascii.a2b_base64(text, strict_mode=True)
    except (binascii.Error, ValueError):
        raise BadRequest(f"{what} is not valid base64") from None


def _b64decode_all(items: list[Any], what: str) -> list[bytes]:
    """Decode a list of base64 strings; one C call per item on the good path."""
    try:
        return [_a2b(item, strict_mode=True) for item in items]
    except (binascii.Error, ValueError, TypeError):
        pass  # decode again item by item, for an error that names the culprit
    return [b64decode(item, f"{what}[{i}]") for i, item in enumerate(items)]


def _avro_read(body: bytes, schema: Any, what: str) -> Any:
    buf = io.BytesIO(body)
    try:
        value = fastavro.schemaless_reader(buf, schema, None)
    except Exception as exc:  # fastavro raises many types on garbage; all mean "bad body"
        raise BadRequest(f"malformed Avro {what}: {type(exc).__name__}") from None
    if buf.tell() != len(body):
        raise BadRequest(f"malformed Avro {what}: trailing bytes")
    return value


def _avro_write(value: Any, schema: Any) -> bytes:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, schema, value)
    return buf.getvalue()


def _json_object(body: bytes, what: str) -> dict[str, Any]:
    try:
        value = orjson.loads(body) if body else {}
    except orjson.JSONDecodeError:
        raise BadRequest(f"malformed JSON {what}") from None
    if not isinstance(value, dict):
        raise BadRequest(f"the {what} must be a JSON object")
    return value


def _int(value: object, what: str, lo: int, hi: int, *, optional: bool) -> int | None:
    if value is None and optional:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise BadRequest(f"{what} must be an integer in [{lo}, {hi}]")
    return value


# --- publish / store ---


@dataclass(frozen=True, slots=True)
class PublishRequest:
    """A decoded publish or store body.

    A message without extras stays a plain ``bytes`` payload rather than a
    :class:`Record`: building 500 frozen dataclasses per batch cost more than decoding
    it, and the messaging core takes either (its fastest path is all-bytes).
    """

    write_pointer: int | None
    records: Sequence[Record | bytes]
    #: ``payloadRanges`` of a JSON pointer publish (None if absent); only ever set
    #: together with a write pointer and no messages.
    payload_ranges: list[PayloadRange] | None = None


def _record(payload: bytes, extras: Mapping[str, Any] | None) -> Record:
    if extras is None:
        return Record(payload)
    key = extras.get("key")
    headers = extras.get("headers") or {}
    ttl = extras.get("ttl")
    return Record(payload, key, headers, ttl)


def _check_extras_json(raw: object, n: int) -> list[dict[str, Any]] | None:
    if raw is None:
        return None
    if not isinstance(raw, list) or len(raw) != n:
        raise BadRequest("extras must be null or a list as long as messages")
    out: list[dict[str, Any]] = []
    for i, item in enumerate(raw):
        if item is None:
            out.append({})
            continue
        if not isinstance(item, dict):
            raise BadRequest(f"extras[{i}] must be an object or null")
        key = item.get("key")
        headers_raw = item.get("headers") or {}
        if not isinstance(headers_raw, dict):
            raise BadRequest(f"extras[{i}].headers must be an object of base64 strings")
        headers = {
            str(k): b64decode(v, f"extras[{i}].headers[{k!r}]") for k, v in headers_raw.items()
        }
        ttl = _int(item.get("ttl"), f"extras[{i}].ttl", 1, INT64_MAX, optional=True)
        out.append(
            {
                "key": None if key is None else b64decode(key, f"extras[{i}].key"),
                "headers": headers,
                "ttl": ttl,
            }
        )
    return out


def _check_extras_avro(raw: list[dict[str, Any]] | None, n: int) -> None:
    if raw is None:
        return
    if len(raw) != n:
        raise BadRequest("extras must be null or a list as long as messages")
    for i, item in enumerate(raw):
        ttl = item.get("ttl")
        if ttl is not None and ttl < 1:
            raise BadRequest(f"extras[{i}].ttl must be a positive number of seconds")


def decode_publish_request(body: bytes, media: Media) -> PublishRequest:
    """Decode a ``publish``/``store`` body (seed's PublishRequest, plus ``extras``)."""
    if media is JSON:
        return publish_request_from_json(_json_object(body, "publish request"))
    else:
        schema = PUBLISH_REQUEST_EXT if media is AVRO_EXT else PUBLISH_REQUEST
        value = _avro_read(body, schema, "publish request")
        wp = value["transactionWritePointer"]
        payloads = value["messages"]
        extras = value.get("extras")
        _check_extras_avro(extras, len(payloads))
    if extras is None:
        return PublishRequest(wp, payloads)
    return PublishRequest(wp, [_record(p, e) for p, e in zip(payloads, extras, strict=True)])


def publish_request_from_json(obj: dict[str, Any]) -> PublishRequest:
    """The PublishRequest in an already parsed JSON object (e.g. one topic of a
    transactional publish); the same checks as :func:`decode_publish_request`."""
    wp = _int(
        obj.get("transactionWritePointer"),
        "transactionWritePointer",
        INT64_MIN,
        INT64_MAX,
        optional=True,
    )
    raw_messages = obj.get("messages", [])
    if not isinstance(raw_messages, list):
        raise BadRequest("messages must be a list of base64 strings")
    payloads = _b64decode_all(raw_messages, "messages")
    ranges = _payload_ranges_from_json(obj.get("payloadRanges"))
    if ranges is not None and (wp is None or payloads):
        raise BadRequest("payloadRanges need a transactionWritePointer and no messages")
    extras = _check_extras_json(obj.get("extras"), len(payloads))
    if extras is None:
        return PublishRequest(wp, payloads, ranges)
    return PublishRequest(
        wp, [_record(p, e) for p, e in zip(payloads, extras, strict=True)], ranges
    )


def _position_from_json(raw: object, what: str) -> tuple[int, int]:
    if not isinstance(raw, list) or len(raw) != 2:
        raise BadRequest(f"{what} must be a [writeTs, seq] pair of integers")
    ts = _int(raw[0], f"{what}[0]", 0, INT64_MAX, optional=False)
    seq = _int(raw[1], f"{what}[1]", 0, 0xFFFF, optional=False)
    assert ts is not None and seq is not None
    return ts, seq


def _payload_ranges_from_json(raw: object) -> list[PayloadRange] | None:
    # Shape only; order, overlap and count are the messaging core's checks.
    if raw is None:
        return None
    if not isinstance(raw, list):
        raise BadRequest("payloadRanges must be a list of {first, last} objects")
    out: list[PayloadRange] = []
    for i, item in enumerate(raw):
        if not isinstance(item, dict):
            raise BadRequest(f"payloadRanges[{i}] must be an object with first and last")
        first = _position_from_json(item.get("first"), f"payloadRanges[{i}].first")
        last = _position_from_json(item.get("last"), f"payloadRanges[{i}].last")
        out.append(PayloadRange(*first, *last))
    return out


def payload_ranges_json(ranges: Sequence[PayloadRange]) -> list[dict[str, list[int]]]:
    """The ``payloadRanges`` field of a JSON publish body."""
    return [{"first": [r[0], r[1]], "last": [r[2], r[3]]} for r in ranges]


def format_payload_range(rng: PayloadRange) -> str:
    """The ``Tidings-Payload-Range`` header value: ``first_ts.first_seq-last_ts.last_seq``."""
    return f"{rng.first_ts}.{rng.first_seq}-{rng.last_ts}.{rng.last_seq}"


def parse_payload_range(text: str) -> PayloadRange:
    """Inverse of :func:`format_payload_range`; ValueError if ``text`` is not one."""
    first, sep, last = text.strip().partition("-")
    parts = [*first.split("."), *last.split(".")] if sep else []
    if len(parts) != 4 or not all(p.isascii() and p.isdigit() for p in parts):
        raise ValueError(f"not a payload range: {text[:80]!r}")
    return PayloadRange(*map(int, parts))


def _has_extras(r: Record) -> bool:
    return r.key is not None or bool(r.headers) or r.ttl is not None


def encode_publish_request(
    write_pointer: int | None, records: Sequence[Record | bytes], media: Media
) -> bytes:
    """Encode a ``publish``/``store`` body; ``extras`` only when some record needs them.

    Items may be plain payloads (bytes) or :class:`Record`. Plain ``avro/binary`` cannot
    carry keys, headers or ttl: a record with any of them raises ValueError there (use
    ``AVRO_EXT``).
    """
    if media is not JSON and all(type(r) is bytes for r in records):
        return _avro_publish_plain(write_pointer, cast("Sequence[bytes]", records), media)
    return _encode_records(
        write_pointer, [Record(r) if isinstance(r, bytes) else r for r in records], media
    )


def _encode_records(write_pointer: int | None, records: list[Record], media: Media) -> bytes:
    needs_extras = any(_has_extras(r) for r in records)
    if media is not JSON and not needs_extras:
        return _avro_publish_plain(write_pointer, [r.payload for r in records], media)
    if media is JSON:
        obj: dict[str, Any] = {
            "transactionWritePointer": write_pointer,
            "messages": [b64encode(r.payload) for r in records],
        }
        if needs_extras:
            obj["extras"] = [
                {
                    "key": None if r.key is None else b64encode(r.key),
                    "headers": {k: b64encode(v) for k, v in r.headers.items()},
                    "ttl": r.ttl,
                }
                for r in records
            ]
        return orjson.dumps(obj)
    if media is AVRO and needs_extras:
        raise ValueError("plain avro/binary cannot carry keys, headers or ttl; use AVRO_EXT")
    value: dict[str, Any] = {
        "transactionWritePointer": write_pointer,
        "messages": [r.payload for r in records],
    }
    if media is AVRO_EXT:
        value["extras"] = (
            [{"key": r.key, "headers": dict(r.headers), "ttl": r.ttl} for r in records]
            if needs_extras
            else None
        )
        return _avro_write(value, PUBLISH_REQUEST_EXT)
    return _avro_write(value, PUBLISH_REQUEST)


def _avro_publish_plain(
    write_pointer: int | None, payloads: Sequence[bytes], media: Media
) -> bytes:
    # The publish body is the producer's hot path; its layout without extras is simple
    # enough to write directly (fastavro's generic writer costs ~1 us per message).
    # tests/test_codec_wire_avro.py checks it against fastavro.
    parts = [b"\x02" if write_pointer is None else b"\x00" + _long(write_pointer)]
    if payloads:
        small, zigzag = _SMALL, _zigzag
        parts.append(_long(len(payloads)))
        for payload in payloads:
            n = len(payload)
            parts.append(small[n] if n < 16384 else zigzag(n))
            parts.append(payload)
    parts.append(b"\x00")
    if media is AVRO_EXT:
        parts.append(b"\x00")  # extras: the union's null branch
    return b"".join(parts)


# --- publish response = rollback request ---


def encode_rollback_info(info: RollbackInfo, media: Media) -> bytes:
    """The transactional publish response, which is also the rollback request body."""
    value = {
        "transactionWritePointer": info.write_pointer,
        "startTimestamp": info.start_ts,
        "startSequenceId": info.start_seq,
        "endTimestamp": info.end_ts,
        "endSequenceId": info.end_seq,
    }
    if media is JSON:
        return orjson.dumps(value)
    return _avro_write(value, PUBLISH_RESPONSE)


def decode_rollback_info(body: bytes, media: Media) -> RollbackInfo:
    """Decode a rollback body (the publish response, echoed back)."""
    if media is JSON:
        obj = _json_object(body, "rollback request")
    else:
        obj = _avro_read(body, PUBLISH_RESPONSE, "rollback request")
    wp = _int(
        obj.get("transactionWritePointer"), "transactionWritePointer", 1, INT64_MAX, optional=False
    )
    start_ts = _int(obj.get("startTimestamp"), "startTimestamp", 0, INT64_MAX, optional=False)
    end_ts = _int(obj.get("endTimestamp"), "endTimestamp", 0, INT64_MAX, optional=False)
    start_seq = _int(obj.get("startSequenceId"), "startSequenceId", 0, 0xFFFF, optional=False)
    end_seq = _int(obj.get("endSequenceId"), "endSequenceId", 0, 0xFFFF, optional=False)
    return RollbackInfo(
        cast(int, wp),
        cast(int, start_ts),
        cast(int, start_seq),
        cast(int, end_ts),
        cast(int, end_seq),
    )


# --- poll ---


@dataclass(frozen=True, slots=True)
class ConsumeRequest:
    """A decoded poll body: ``start`` is a message id, a timestamp (ms) or None."""

    start: MessageId | int | None = None
    inclusive: bool = True
    limit: int | None = None
    transaction: bytes | None = None


def _start_from_bytes(raw: bytes) -> MessageId:
    if len(raw) != MESSAGE_ID_SIZE:
        raise InvalidMessageId(f"startFrom must be a {MESSAGE_ID_SIZE}-byte message id")
    return MessageId.from_bytes(raw)


def decode_consume_request(body: bytes, media: Media) -> ConsumeRequest:
    """Decode a poll body; an empty body means "from the oldest, default limit"."""
    if media is JSON:
        obj = _json_object(body, "poll request")
        raw_start = obj.get("startFrom")
        start: MessageId | int | None
        if raw_start is None:
            start = None
        elif isinstance(raw_start, str):
            start = _start_from_bytes(b64decode(raw_start, "startFrom"))
        else:
            start = _int(raw_start, "startFrom", 0, INT64_MAX, optional=False)
        inclusive = obj.get("inclusive", True)
        if not isinstance(inclusive, bool):
            raise BadRequest("inclusive must be a boolean")
        limit = _int(obj.get("limit"), "limit", 1, INT32_MAX, optional=True)
        raw_tx = obj.get("transaction")
        tx = None if raw_tx is None else b64decode(raw_tx, "transaction")
        return ConsumeRequest(start, inclusive, limit, tx)
    if not body:
        return ConsumeRequest()
    value = _avro_read(body, CONSUME_REQUEST, "poll request")
    raw = value["startFrom"]
    if isinstance(raw, bytes):
        start = _start_from_bytes(raw)
    elif raw is None:
        start = None
    else:
        start = _int(raw, "startFrom", 0, INT64_MAX, optional=False)
    limit = value["limit"]
    if limit is not None and limit < 1:
        raise BadRequest("limit must be a positive integer")
    return ConsumeRequest(start, bool(value["inclusive"]), limit, value["transaction"])


def encode_consume_request(req: ConsumeRequest, media: Media) -> bytes:
    """Encode a poll body."""
    start: bytes | int | None = (
        req.start.to_bytes() if isinstance(req.start, MessageId) else req.start
    )
    if media is JSON:
        return orjson.dumps(
            {
                "startFrom": b64encode(start) if isinstance(start, bytes) else start,
                "inclusive": req.inclusive,
                "limit": req.limit,
                "transaction": None if req.transaction is None else b64encode(req.transaction),
            }
        )
    # Written by hand (a consumer sends one per page; fastavro's generic writer took
    # ~25 us of it under load): each union is its branch index, then the value.
    parts: list[bytes]
    if isinstance(start, bytes):
        parts = [b"\x00", _long(len(start)), start]
    elif start is None:
        parts = [b"\x04"]
    else:
        parts = [b"\x02", _long(start)]  # a timestamp: the union's long branch
    parts.append(b"\x01" if req.inclusive else b"\x00")
    parts.append(b"\x02" if req.limit is None else b"\x00" + _long(req.limit))
    if req.transaction is None:
        parts.append(b"\x02")
    else:
        parts += (b"\x00", _long(len(req.transaction)), req.transaction)
    return b"".join(parts)


def encode_messages(messages: Sequence[Message], media: Media) -> bytes:
    """Encode a poll response (seed's Message array, extended per ``media``)."""
    if media is JSON:
        b2a = _b2a
        return orjson.dumps(
            [
                {
                    "id": b2a(m.id.to_bytes(), newline=False).decode(),
                    "payload": b2a(m.payload, newline=False).decode(),
                    "key": None if m.key is None else b2a(m.key, newline=False).decode(),
                    "headers": {k: b64encode(v) for k, v in m.headers.items()} if m.headers else {},
                }
                for m in messages
            ]
        )
    return _avro_messages(messages, extended=media is AVRO_EXT)


# The poll response is the one large body the server writes. fastavro's generic
# writer spends ~2.5 us per Message record; the layout is simple enough to write
# directly (~0.25 us), and tests/test_codec_wire_avro.py checks it against fastavro.


def _zigzag(n: int) -> bytes:
    """Avro's zig-zag varint of a long."""
    n = (n << 1) ^ (n >> 63)
    out = bytearray()
    while n & ~0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


_SMALL = tuple(_zigzag(n) for n in range(16384))


def _long(n: int) -> bytes:
    return _SMALL[n] if 0 <= n < 16384 else _zigzag(n)


@dataclass(frozen=True, slots=True)
class AvroItems:
    """How the messaging core writes plain messages straight into an Avro poll response."""

    suffix: bytes  # after the payload: b"" (seed schema) or null key + empty headers
    small: tuple[bytes, ...]  # zig-zag varints of 0..16383
    zigzag: Callable[[int], bytes]

    @classmethod
    def for_media(cls, media: Media) -> AvroItems | None:
        """The item layout of ``media``; None for JSON (no pre-encoding)."""
        if media is JSON:
            return None
        return cls(b"\x00\x00" if media is AVRO_EXT else b"", _SMALL, _zigzag)


def avro_messages(items: Sequence[Message | bytes], media: Media) -> bytes:
    """A poll response from messages and items the core already encoded for ``media``."""
    return _avro_messages(items, extended=media is AVRO_EXT)


def _avro_messages(messages: Sequence[Message | bytes], *, extended: bool) -> bytes:
    if not messages:
        return b"\x00"
    small, long_ = _SMALL, _long
    parts: list[bytes] = [long_(len(messages))]
    add = parts.append
    for m in messages:
        if type(m) is bytes:
            add(m)
            continue
        assert isinstance(m, Message)
        payload = m.payload
        add(b"\x28")  # the id: always 20 bytes
        add(m.id.to_bytes())
        add(small[len(payload)] if len(payload) < 16384 else _zigzag(len(payload)))
        add(payload)
        if extended:
            key = m.key
            if key is None:
                add(b"\x00")
            else:
                add(b"\x02")
                add(long_(len(key)))
                add(key)
            headers = m.headers
            if headers:
                add(long_(len(headers)))
                for name, value in headers.items():
                    raw = name.encode()
                    add(long_(len(raw)))
                    add(raw)
                    add(long_(len(value)))
                    add(value)
            add(b"\x00")
    add(b"\x00")
    return b"".join(parts)


def encode_message_ids(ids: Sequence[MessageId], media: Media) -> bytes:
    """Encode the answer of an ids-only poll: base64 strings in JSON, Avro
    ``array<bytes>`` in both Avro media."""
    return encode_raw_message_ids([i.to_bytes() for i in ids], media)


def encode_raw_message_ids(ids: Sequence[bytes], media: Media) -> bytes:
    """:func:`encode_message_ids` of ids already in their 20-byte form."""
    if media is JSON:
        b2a = _b2a
        return orjson.dumps([b2a(raw, newline=False).decode() for raw in ids])
    if not ids:
        return b"\x00"
    # One block: the count, then each id as a 20-byte Avro bytes (length 0x28), then
    # the end of the array.
    return b"".join([_zigzag(len(ids)), b"\x28", b"\x28".join(ids), b"\x00"])


def decode_message_ids(body: bytes, media: Media) -> list[MessageId]:
    """Decode the answer of an ids-only poll (used by the client)."""
    if media is JSON:
        try:
            items = orjson.loads(body) if body else []
        except orjson.JSONDecodeError:
            raise BadRequest("malformed JSON id list") from None
        if not isinstance(items, list):
            raise BadRequest("an id list is a JSON list")
        return [MessageId.from_bytes(b64decode(item, "id")) for item in items]
    if not body:
        return []
    # The layout the server writes (one block of 21-byte items) is read in place;
    # anything else that is valid Avro goes through fastavro.
    try:
        count, pos = _read_long(body, 0)
    except (IndexError, ValueError):
        count = pos = 0
    if count > 0 and len(body) == pos + 21 * count + 1 and body[-1] == 0:
        unpack, make = _ID_ITEM.iter_unpack, MessageId._make
        items = memoryview(body)[pos : pos + 21 * count]
        if all(item[0] == 0x28 for item in unpack(items)):
            return [make(item[1:]) for item in unpack(items)]
    raw = _avro_read(body, MESSAGE_IDS, "id list")
    return [MessageId.from_bytes(item) for item in raw]


def decode_messages(body: bytes, media: Media) -> list[Message]:
    """Decode a poll response (used by the client)."""
    if not gc.isenabled():
        return _decode_messages(body, media)
    # A page allocates two tuples per message, which with the collector running sets
    # off collections that walk the consumer's whole heap: 22 -> 11 ms per page of
    # 10,000 (measured). The tuples hold no cycles, so nothing waits to be freed.
    gc.disable()
    try:
        return _decode_messages(body, media)
    finally:
        gc.enable()


def _decode_messages(body: bytes, media: Media) -> list[Message]:
    if media is JSON:
        try:
            items = orjson.loads(body)
        except orjson.JSONDecodeError:
            raise BadRequest("malformed JSON poll response") from None
        if not isinstance(items, list):
            raise BadRequest("a poll response is a JSON list")
        out = []
        for item in items:
            if not isinstance(item, dict):
                raise BadRequest("a poll response item must be an object")
            key = item.get("key")
            headers = item.get("headers") or {}
            out.append(
                Message(
                    MessageId.from_bytes(b64decode(item.get("id"), "id")),
                    b64decode(item.get("payload"), "payload"),
                    None if key is None else b64decode(key, "key"),
                    {str(k): b64decode(v, "header") for k, v in headers.items()},
                )
            )
        return out
    try:
        return _read_avro_messages(body, extended=media is AVRO_EXT)
    except (IndexError, ValueError, struct.error, UnicodeDecodeError):
        raise BadRequest("malformed Avro poll response") from None


# Reading a large poll response is the consumer's hot path: fastavro builds a dict per
# record (~13 us per message with the objects after it); reading the simple layout
# directly, ids unpacked in place, costs a fraction of that.


def _read_long(buf: bytes, pos: int) -> tuple[int, int]:
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


def _read_avro_messages(body: bytes, *, extended: bool) -> list[Message]:
    out: list[Message] = []
    append, new = out.append, tuple.__new__
    unpack_id, read_long = _ID_STRUCT.unpack_from, _read_long
    end = len(body)
    pos = 0
    while True:
        count, pos = read_long(body, pos)
        if count == 0:
            break
        if count < 0:  # a block with its size in bytes, which we do not need
            count = -count
            _, pos = read_long(body, pos)
        for _ in range(count):
            if body[pos] != 0x28:  # the id's length, always 20
                raise ValueError("message id is not 20 bytes")
            message_id = new(MessageId, unpack_id(body, pos + 1))
            pos += 21
            size, pos = read_long(body, pos)
            if size < 0 or pos + size > end:
                raise ValueError("bad payload length")
            payload = body[pos : pos + size]
            pos += size
            if not extended:
                append(new(Message, (message_id, payload, None, NO_HEADERS, None)))
                continue
            if body[pos] == 0 and body[pos + 1] == 0:  # no key, no headers: the usual case
                pos += 2
                append(new(Message, (message_id, payload, None, NO_HEADERS, None)))
                continue
            branch = body[pos]
            pos += 1
            key = None
            if branch == 2:
                size, pos = read_long(body, pos)
                if size < 0 or pos + size > end:
                    raise ValueError("bad key length")
                key = body[pos : pos + size]
                pos += size
            elif branch != 0:
                raise ValueError("bad key union branch")
            headers: Mapping[str, bytes] = NO_HEADERS
            pairs, pos = read_long(body, pos)
            if pairs:
                built: dict[str, bytes] = {}
                while pairs:
                    if pairs < 0:
                        pairs = -pairs
                        _, pos = read_long(body, pos)
                    for _ in range(pairs):
                        size, pos = read_long(body, pos)
                        if size < 0 or pos + size > end:
                            raise ValueError("bad header name length")
                        name = body[pos : pos + size].decode()
                        pos += size
                        size, pos = read_long(body, pos)
                        if size < 0 or pos + size > end:
                            raise ValueError("bad header value length")
                        built[name] = body[pos : pos + size]
                        pos += size
                    pairs, pos = read_long(body, pos)
                headers = built
            append(new(Message, (message_id, payload, key, headers, None)))
    if pos != end:
        raise ValueError("trailing bytes")
    return out
