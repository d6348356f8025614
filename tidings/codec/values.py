"""Values of the Message, Payload and Metadata tables. Pure functions over bytes.

A Message Table or Payload Table value is one flags byte, then the optional fields in a
fixed order, then the payload, so the payload is a plain slice of the stored value::

    flags (1)             version (high 3 bits) | which fields follow (low 5 bits)
    t (8, signed)         if FLAG_T: the transaction write pointer (CDAP TMS's column "t")
    expires_at (8)        if FLAG_EXPIRY: per-message expiry, ms since the epoch
    key                   if FLAG_KEY: varint length + bytes
    headers               if FLAG_HEADERS: varint count, then per header varint length +
                          UTF-8 name, varint length + value
    payload               if FLAG_P: the rest of the value (CDAP TMS's column "p")
    range (20)            if not FLAG_P, optionally: first_ts (8) | first_seq (2) |
                          last_ts (8) | last_seq (2), unsigned big-endian

``t`` sits at a fixed offset (1..9) so a rollback rewrites eight bytes and copies the
rest (CDAP TMS's rollback of published messages). An entry without ``p`` is a Payload
Table pointer: its messages are the Payload Table rows under ``abs(t)``. If the rest of
a pointer value (after its fields) is empty, that is every row under the pointer (the
only form before payload ranges, so older data reads the same); if it is a 20-byte
range, only the rows whose ``write_ts | p_seq`` lies between its first and last
position, both inclusive. A pointer publish naming ranges writes one such entry per
range (docs/design.md, "Payload ranges"). The common pointer value is therefore
``POINTER | t`` (9 bytes) or ``POINTER | t | range`` (29 bytes).

A **batch entry** holds several consecutive messages of one publish in one Message
Table row, keyed by the first one's ``publish_ts | seq``; message ``i`` of it is
``seq + i`` (docs/design.md, "Batch entries")::

    flags (1)             BATCH (version 2, FLAG_P), or KEYED_BATCH (and FLAG_KEY); a
                          transaction's TX_BATCH or TX_KEYED_BATCH (and FLAG_T)
    t (8)                 in a transaction's entry only: its write pointer, as in
                          every transactional value
    count (4)             unsigned little-endian, at least 2
    ends ((count+1) x 4)  unsigned little-endian positions in the entry: message i's
                          bytes are [ends[i], ends[i+1])
    starts (count x 4)    the same: where each message's payload starts, which ends at
                          ends[i+1]
    values                each message's bytes, back to back: in a BATCH its payload
                          alone (starts[i] == ends[i]), or, as the first version of
                          batch entries wrote them, its PLAIN stored value (a flags
                          byte, then the payload); in a KEYED_BATCH its KEYED stored
                          value with a key shorter than 128 bytes (flags, length byte,
                          key, payload); in a transaction's entry its own TX_PLAIN or
                          TX_KEYED stored value

Readers take payloads and keys through the positions alone, so both forms of a BATCH
read the same.

The flags byte's version (2) keeps a reader that does not know batch entries from
taking one for a message: :func:`decode_value` refuses it.
"""

from __future__ import annotations

import json
import struct
import sys
from array import array
from collections.abc import Mapping, Sequence
from functools import lru_cache
from itertools import accumulate
from operator import add, itemgetter, sub
from typing import NamedTuple

from tidings.structs import PayloadRange

__all__ = [
    "FLAG_EXPIRY",
    "FLAG_HEADERS",
    "FLAG_KEY",
    "FLAG_P",
    "FLAG_T",
    "BATCH",
    "BATCH_FLAGS",
    "KEYED",
    "KEYED_BATCH",
    "PLAIN",
    "POINTER",
    "RANGE_SIZE",
    "TX_BATCH",
    "TX_KEYED",
    "TX_KEYED_BATCH",
    "TX_PLAIN",
    "UNKNOWN",
    "VERSION",
    "Seal",
    "StoredValue",
    "Tally",
    "TopicState",
    "batch_count",
    "batch_key_skip",
    "batch_key_starts",
    "batch_counts",
    "batch_layout",
    "decode_next_topic_id",
    "decode_seal",
    "decode_state",
    "decode_tally",
    "decode_topic_record",
    "decode_value",
    "encode_next_topic_id",
    "encode_batch",
    "encode_seal",
    "encode_state",
    "encode_tally",
    "encode_topic_record",
    "encode_plain_batch",
    "encode_keyed_batch_in",
    "encode_plain_batch_in",
    "encode_batch_in",
    "encode_tx_batch_in",
    "encode_pointer",
    "encode_value",
    "keyed_header",
    "payload_header",
    "read_payload_range",
    "read_varint",
    "read_write_pointer",
    "seal_time",
    "u32_lanes",
    "with_write_pointer",
    "write_varint",
]

