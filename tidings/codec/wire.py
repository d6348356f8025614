"""Request and response bodies of the REST API, in every medium (docs/api.md).

The server decodes what clients send and the client decodes what the server answers
with the same functions, so the two cannot drift. This module holds the decoded forms
(:class:`PublishRequest`, :class:`ConsumeRequest`) and picks the medium; the media
themselves are in :mod:`~tidings.codec.media`, the Avro schemas and their hand-written
fast paths in :mod:`~tidings.codec.avro`, the JSON forms in
:mod:`~tidings.codec.json_bodies`.

Every decoder raises :class:`~tidings.errors.BadRequest` (never anything else) for a
body it cannot accept.
"""

from __future__ import annotations

import gc
import struct
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, cast

import orjson

from tidings.codec import avro, columns
from tidings.codec import json_bodies as jsonb
from tidings.codec.avro import SCHEMAS, AvroItems
from tidings.codec.json_bodies import b64decode, b64encode, payload_ranges_json
from tidings.codec.media import AVRO, AVRO_EXT, COLUMNS, JSON, Media, media_for, response_media_for
from tidings.codec.payload_frames import PayloadFrames, read_frames
from tidings.codec.stored_publish import StoredBatch, read_stored_batch
from tidings.errors import BadRequest
from tidings.names import INT64_MAX
from tidings.structs import NO_HEADERS, Message, MessageId, PayloadRange, Record, RollbackInfo

__all__ = [
    "AVRO",
    "AVRO_EXT",
    "COLUMNS",
    "JSON",
    "SCHEMAS",
    "AvroItems",
    "ConsumeRequest",
    "Media",
    "PageRows",
    "PublishRequest",
    "avro_messages",
    "b64decode",
    "b64encode",
    "decode_consume_request",
    "decode_message_ids",
    "decode_messages",
    "decode_payloads_request",
    "decode_publish_request",
    "decode_rollback_info",
    "encode_consume_request",
    "encode_message_ids",
    "encode_messages",
    "encode_publish_request",
    "encode_raw_message_ids",
    "encode_rollback_info",
    "format_payload_range",
    "iterate_messages",
    "media_for",
    "no_rows",
    "parse_payload_range",
    "payload_ranges_json",
    "response_media_for",
    "publish_request_from_json",
]


# --- publish / store ---


@dataclass(frozen=True, slots=True)
class PublishRequest:
    """A decoded publish or store body.

    A message without extras stays a plain ``bytes`` payload rather than a
    :class:`Record`: building 500 frozen dataclasses per batch cost more than decoding
    it, and the messaging core takes either (its fastest path is all-bytes).
    """

    write_pointer: int | None
    #: The messages; already as stored values, or as a payloads body's positions,
    #: when the body was read that way.
    records: Sequence[Record | bytes] | StoredBatch | PayloadFrames
    #: ``payloadRanges`` of a JSON pointer publish (None if absent); only ever set
    #: together with a write pointer and no messages.
    payload_ranges: list[PayloadRange] | None = None


_new = tuple.__new__


def _record(payload: bytes, extras: Mapping[str, Any] | None) -> Record:
    if extras is None:
        return Record(payload)
    if len(extras) == 1 and "key" in extras:
        # A key alone, as JSON bodies mostly carry: tuple.__new__ skips the
        # NamedTuple's own __new__, a third of the cost per message.
        return _new(Record, (payload, extras["key"], NO_HEADERS, None))
    return Record(payload, extras.get("key"), extras.get("headers") or {}, extras.get("ttl"))


def _publish_request(
    wp: int | None,
    payloads: list[bytes],
    extras: list[dict[str, Any]] | None,
    ranges: list[PayloadRange] | None = None,
) -> PublishRequest:
    if extras is None:
        return PublishRequest(wp, payloads, ranges)
    records = [_record(p, e) for p, e in zip(payloads, extras, strict=True)]
    return PublishRequest(wp, records, ranges)


def _check_extras_avro(raw: list[dict[str, Any]] | None, n: int) -> None:
    if raw is None:
        return
    if len(raw) != n:
        raise BadRequest("extras must be null or a list as long as messages")
    for i, item in enumerate(raw):
        ttl = item.get("ttl")
        if ttl is not None and ttl < 1:
            raise BadRequest(f"extras[{i}].ttl must be a positive number of seconds")


def decode_payloads_request(body: bytes) -> PublishRequest:
    """Decode a ``publish``/``store`` body in the payloads medium
    (:mod:`tidings.codec.payload_frames`): its payloads stay where they are in it."""
    frames = read_frames(body)
    return PublishRequest(frames.write_pointer, frames)


