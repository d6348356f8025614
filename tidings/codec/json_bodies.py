"""The JSON form of the REST bodies: Avro ``bytes`` fields as standard base64 strings.

A JSON number in ``startFrom`` is a timestamp in ms. Extra fields (``extras`` on
publish, ``key`` and ``headers`` on messages) are additions a CDAP TMS client simply
ignores. Every reader raises :class:`~tidings.errors.BadRequest` for a body it cannot
accept; the request dataclasses themselves live in :mod:`tidings.codec.wire`.
"""

from __future__ import annotations

import binascii
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from tidings.errors import BadRequest, InvalidMessageId
from tidings.names import INT64_MAX, INT64_MIN
from tidings.structs import MESSAGE_ID_SIZE, Message, MessageId, PayloadRange, Record

__all__ = [
    "INT32_MAX",
    "b64decode",
    "b64decode_all",
    "b64encode",
    "consume_request",
    "dump_consume_request",
    "dump_ids",
    "dump_messages",
    "dump_publish_request",
    "ids",
    "integer",
    "messages",
    "whole",
    "obj",
    "only",
    "payload_ranges_json",
    "publish_request",
    "start_from_bytes",
]

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1

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


def b64decode_all(items: list[Any], what: str) -> list[bytes]:
    """Decode a list of base64 strings; one C call per item on the good path."""
    try:
        return [_a2b(item, strict_mode=True) for item in items]
    except (binascii.Error, ValueError, TypeError):
        pass  # decode again item by item, for an error that names the culprit
    return [b64decode(item, f"{what}[{i}]") for i, item in enumerate(items)]


def obj(body: bytes, what: str) -> dict[str, Any]:
    """The JSON object in ``body`` (an empty body is ``{}``)."""
    try:
        value = orjson.loads(body) if body else {}
    except orjson.JSONDecodeError:
        raise BadRequest(f"malformed JSON {what}") from None
    if not isinstance(value, dict):
        raise BadRequest(f"the {what} must be a JSON object")
    return value


def only(value: Mapping[str, Any], fields: frozenset[str], what: str) -> None:
    """:class:`BadRequest` naming the first field of ``value`` not among ``fields``.

    A misspelt field must not be read as an absent one: ``queueAcks`` for ``acks``
    would commit a transaction without its acks and answer 200. One C-level subset
    test on the good path, so hot bodies pay next to nothing for it.
    """
    if fields.issuperset(value):
        return
    unknown = next(k for k in value if k not in fields)
    raise BadRequest(
        f"unknown field {unknown!r:.80} in the {what}; it takes {', '.join(sorted(fields))}"
    )


def whole(value: object) -> object:
    """A JSON number that is a whole number (``5.0``) as an int, as JSON Schema counts
    it an integer; anything else unchanged."""
    if type(value) is float and value.is_integer() and abs(value) <= 2.0**63:
        return int(value)
    return value


def integer(value: object, what: str, lo: int, hi: int, *, optional: bool) -> int | None:
    """``value`` if it is an integer in [lo, hi] (or None and ``optional``)."""
    if value is None and optional:
        return None
    value = whole(value)
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise BadRequest(f"{what} must be an integer in [{lo}, {hi}]")
    return value


def start_from_bytes(raw: bytes) -> MessageId:
    """The message id of a ``startFrom`` given as bytes."""
    if len(raw) != MESSAGE_ID_SIZE:
        raise InvalidMessageId(f"startFrom must be a {MESSAGE_ID_SIZE}-byte message id")
    return MessageId.from_bytes(raw)


# --- publish / store ---


def _extras(raw: object, n: int) -> list[dict[str, Any]] | None:
    if raw is None:
        return None
    if not isinstance(raw, list) or len(raw) != n:
        raise BadRequest("extras must be null or a list as long as messages")
    out: list[dict[str, Any]] = []
    for i, item in enumerate(raw):
        if item is None:
            out.append({})
            continue
        if type(item) is dict and len(item) == 1 and type(key := item.get("key")) is str:
            # The common case, a key alone: one C call (a bad one is named below).
            try:
                out.append({"key": _a2b(key, strict_mode=True)})
                continue
            except (binascii.Error, ValueError):
                pass
        if not isinstance(item, dict):
            raise BadRequest(f"extras[{i}] must be an object or null")
        only(item, _EXTRAS_FIELDS, f"extras[{i}]")
        key = item.get("key")
        headers_raw = item.get("headers") or {}
        if not isinstance(headers_raw, dict):
            raise BadRequest(f"extras[{i}].headers must be an object of base64 strings")
        headers = {
            str(k): b64decode(v, f"extras[{i}].headers[{k!r}]") for k, v in headers_raw.items()
        }
        ttl = integer(item.get("ttl"), f"extras[{i}].ttl", 1, INT64_MAX, optional=True)
        out.append(
            {
                "key": None if key is None else b64decode(key, f"extras[{i}].key"),
                "headers": headers,
                "ttl": ttl,
            }
        )
    return out


def _position(raw: object, what: str) -> tuple[int, int]:
    if not isinstance(raw, list) or len(raw) != 2:
        raise BadRequest(f"{what} must be a [writeTs, seq] pair of integers")
    ts = integer(raw[0], f"{what}[0]", 0, INT64_MAX, optional=False)
    seq = integer(raw[1], f"{what}[1]", 0, 0xFFFF, optional=False)
    assert ts is not None and seq is not None
    return ts, seq