VERSION = 1
FLAG_T = 0x01
FLAG_P = 0x02
FLAG_EXPIRY = 0x04
FLAG_KEY = 0x08
FLAG_HEADERS = 0x10
_FLAG_MASK = 0x1F
_VERSION_BITS = VERSION << 5

#: Flags byte of a non-transactional message without extras (the common case).
PLAIN = _VERSION_BITS | FLAG_P
#: Flags byte of a transactional message without extras.
TX_PLAIN = _VERSION_BITS | FLAG_T | FLAG_P
#: Flags bytes of a message with a key and nothing else (a keyed publish's common case).
KEYED = PLAIN | FLAG_KEY
TX_KEYED = TX_PLAIN | FLAG_KEY
#: Flags byte of a Payload Table pointer entry (``t`` only).
POINTER = _VERSION_BITS | FLAG_T
#: Flags byte of a batch entry: several plain messages in one row (see the module doc).
BATCH = (2 << 5) | FLAG_P
#: Flags byte of a batch entry of messages that each have a short key and nothing else.
KEYED_BATCH = BATCH | FLAG_KEY
#: The same, of messages published in a transaction: the entry's ``t`` follows its
#: flags byte, as in every transactional value, so a rollback rewrites it alone.
TX_BATCH = BATCH | FLAG_T
TX_KEYED_BATCH = KEYED_BATCH | FLAG_T
#: Every batch entry's flags byte.
BATCH_FLAGS = frozenset((BATCH, KEYED_BATCH, TX_BATCH, TX_KEYED_BATCH))
#: Where a batch entry's positions start (after its flags byte and count).
BATCH_ENDS_AT = 5

_I64 = struct.Struct(">q")
_U64 = struct.Struct(">Q")
_PLAIN_BYTE = bytes([PLAIN])
_KEYED_BYTE = bytes([KEYED])
_RANGE = struct.Struct(">QHQH")
_BATCH_HEAD = struct.Struct("<BI")
_COUNT = struct.Struct("<I")
_BIG_ENDIAN = sys.byteorder == "big"
#: Bytes of the optional range at the end of a pointer value.
RANGE_SIZE = _RANGE.size


class StoredValue(NamedTuple):
    """A decoded Message Table / Payload Table value."""

    write_pointer: int | None
    payload: bytes | None
    key: bytes | None
    headers: dict[str, bytes]
    expires_at: int | None


def payload_header(write_pointer: int | None = None) -> bytes:
    """The bytes before the payload of a message without extras.

    ``payload_header(wp) + payload`` equals ``encode_value(payload, wp)``; the publish
    path builds values this way, one concatenation per message.
    """
    if write_pointer is None:
        return _PLAIN_BYTE
    return bytes([TX_PLAIN]) + _I64.pack(write_pointer)


def keyed_header(write_pointer: int | None = None) -> bytes:
    """The bytes before the key's length byte of a message with a key and nothing else.

    For a key shorter than 128 bytes, ``keyed_header(wp) + bytes([len(key)]) + key +
    payload`` equals ``encode_value(payload, wp, key)``.
    """
    if write_pointer is None:
        return _KEYED_BYTE
    return bytes([TX_KEYED]) + _I64.pack(write_pointer)