def decode_publish_request(
    body: bytes, media: Media, *, stored_for: Literal["publish", "store"] | None = None
) -> PublishRequest:
    """Decode a ``publish``/``store`` body (CDAP TMS's PublishRequest, plus ``extras``).

    With ``stored_for``, the messages may come back as the values that a publish or a
    store of them writes (a :class:`StoredBatch`), when the body can be read that way
    (:mod:`tidings.codec.stored_publish`); otherwise, and by default, as records."""
    if media is JSON:
        return publish_request_from_json(jsonb.obj(body, "publish request"))
    if (
        stored_for is not None
        and len(body) > 2
        and ((media is AVRO_EXT and body[-3] == 0) or _large_payloads(body))
    ):
        # Likely extras (they end in zeros; a body without them ends in the last
        # payload's byte and two zeros), or payloads of a kilobyte and more: read
        # straight into stored values. Smaller plain payloads stay with fastavro,
        # which reads a list of them faster.
        stored = read_stored_batch(body, media is AVRO_EXT, store=stored_for == "store")
        if stored is not None:
            return PublishRequest(stored.write_pointer, stored)
    schema = avro.PUBLISH_REQUEST_EXT if media is AVRO_EXT else avro.PUBLISH_REQUEST
    value = avro.read(body, schema, "publish request")
    payloads = value["messages"]
    extras = value.get("extras")
    _check_extras_avro(extras, len(payloads))
    return _publish_request(value["transactionWritePointer"], payloads, extras)


#: From this average size on, plain payloads are read straight into stored values:
#: fastavro copies each into a bytes of its own, which costs it 2-7x the direct read
#: from 1 KiB up (500 payloads of 1, 2 and 4 KiB: 700, 1,100 and 2,600 us against
#: 340, 250-360 and 310-390; below 1,000 bytes fastavro is as fast or faster).
LARGE_PAYLOAD = 1000


def _large_payloads(body: bytes) -> bool:
    """Whether a PublishRequest body's payloads average :data:`LARGE_PAYLOAD` bytes or
    more (by the body's size over its message count; False if it does not say)."""
    try:
        pos = 1
        if body[0] == 0:
            _, pos = avro.read_long(body, 1)
        count, _ = avro.read_long(body, pos)
    except (IndexError, ValueError):
        return False
    return count > 0 and len(body) >= LARGE_PAYLOAD * count


def publish_request_from_json(
    obj: dict[str, Any],
    fields: frozenset[str] = jsonb.PUBLISH_FIELDS,
    what: str = "publish request",
) -> PublishRequest:
    """The PublishRequest in an already parsed JSON object (e.g. one topic of a
    transactional publish, whose ``fields`` include its topic); the same checks as
    :func:`decode_publish_request`."""
    return _publish_request(*jsonb.publish_request(obj, fields, what))


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


_BYTES = frozenset({bytes})
_RECORDS = frozenset({Record})


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
    extended = media is AVRO_EXT
    # The records' types found in C (a generator's step per record cost ~25 ns).
    kinds = set(map(type, records))
    if media is not JSON and kinds <= _BYTES:
        payloads = cast("Sequence[bytes]", records)
        return avro.write_publish(write_pointer, payloads, extended=extended)
    full: Sequence[Record]
    if kinds <= _RECORDS:
        full = cast("Sequence[Record]", records)
    else:
        full = [Record(r) if isinstance(r, bytes) else r for r in records]
    needs_extras = any(_has_extras(r) for r in full)
    if media is JSON:
        return jsonb.dump_publish_request(write_pointer, full, with_extras=needs_extras)
    if not needs_extras:
        return avro.write_publish(write_pointer, [r.payload for r in full], extended=extended)
    if not extended:
        raise ValueError("plain avro/binary cannot carry keys, headers or ttl; use AVRO_EXT")
    # A Record is the encoder's (payload, key, headers, ttl): passed as it is.
    return avro.write_publish_ext(write_pointer, full)


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
    return avro.write(value, avro.PUBLISH_RESPONSE)


def decode_rollback_info(body: bytes, media: Media) -> RollbackInfo:
    """Decode a rollback body (the publish response, echoed back)."""
    if media is JSON:
        # Unknown fields are let through here alone: the body is a publish answer sent
        # back as it came, and an answer may gain fields (from a newer node of a
        # cluster, mid-upgrade). Every field read is required, so none can be misspelt.
        obj = jsonb.obj(body, "rollback request")
    else:
        obj = avro.read(body, avro.PUBLISH_RESPONSE, "rollback request")
    integer = jsonb.integer
    wp = integer(
        obj.get("transactionWritePointer"), "transactionWritePointer", 1, INT64_MAX, optional=False
    )
    start_ts = integer(obj.get("startTimestamp"), "startTimestamp", 0, INT64_MAX, optional=False)
    end_ts = integer(obj.get("endTimestamp"), "endTimestamp", 0, INT64_MAX, optional=False)
    start_seq = integer(obj.get("startSequenceId"), "startSequenceId", 0, 0xFFFF, optional=False)
    end_seq = integer(obj.get("endSequenceId"), "endSequenceId", 0, 0xFFFF, optional=False)
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