def _payload_ranges(raw: object) -> list[PayloadRange] | None:
    # Shape only; order, overlap and count are the messaging core's checks.
    if raw is None:
        return None
    if not isinstance(raw, list):
        raise BadRequest("payloadRanges must be a list of {first, last} objects")
    out: list[PayloadRange] = []
    for i, item in enumerate(raw):
        if not isinstance(item, dict):
            raise BadRequest(f"payloadRanges[{i}] must be an object with first and last")
        only(item, _RANGE_FIELDS, f"payloadRanges[{i}]")
        first = _position(item.get("first"), f"payloadRanges[{i}].first")
        last = _position(item.get("last"), f"payloadRanges[{i}].last")
        out.append(PayloadRange(*first, *last))
    return out


#: The fields of a JSON PublishRequest.
PUBLISH_FIELDS = frozenset({"transactionWritePointer", "messages", "extras", "payloadRanges"})
_EXTRAS_FIELDS = frozenset({"key", "headers", "ttl"})
_RANGE_FIELDS = frozenset({"first", "last"})
#: The fields of a JSON poll body.
CONSUME_FIELDS = frozenset({"startFrom", "inclusive", "limit", "transaction"})


def publish_request(
    value: dict[str, Any],
    fields: frozenset[str] = PUBLISH_FIELDS,
    what: str = "publish request",
) -> tuple[int | None, list[bytes], list[dict[str, Any]] | None, list[PayloadRange] | None]:
    """The fields of a JSON PublishRequest: write pointer, payloads, per-message extras
    (None when absent) and payload ranges (None when absent); ``fields``: those the
    body may have (``what`` names it in the error for any other)."""
    if not fields.issuperset(value):  # the check inline: a publish's hot path
        only(value, fields, what)
    wp = integer(
        value.get("transactionWritePointer"),
        "transactionWritePointer",
        INT64_MIN,
        INT64_MAX,
        optional=True,
    )
    raw_messages = value.get("messages", [])
    if not isinstance(raw_messages, list):
        raise BadRequest("messages must be a list of base64 strings")
    payloads = b64decode_all(raw_messages, "messages")
    ranges = _payload_ranges(value.get("payloadRanges"))
    if ranges is not None and (wp is None or payloads):
        raise BadRequest("payloadRanges need a transactionWritePointer and no messages")
    return wp, payloads, _extras(value.get("extras"), len(payloads)), ranges


def payload_ranges_json(ranges: Sequence[PayloadRange]) -> list[dict[str, list[int]]]:
    """The ``payloadRanges`` field of a JSON publish body."""
    return [{"first": [r[0], r[1]], "last": [r[2], r[3]]} for r in ranges]


def dump_publish_request(
    write_pointer: int | None, records: Sequence[Record], *, with_extras: bool
) -> bytes:
    """A JSON PublishRequest; ``extras`` only when ``with_extras``."""
    value: dict[str, Any] = {
        "transactionWritePointer": write_pointer,
        "messages": [b64encode(r.payload) for r in records],
    }
    if with_extras:
        value["extras"] = [
            {
                "key": None if r.key is None else b64encode(r.key),
                "headers": {k: b64encode(v) for k, v in r.headers.items()},
                "ttl": r.ttl,
            }
            for r in records
        ]
    return orjson.dumps(value)


# --- poll ---


def consume_request(
    body: bytes,
) -> tuple[MessageId | int | None, bool, int | None, bytes | None]:
    """The fields of a JSON poll body: start, inclusive, limit, transaction."""
    value = obj(body, "poll request")
    if not CONSUME_FIELDS.issuperset(value):  # the check inline: a poll's hot path
        only(value, CONSUME_FIELDS, "poll request")
    raw_start = value.get("startFrom")
    start: MessageId | int | None
    if raw_start is None:
        start = None
    elif isinstance(raw_start, str):
        start = start_from_bytes(b64decode(raw_start, "startFrom"))
    else:
        start = integer(raw_start, "startFrom", 0, INT64_MAX, optional=False)
    inclusive = value.get("inclusive", True)
    if not isinstance(inclusive, bool):
        raise BadRequest("inclusive must be a boolean")
    limit = integer(value.get("limit"), "limit", 1, INT32_MAX, optional=True)
    raw_tx = value.get("transaction")
    tx = None if raw_tx is None else b64decode(raw_tx, "transaction")
    return start, inclusive, limit, tx


def dump_consume_request(
    start: bytes | int | None, inclusive: bool, limit: int | None, transaction: bytes | None
) -> bytes:
    """A JSON poll body."""
    return orjson.dumps(
        {
            "startFrom": b64encode(start) if isinstance(start, bytes) else start,
            "inclusive": inclusive,
            "limit": limit,
            "transaction": None if transaction is None else b64encode(transaction),
        }
    )


def dump_messages(messages: Sequence[Message]) -> bytes:
    """A JSON poll response."""
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


def messages(body: bytes) -> list[Message]:
    """The messages of a JSON poll response."""
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


def dump_ids(raw_ids: Sequence[bytes]) -> bytes:
    """The answer of an ids-only poll: a list of base64 strings."""
    b2a = _b2a
    return orjson.dumps([b2a(raw, newline=False).decode() for raw in raw_ids])


def ids(body: bytes) -> list[MessageId]:
    """The ids of a JSON ids-only poll answer."""
    try:
        items = orjson.loads(body) if body else []
    except orjson.JSONDecodeError:
        raise BadRequest("malformed JSON id list") from None
    if not isinstance(items, list):
        raise BadRequest("an id list is a JSON list")
    return [MessageId.from_bytes(b64decode(item, "id")) for item in items]