def encode_value(
    payload: bytes | None,
    write_pointer: int | None = None,
    key: bytes | None = None,
    headers: Mapping[str, bytes] | None = None,
    expires_at: int | None = None,
) -> bytes:
    """Encode one value; ``payload=None`` makes a pointer entry (then ``t`` is required)."""
    flags = _VERSION_BITS
    parts: list[bytes] = []
    if write_pointer is not None:
        flags |= FLAG_T
        parts.append(_I64.pack(write_pointer))
    elif payload is None:
        raise ValueError("an entry without a payload must carry a write pointer")
    if expires_at is not None:
        flags |= FLAG_EXPIRY
        parts.append(_U64.pack(expires_at))
    if key is not None:
        flags |= FLAG_KEY
        parts.append(write_varint(len(key)))
        parts.append(key)
    if headers:
        flags |= FLAG_HEADERS
        varint = write_varint
        parts.append(varint(len(headers)))
        for name, value in headers.items():
            raw = name.encode("utf-8")
            parts.extend((varint(len(raw)), raw, varint(len(value)), value))
    if payload is not None:
        flags |= FLAG_P
        parts.append(payload)
    return bytes([flags]) + b"".join(parts)


def encode_pointer(write_pointer: int, payload_range: PayloadRange | None = None) -> bytes:
    """A Payload Table pointer entry: every row under ``write_pointer``, or with
    ``payload_range`` only the rows inside it (see the module docstring)."""
    if payload_range is None:
        return encode_value(None, write_pointer)
    return bytes([POINTER]) + _I64.pack(write_pointer) + _RANGE.pack(*payload_range)


def encode_batch(
    stored: Sequence[bytes], keyed: bool = False, write_pointer: int | None = None
) -> bytes:
    """A batch entry holding ``stored`` (at least two stored values, in order): all
    ``PLAIN``, or with ``keyed`` all ``KEYED`` with a key shorter than 128 bytes; with
    ``write_pointer``, the same of a transaction (``TX_PLAIN`` or ``TX_KEYED`` values,
    each with that ``t``), in an entry whose own ``t`` is the one a rollback flips."""
    count = len(stored)
    if count < 2:
        raise ValueError("a batch entry holds at least two messages")
    # Where the first stored value starts, and how far into each its payload or key is.
    head_size = BATCH_ENDS_AT if write_pointer is None else BATCH_ENDS_AT + 8
    base = head_size + 4 * (2 * count + 1)
    skip = 1 if write_pointer is None else 9  # the flags byte, and ``t``
    # Running sums over a list of lengths, each in C: no Python step per message.
    lengths = list(map(len, stored))
    ends = array("I", list(accumulate(lengths, initial=base)))
    if keyed:
        # A payload starts after the key's length byte and the key.
        starts = array(
            "I",
            list(
                map(
                    add,
                    accumulate(lengths, initial=base + skip + 1),
                    map(itemgetter(skip), stored),
                )
            ),
        )
    else:
        starts = array("I", list(accumulate(lengths, initial=base + skip)))
        starts.pop()
    flags = KEYED_BATCH if keyed else BATCH
    if write_pointer is None:
        head = _BATCH_HEAD.pack(flags, count)
    else:
        head = bytes([flags | FLAG_T]) + _I64.pack(write_pointer) + _COUNT.pack(count)
    return b"".join((head, _le32(ends), _le32(starts), *stored))


def batch_key_skip(flags: int) -> int:
    """How far into a keyed batch entry's stored value its key starts: after the flags
    byte and the key's length, and in a transaction's entry the ``t`` too."""
    return 10 if flags & FLAG_T else 2


def encode_plain_batch(payloads: Sequence[bytes]) -> bytes:
    """A ``BATCH`` entry of the plain messages ``payloads`` (at least two, in order),
    each stored as its payload alone: one join, and positions summed in C."""
    count = len(payloads)
    if count < 2:
        raise ValueError("a batch entry holds at least two messages")
    base = BATCH_ENDS_AT + 4 * (2 * count + 1)
    ends = array("I", list(accumulate(map(len, payloads), initial=base)))
    starts = ends[:count]
    head = _BATCH_HEAD.pack(BATCH, count)
    return b"".join((head, _le32(ends), _le32(starts), *payloads))


@lru_cache(maxsize=16)
def u32_lanes(count: int) -> int:
    """1 in each of ``count`` little-endian 32-bit lanes of one integer: ``d`` times it,
    added to ``count`` positions read as one integer, moves each by ``d`` (no lane
    carries into the next while every moved position stays in 0..2**32)."""
    return int.from_bytes(b"\x01\x00\x00\x00" * count, "little")