def decode_consume_request(body: bytes, media: Media) -> ConsumeRequest:
    """Decode a poll body; an empty body means "from the oldest, default limit"."""
    if media is JSON:
        return ConsumeRequest(*jsonb.consume_request(body))
    if not body:
        return ConsumeRequest()
    value = avro.read(body, avro.CONSUME_REQUEST, "poll request")
    raw = value["startFrom"]
    start: MessageId | int | None
    if isinstance(raw, bytes):
        start = jsonb.start_from_bytes(raw)
    elif raw is None:
        start = None
    else:
        start = jsonb.integer(raw, "startFrom", 0, INT64_MAX, optional=False)
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
        return jsonb.dump_consume_request(start, req.inclusive, req.limit, req.transaction)
    return avro.write_consume_request(start, req.inclusive, req.limit, req.transaction)


def encode_messages(messages: Sequence[Message], media: Media) -> bytes:
    """Encode a poll response (CDAP TMS's Message array, extended per ``media``)."""
    if media is JSON:
        return jsonb.dump_messages(messages)
    if media is COLUMNS:
        return columns.write_messages(messages)
    return avro.write_messages(messages, extended=media is AVRO_EXT)


def avro_messages(items: Sequence[Message | bytes], media: Media) -> bytes:
    """A poll response from messages and items the core already encoded for ``media``."""
    return avro.write_messages(items, extended=media is AVRO_EXT)


def encode_message_ids(ids: Sequence[MessageId], media: Media) -> bytes:
    """Encode the answer of an ids-only poll: base64 strings in JSON, Avro
    ``array<bytes>`` in both Avro media."""
    return encode_raw_message_ids([i.to_bytes() for i in ids], media)


def encode_raw_message_ids(ids: Sequence[bytes], media: Media) -> bytes:
    """:func:`encode_message_ids` of ids already in their 20-byte form."""
    if media is JSON:
        return jsonb.dump_ids(ids)
    return avro.write_ids(ids)


def decode_message_ids(body: bytes, media: Media) -> list[MessageId]:
    """Decode the answer of an ids-only poll (used by the client)."""
    if media is JSON:
        return jsonb.ids(body)
    return avro.read_ids(body)


def decode_messages(body: bytes, media: Media) -> list[Message]:
    """Decode a poll response (used by the client)."""
    if not gc.isenabled():
        return _decode_messages(body, media)
    # A page allocates two tuples per message, which with the collector running sets
    # off collections that walk the consumer's whole heap: 22 -> 11 ms per page of
    # 10,000 (BENCHMARKS.md, "Where the time goes", Read (W2)). The tuples hold no
    # cycles, so nothing waits to be freed.
    gc.disable()
    try:
        return _decode_messages(body, media)
    finally:
        gc.enable()


@dataclass(frozen=True, slots=True)
class PageRows:
    """A poll response's messages for a reader that takes them one at a time, with what
    it needs to know of them beforehand: how many, the first and the last id."""

    count: int
    first: MessageId | None
    last: MessageId | None
    messages: Iterator[Message]


def no_rows() -> PageRows:
    """The rows of an empty page."""
    return PageRows(0, None, None, iter(()))


def iterate_messages(body: bytes, media: Media) -> PageRows:
    """A poll response as :class:`PageRows`: a columnar body is checked now and its
    messages made as they are asked for (:meth:`ColumnPage.iter_messages`); other
    media are decoded now."""
    if media is COLUMNS:
        try:
            page = columns.read_columns(body)
        except (ValueError, IndexError, struct.error) as exc:
            raise BadRequest(f"malformed columnar poll response: {exc}") from None
        if not page.count:
            return no_rows()
        return PageRows(page.count, page.message_id(0), page.message_id(-1), page.iter_messages())
    messages = decode_messages(body, media)
    if not messages:
        return no_rows()
    return PageRows(len(messages), messages[0].id, messages[-1].id, iter(messages))


def _decode_messages(body: bytes, media: Media) -> list[Message]:
    if media is JSON:
        return jsonb.messages(body)
    if media is COLUMNS:
        try:
            return columns.read_columns(body).messages()
        except (ValueError, IndexError, struct.error) as exc:
            raise BadRequest(f"malformed columnar poll response: {exc}") from None
    try:
        return avro.read_messages(body, extended=media is AVRO_EXT)
    except (IndexError, ValueError, struct.error, UnicodeDecodeError):
        raise BadRequest("malformed Avro poll response") from None