def encode_plain_batch_in(body: bytes, positions_at: int, count: int) -> bytes:
    """The ``BATCH`` entry of ``count`` payloads (at least two) back to back in ``body``,
    whose ``count + 1`` positions in it are unsigned 32-bit little-endian integers from
    ``positions_at`` on, never decreasing: the payloads copied once, as one block."""
    if count < 2:
        raise ValueError("a batch entry holds at least two messages")
    size = 4 * (count + 1)
    raw = body[positions_at : positions_at + size]
    first = int.from_bytes(raw[:4], "little")
    last = int.from_bytes(raw[-4:], "little")
    base = BATCH_ENDS_AT + 4 * (2 * count + 1)
    # Every position moved by the same amount in one addition of two big integers,
    # instead of an addition per message: every moved position lies inside the entry.
    moved = int.from_bytes(raw, "little") + (base - first) * u32_lanes(count + 1)
    ends = moved.to_bytes(size, "little")
    head = _BATCH_HEAD.pack(BATCH, count)
    return b"".join((head, ends, ends[: 4 * count], memoryview(body)[first:last]))


def encode_keyed_batch_in(
    body: bytes, payload_positions: Sequence[int], key_positions: Sequence[int]
) -> bytes | None:
    """The ``KEYED_BATCH`` entry of the messages whose payloads and keys lie in ``body``
    at these positions: :func:`encode_batch_in` without a write pointer."""
    return encode_batch_in(body, payload_positions, key_positions, None)


def encode_tx_batch_in(
    body: bytes,
    payload_positions: Sequence[int],
    key_positions: Sequence[int] | None,
    write_pointer: int,
) -> bytes | None:
    """The ``TX_BATCH`` (or with ``key_positions``, ``TX_KEYED_BATCH``) entry of the
    messages in ``body`` published under ``write_pointer``: :func:`encode_batch_in`."""
    return encode_batch_in(body, payload_positions, key_positions, write_pointer)


def encode_batch_in(
    body: bytes,
    payload_positions: Sequence[int],
    key_positions: Sequence[int] | None,
    write_pointer: int | None,
) -> bytes | None:
    """The batch entry of the messages whose payloads (and keys) lie in ``body`` at these
    positions (``count + 1`` each, never decreasing; at least two messages), each
    message's stored value (``KEYED``; with ``write_pointer``, ``TX_PLAIN`` or
    ``TX_KEYED``) made by loops that run in C. None if a key is 128 bytes or longer,
    which only a row of its own holds. Plain payloads without a write pointer are
    :func:`encode_plain_batch_in`'s (one block, no value per message)."""
    count = len(payload_positions) - 1
    if count < 2:
        raise ValueError("a batch entry holds at least two messages")
    t = b"" if write_pointer is None else _I64.pack(write_pointer)
    cut = body.__getitem__
    payloads = map(cut, map(slice, payload_positions[:-1], payload_positions[1:]))
    base = BATCH_ENDS_AT + len(t) + 4 * (2 * count + 1)
    if key_positions is None:
        if write_pointer is None:
            raise ValueError("plain payloads without a write pointer: encode_plain_batch_in")
        # Each stored value as two parts: flags and ``t``, then the payload.
        parts: list[bytes] = [bytes([TX_PLAIN]) + t] * (2 * count)
        parts[1::2] = payloads
        at = list(accumulate(map(len, parts), initial=base))
        ends, starts = array("I", at[0::2]), array("I", at[1::2])
        flags = TX_BATCH
    else:
        key_lengths = list(map(sub, key_positions[1:], key_positions[:-1]))
        if max(key_lengths) >= 0x80:
            return None
        prefix = bytes([KEYED if write_pointer is None else TX_KEYED]) + t
        prefixes = {n: prefix + bytes((n,)) for n in set(key_lengths)}
        # Three parts each: flags (``t``) and the key's length; the key; the payload.
        parts = [b""] * (3 * count)
        parts[0::3] = map(prefixes.__getitem__, key_lengths)
        parts[1::3] = map(cut, map(slice, key_positions[:-1], key_positions[1:]))
        parts[2::3] = payloads
        at = list(accumulate(map(len, parts), initial=base))
        ends, starts = array("I", at[0::3]), array("I", at[2::3])
        flags = KEYED_BATCH if write_pointer is None else TX_KEYED_BATCH
    head = bytes((flags,)) + t + _COUNT.pack(count)
    return b"".join((head, _le32(ends), _le32(starts), *parts))


def _le32(numbers: array[int]) -> bytes:
    """An ``array("I")`` as the unsigned little-endian integers a batch entry holds."""
    if _BIG_ENDIAN:
        numbers = array("I", numbers)
        numbers.byteswap()
    return numbers.tobytes()


def _count_at(flags: int) -> int:
    """Where a batch entry's count is: after its flags byte, and ``t`` in a transaction's."""
    return 9 if flags & FLAG_T else 1


def _uint32s(value: bytes, at: int, count: int) -> array[int]:
    numbers = array("I", value[at : at + 4 * count])
    if _BIG_ENDIAN:
        numbers.byteswap()
    return numbers


def batch_layout(value: bytes) -> tuple[int, array[int], array[int]]:
    """A batch entry's count, the ends of its stored values and where each payload
    starts, as positions in ``value`` (stored so: a reader adds nothing per message):
    message ``i``'s stored value is ``value[ends[i]:ends[i + 1]]``, its payload
    ``value[starts[i]:ends[i + 1]]``, and in a keyed entry its key
    ``value[ends[i] + batch_key_skip(value[0]):starts[i]]``."""
    at = _count_at(value[0])
    (count,) = _COUNT.unpack_from(value, at)
    ends = _uint32s(value, at + 4, count + 1)
    starts = _uint32s(value, at + 4 + 4 * (count + 1), count)
    if len(starts) != count or ends[-1] != len(value):
        raise ValueError("malformed batch entry")
    return count, ends, starts


def batch_key_starts(value: bytes, count: int) -> array[int]:
    """Where each of a keyed batch entry's first ``count`` keys starts in ``value``
    (``ends[i] + batch_key_skip(value[0])``, :func:`batch_layout`): the stored values'
    ends moved in one addition of big integers, not one per message (every moved
    position stays inside the entry, so no lane carries into the next)."""
    at = _count_at(value[0]) + 4
    moved = int.from_bytes(value[at : at + 4 * count], "little") + batch_key_skip(
        value[0]
    ) * u32_lanes(count)
    return _uint32s(moved.to_bytes(4 * count, "little"), 0, count)


def batch_count(value: bytes) -> int:
    """How many messages a batch entry holds (its header only)."""
    return int(_COUNT.unpack_from(value, _count_at(value[0]))[0])


def batch_counts(value: bytes) -> tuple[int, int]:
    """A batch entry's message count and payload bytes."""
    count, ends, starts = batch_layout(value)
    return count, sum(ends) - ends[0] - sum(starts)


def read_payload_range(value: bytes) -> PayloadRange | None:
    """The range of a pointer value (None: every row under its pointer); ValueError if
    ``value`` is not a pointer entry."""
    if value[0] == POINTER:
        # The only shape publish writes: no optional fields, so no full decode.
        if len(value) == 9:
            return None
        if len(value) == 9 + RANGE_SIZE:
            return PayloadRange._make(_RANGE.unpack_from(value, 9))
        raise ValueError("a pointer value has 0 or 20 bytes after its write pointer")
    stored, payload_range = _decode(value)
    if stored.payload is not None:
        raise ValueError("not a pointer entry")
    return payload_range


def decode_value(value: bytes) -> StoredValue:
    """Decode a value written by :func:`encode_value` or :func:`encode_pointer`;
    ValueError if it is not one. A pointer entry's range is read with
    :func:`read_payload_range`."""
    return _decode(value)[0]


def _decode(value: bytes) -> tuple[StoredValue, PayloadRange | None]:
    if not value:
        raise ValueError("empty value")
    flags = value[0]
    if flags >> 5 != VERSION:
        raise ValueError(f"unknown value version {flags >> 5}")
    pos = 1
    write_pointer = expires_at = None
    key = None
    headers: dict[str, bytes] = {}
    if flags & FLAG_T:
        (write_pointer,) = _I64.unpack_from(value, pos)
        pos += 8
    if flags & FLAG_EXPIRY:
        (expires_at,) = _U64.unpack_from(value, pos)
        pos += 8
    if flags & FLAG_KEY:
        size, pos = read_varint(value, pos)
        key, pos = _take(value, pos, size)
    if flags & FLAG_HEADERS:
        count, pos = read_varint(value, pos)
        for _ in range(count):
            size, pos = read_varint(value, pos)
            raw, pos = _take(value, pos, size)
            size, pos = read_varint(value, pos)
            headers[raw.decode("utf-8")], pos = _take(value, pos, size)
    payload_range = None
    if flags & FLAG_P:
        payload: bytes | None = value[pos:]
    elif pos == len(value):
        payload = None
    elif len(value) - pos == RANGE_SIZE:
        payload = None
        payload_range = PayloadRange._make(_RANGE.unpack_from(value, pos))
    else:
        raise ValueError("trailing bytes after the fields of a pointer entry")
    return StoredValue(write_pointer, payload, key, headers, expires_at), payload_range


def read_write_pointer(value: bytes) -> int | None:
    """The ``t`` of a value without decoding the rest."""
    if value[0] & FLAG_T:
        return int(_I64.unpack_from(value, 1)[0])
    return None


def with_write_pointer(value: bytes, write_pointer: int) -> bytes:
    """``value`` with its ``t`` replaced (rollback stores ``-t``); ValueError if no ``t``."""
    if not value[0] & FLAG_T:
        raise ValueError("value carries no write pointer")
    return value[:1] + _I64.pack(write_pointer) + value[9:]


def _varint_slow(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


# Keys, header names and header values are short: a table lookup beats the loop
# (four varints per message with a key and a header).
_SMALL_VARINTS = tuple(_varint_slow(n) for n in range(4096))


def write_varint(n: int) -> bytes:
    """The unsigned varint stored values give lengths and counts in."""
    return _SMALL_VARINTS[n] if n < 4096 else _varint_slow(n)


def read_varint(value: bytes, pos: int) -> tuple[int, int]:
    """The unsigned varint at ``pos``: (value, next position); ValueError if it is
    truncated or overlong."""
    if pos < len(value) and value[pos] < 0x80:  # one byte: lengths under 128
        return value[pos], pos + 1
    result = shift = 0
    while True:
        if pos >= len(value) or shift > 63:
            raise ValueError("truncated or overlong varint")
        byte = value[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


def _take(value: bytes, pos: int, size: int) -> tuple[bytes, int]:
    end = pos + size
    if end > len(value):
        raise ValueError("value truncated")
    return value[pos:end], end


# --- Metadata Table ---------------------------------------------------------------


class TopicState(NamedTuple):
    """What the publish and fetch paths need about a topic, in one fixed-size record.

    ``generation`` is negative once the topic is deleted. The ``last_*`` fields are the
    last assigned Message Table ``(publish_ts, seq)`` and Payload Table
    ``(write_ts, p_seq)``; new keys start after them even if the clock went backwards
    (``max(now, last)``: docs/design.md, invariant 1). ``message_count`` and ``payload_bytes``
    are what ``stats`` reports for the current generation, kept up to date by the writes
    that change them (docs/design.md, "Topic statistics without a scan");
    :data:`UNKNOWN` in a state written before they were kept.
    """

    generation: int
    ttl: int
    last_ts: int = 0
    last_seq: int = 0
    last_write_ts: int = 0
    last_p_seq: int = 0
    message_count: int = 0
    payload_bytes: int = 0


#: ``message_count`` / ``payload_bytes`` of a state from before they were kept.
UNKNOWN = -1

_STATE_V1 = struct.Struct(">iQQHQH")
_STATE_V2 = struct.Struct(">iQQHQHqq")
_STATE = struct.Struct(">BiQQHQHqq")
_STATE_VERSION = 2
_STATE_V2_SIZE = _STATE.size


def encode_state(state: TopicState) -> bytes:
    """The 49-byte form (version 2) of a :class:`TopicState`."""
    return _STATE.pack(_STATE_VERSION, *state)


def decode_state(raw: bytes) -> TopicState:
    """Inverse of :func:`encode_state`; also reads the 33-byte version 1 (counts
    :data:`UNKNOWN`)."""
    # Every publish and fetch reads the state: the current version goes first.
    if raw[0] == _STATE_VERSION and len(raw) == _STATE_V2_SIZE:
        return TopicState._make(_STATE_V2.unpack_from(raw, 1))
    if raw[0] == 1 and len(raw) == 1 + _STATE_V1.size:
        return TopicState._make((*_STATE_V1.unpack_from(raw, 1), UNKNOWN, UNKNOWN))
    raise ValueError(f"unknown topic state version {raw[0]} ({len(raw)} bytes)")


class Seal(NamedTuple):
    """The value of a seal marker (:func:`tidings.codec.keys.sealed_key`).

    ``time`` is the publish time of the pointer entries (the last one's, ms); the marker
    goes once it is past the topic's TTL. ``message_count`` and ``payload_bytes`` are
    what those entries still add to the topic's counts: the Payload Table rows they
    expose that exist. ``ranges`` are the entries' payload ranges (None: every row under
    the pointer), so that the cleaner can tell whether a row it deletes was exposed.
    A marker written before counts were kept holds only the time: counts
    :data:`UNKNOWN`, ranges None.
    """

    time: int
    message_count: int
    payload_bytes: int
    ranges: tuple[PayloadRange, ...] | None = None


_SEAL = struct.Struct(">Qqq")


def encode_seal(seal: Seal) -> bytes:
    """``time (8) | message_count (8) | payload_bytes (8)`` then 20 bytes per range."""
    head = _SEAL.pack(seal.time, seal.message_count, seal.payload_bytes)
    if seal.ranges is None:
        return head
    if not seal.ranges:
        raise ValueError("a ranged seal names at least one range")
    return head + b"".join(_RANGE.pack(*r) for r in seal.ranges)


def decode_seal(raw: bytes) -> Seal:
    """Inverse of :func:`encode_seal`; an 8-byte (older) marker has unknown counts."""
    if len(raw) == 8:
        return Seal(int.from_bytes(raw, "big"), UNKNOWN, UNKNOWN)
    tail = len(raw) - _SEAL.size
    if tail < 0 or tail % RANGE_SIZE:
        raise ValueError(f"a seal marker of {len(raw)} bytes")
    time, count, size = _SEAL.unpack_from(raw)
    if not tail:
        return Seal(time, count, size)
    ranges = tuple(
        PayloadRange._make(_RANGE.unpack_from(raw, at))
        for at in range(_SEAL.size, len(raw), RANGE_SIZE)
    )
    return Seal(time, count, size, ranges)


def seal_time(raw: bytes) -> int:
    """The ``time`` of a seal marker's value, without decoding the rest."""
    return int.from_bytes(raw[:8], "big")


class Tally(NamedTuple):
    """What one ``store`` added under a write pointer that is not yet published: its
    last position (the first is in the key, :func:`tidings.codec.keys.tally_key`) and
    how many of its rows, and payload bytes, still exist."""

    last_ts: int
    last_seq: int
    message_count: int
    payload_bytes: int


_TALLY = struct.Struct(">QHqq")


def encode_tally(tally: Tally) -> bytes:
    """The 26-byte form of a :class:`Tally`."""
    return _TALLY.pack(*tally)


def decode_tally(raw: bytes) -> Tally:
    """Inverse of :func:`encode_tally`."""
    return Tally._make(_TALLY.unpack(raw))


def encode_topic_record(topic_id: int, properties: Mapping[str, str]) -> bytes:
    """A topic's record: its id (kept across delete and re-create) and its properties."""
    return json.dumps(
        {"id": topic_id, "properties": dict(properties)}, sort_keys=True, separators=(",", ":")
    ).encode("utf-8")


def decode_topic_record(raw: bytes) -> tuple[int, dict[str, str]]:
    """``(topic_id, properties)`` of a topic record."""
    data = json.loads(raw)
    return int(data["id"]), {str(k): str(v) for k, v in data["properties"].items()}


_U32 = struct.Struct(">I")


def encode_next_topic_id(topic_id: int) -> bytes:
    """The value of the topic id counter."""
    return _U32.pack(topic_id)


def decode_next_topic_id(raw: bytes) -> int:
    """Inverse of :func:`encode_next_topic_id`."""
    return int(_U32.unpack(raw)[0])
