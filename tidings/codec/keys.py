"""Row keys of the Message, Payload and Metadata tables (docs/design.md).

Pure functions over bytes. Every integer is big-endian, so the byte order of keys equals
the numeric order of their fields; that is what lets a topic's messages be scanned in
id order (CDAP TMS's Message and Payload tables)::

    Message Table  topic_id (4) | generation (4) | publish_ts (8) | seq (2)         18 bytes
    Payload Table  topic_id (4) | generation (4) | write_pointer (8) | write_ts (8)
                   | p_seq (2)                                                      26 bytes

``topic_id`` is a fixed-width id allocated from the Metadata Table and never reused, so
no topic's keys are a prefix of another's. Only positive generations are ever written;
a topic's older generations sort before its live one, so "every row of an older
generation" is one contiguous range. The write pointer is signed (a rolled-back pointer
is negative elsewhere); it is stored with the sign bit flipped so that byte order equals
numeric order.

A message id (``publish_ts | seq | write_ts | p_seq``, 20 bytes) is literally bytes
8..18 of its Message Table key followed by bytes 16..26 of its Payload Table key (or ten
zero bytes), which is why ids sort exactly as consumers see them.

Metadata Table keys all start with ``msg.`` (the messaging core's part of that table;
other components must use other prefixes):

    msg.next-topic-id                          -> last allocated topic id
    msg.topic/{namespace}/{topic}              -> topic record (id, properties)
    msg.state/{topic_id (4)}                   -> topic state (generation, ttl, sequencing)
    msg.expiry/{expires_at (8)}{table (1)}{row key}  -> b"" (per-message TTL index)
    msg.sealed/{topic_id}{generation}{wp}      -> publish time, counts, ranges (values.Seal)
    msg.tally/{topic_id}{generation}{wp}{first ts|seq} -> what one store added (values.Tally)
"""

from __future__ import annotations

import struct

__all__ = [
    "EXPIRY_PREFIX",
    "MAX_GENERATION",
    "MAX_SEQ",
    "MAX_TOPIC_ID",
    "MESSAGE_KEY_SIZE",
    "NEXT_TOPIC_ID_KEY",
    "OPEN_PREFIX",
    "PRODUCER_PREFIX",
    "PAYLOAD_KEY_SIZE",
    "SEALED_PREFIX",
    "STATE_PREFIX",
    "TALLY_PREFIX",
    "TOPIC_PREFIX",
    "expiry_key",
    "generation_prefix",
    "generation_range",
    "message_id_bytes",
    "message_key",
    "message_keys",
    "older_generations_range",
    "open_key",
    "open_range",
    "open_write_pointer",
    "parse_expiry_key",
    "parse_message_key",
    "parse_payload_key",
    "parse_state_key",
    "parse_ts_seq",
    "parse_write_pointer_prefix",
    "payload_key",
    "producer_key",
    "payload_keys",
    "sealed_key",
    "sealed_range",
    "state_key",
    "tallies_range",
    "tally_key",
    "tally_range",
    "topic_record_key",
    "topic_records_range",
    "ts_seq",
    "write_pointer_prefix",
    "write_pointer_range",
]

MESSAGE_KEY_SIZE = 18
PAYLOAD_KEY_SIZE = 26
MAX_SEQ = 0xFFFF
#: The last id is kept free so that ``topic_id + 1`` always fits (range ends).
MAX_TOPIC_ID = 0xFFFF_FFFE
MAX_GENERATION = 0x7FFF_FFFF

_SIGN = 1 << 63
_TOPIC_GEN = struct.Struct(">II")
_MESSAGE = struct.Struct(">IIQH")
_TS_SEQ = struct.Struct(">QH")
_PAYLOAD = struct.Struct(">IIQQH")
_PAYLOAD_PREFIX = struct.Struct(">IIQ")
_TOPIC_ID = struct.Struct(">I")
_EXPIRY = struct.Struct(">Q")
_NO_PAYLOAD_SUFFIX = bytes(10)

NEXT_TOPIC_ID_KEY = b"msg.next-topic-id"
TOPIC_PREFIX = b"msg.topic/"
STATE_PREFIX = b"msg.state/"
EXPIRY_PREFIX = b"msg.expiry/"
#: Write pointers whose Payload Table rows a publish has exposed (one per topic/generation).
SEALED_PREFIX = b"msg.sealed/"
#: Transactions that published on a topic generation, with their first entry: what the
#: last stable position (the first entry of the oldest open transaction) is found by.
OPEN_PREFIX = b"msg.open/"
#: Idempotent producers: the last sequence number each wrote on a topic generation.
PRODUCER_PREFIX = b"msg.producer/"
#: What each store under a not yet published write pointer added (for the topic's counts).
TALLY_PREFIX = b"msg.tally/"


# --- Message Table ---------------------------------------------------------------


def generation_prefix(topic_id: int, generation: int) -> bytes:
    """The 8-byte prefix shared by every row of one generation of a topic (both tables)."""
    return _TOPIC_GEN.pack(topic_id, generation)


def generation_range(topic_id: int, generation: int) -> tuple[bytes, bytes]:
    """``[start, stop)`` holding exactly the rows of one generation (either table)."""
    return _TOPIC_GEN.pack(topic_id, generation), _TOPIC_GEN.pack(topic_id, generation + 1)


def older_generations_range(topic_id: int, below: int) -> tuple[bytes, bytes]:
    """``[start, stop)`` holding every row of the topic's generations ``< below``."""
    return _TOPIC_GEN.pack(topic_id, 0), _TOPIC_GEN.pack(topic_id, below)


def message_key(topic_id: int, generation: int, publish_ts: int, seq: int) -> bytes:
    """The Message Table key of one entry."""
    return _MESSAGE.pack(topic_id, generation, publish_ts, seq)


def parse_message_key(key: bytes) -> tuple[int, int, int, int]:
    """``(topic_id, generation, publish_ts, seq)`` of a Message Table key."""
    if len(key) != MESSAGE_KEY_SIZE:
        raise ValueError(f"a Message Table key is {MESSAGE_KEY_SIZE} bytes, got {len(key)}")
    topic_id, generation, publish_ts, seq = _MESSAGE.unpack(key)
    return topic_id, generation, publish_ts, seq


def message_keys(
    topic_id: int, generation: int, publish_ts: int, seq: int, count: int
) -> list[bytes]:
    """``count`` consecutive Message Table keys from ``(publish_ts, seq)`` on.

    When ``seq`` passes :data:`MAX_SEQ` the keys move on to the next millisecond at seq 0
    (the same rule :func:`tidings.messaging.sequencing.assign` uses).
    """
    return _consecutive(_TOPIC_GEN.pack(topic_id, generation), publish_ts, seq, count)


# --- Payload Table -----------------------------------------------------------------


def write_pointer_prefix(topic_id: int, generation: int, write_pointer: int) -> bytes:
    """The 16-byte prefix of the Payload Table rows stored under one write pointer."""
    return _PAYLOAD_PREFIX.pack(topic_id, generation, write_pointer + _SIGN)


def write_pointer_range(topic_id: int, generation: int, write_pointer: int) -> tuple[bytes, bytes]:
    """``[start, stop)`` of the Payload Table rows stored under one write pointer."""
    flipped = write_pointer + _SIGN
    start = _PAYLOAD_PREFIX.pack(topic_id, generation, flipped)
    if flipped == 2**64 - 1:
        return start, _TOPIC_GEN.pack(topic_id, generation + 1)
    return start, _PAYLOAD_PREFIX.pack(topic_id, generation, flipped + 1)


def parse_write_pointer_prefix(prefix: bytes) -> tuple[int, int, int]:
    """``(topic_id, generation, write_pointer)`` of the first 16 bytes of a Payload
    Table key (:func:`write_pointer_prefix`)."""
    topic_id, generation, flipped = _PAYLOAD_PREFIX.unpack_from(prefix)
    return topic_id, generation, flipped - _SIGN


def payload_key(
    topic_id: int, generation: int, write_pointer: int, write_ts: int, p_seq: int
) -> bytes:
    """The Payload Table key of one stored payload."""
    return _PAYLOAD.pack(topic_id, generation, write_pointer + _SIGN, write_ts, p_seq)


def parse_payload_key(key: bytes) -> tuple[int, int, int, int, int]:
    """``(topic_id, generation, write_pointer, write_ts, p_seq)`` of a Payload Table key."""
    if len(key) != PAYLOAD_KEY_SIZE:
        raise ValueError(f"a Payload Table key is {PAYLOAD_KEY_SIZE} bytes, got {len(key)}")
    topic_id, generation, flipped, write_ts, p_seq = _PAYLOAD.unpack(key)
    return topic_id, generation, flipped - _SIGN, write_ts, p_seq


def payload_keys(
    topic_id: int, generation: int, write_pointer: int, write_ts: int, p_seq: int, count: int
) -> list[bytes]:
    """``count`` consecutive Payload Table keys from ``(write_ts, p_seq)`` on."""
    return _consecutive(
        write_pointer_prefix(topic_id, generation, write_pointer), write_ts, p_seq, count
    )


def _consecutive(prefix: bytes, ts: int, seq: int, count: int) -> list[bytes]:
    # One bytes concatenation per key: this sits on the publish hot path.
    keys: list[bytes] = []
    while count > 0:
        run = min(count, MAX_SEQ + 1 - seq)
        base = prefix + _EXPIRY.pack(ts)
        keys.extend([base + s.to_bytes(2, "big") for s in range(seq, seq + run)])
        count -= run
        ts += 1
        seq = 0
    return keys


# --- Message ids -----------------------------------------------------------------


def message_id_bytes(message_row_key: bytes, payload_row_key: bytes | None = None) -> bytes:
    """The 20-byte message id of a Message Table row (and one of its payload rows)."""
    suffix = _NO_PAYLOAD_SUFFIX if payload_row_key is None else payload_row_key[16:26]
    return message_row_key[8:18] + suffix


def ts_seq(publish_ts: int, seq: int) -> bytes:
    """The 10-byte ``ts | seq`` tail of a Message Table key (or of a payload key)."""
    return _TS_SEQ.pack(publish_ts, seq)


def parse_ts_seq(raw: bytes) -> tuple[int, int]:
    """Inverse of :func:`ts_seq`."""
    ts, seq = _TS_SEQ.unpack(raw)
    return int(ts), int(seq)


# --- Metadata Table -------------------------------------------------------------------


def topic_record_key(namespace: str, topic: str) -> bytes:
    """Key of a topic's record. Names exclude ``/``, so no namespace is another's prefix."""
    return TOPIC_PREFIX + namespace.encode("ascii") + b"/" + topic.encode("ascii")


def topic_records_range(namespace: str) -> tuple[bytes, bytes]:
    """``[start, stop)`` of the topic records of one namespace."""
    prefix = TOPIC_PREFIX + namespace.encode("ascii")
    return prefix + b"/", prefix + b"0"  # "0" is the byte after "/"


def state_key(topic_id: int) -> bytes:
    """Key of a topic's state record (generation, ttl, last assigned timestamps)."""
    return STATE_PREFIX + _TOPIC_ID.pack(topic_id)


def parse_state_key(key: bytes) -> int:
    """The topic id of a state record key."""
    return int(_TOPIC_ID.unpack_from(key, len(STATE_PREFIX))[0])


def expiry_key(expires_at: int, table: str, row_key: bytes) -> bytes:
    """Index entry for a row carrying a per-message expiry; sorted by expiry time."""
    return EXPIRY_PREFIX + _EXPIRY.pack(expires_at) + table[:1].encode("ascii") + row_key


def sealed_key(topic_id: int, generation: int, write_pointer: int) -> bytes:
    """Marker that ``write_pointer``'s payloads were published on this topic generation."""
    return SEALED_PREFIX + write_pointer_prefix(topic_id, generation, write_pointer)


def sealed_range(topic_id: int, low_generation: int, high_generation: int) -> tuple[bytes, bytes]:
    """``[start, stop)`` of the seal markers of generations ``low <= g < high``."""
    return (
        SEALED_PREFIX + _TOPIC_GEN.pack(topic_id, low_generation),
        SEALED_PREFIX + _TOPIC_GEN.pack(topic_id, high_generation),
    )


def tally_key(
    topic_id: int, generation: int, write_pointer: int, first_ts: int, first_seq: int
) -> bytes:
    """Key of the tally of one store under ``write_pointer``: its first position."""
    return (
        TALLY_PREFIX
        + write_pointer_prefix(topic_id, generation, write_pointer)
        + _TS_SEQ.pack(first_ts, first_seq)
    )


def tally_range(topic_id: int, generation: int, write_pointer: int) -> tuple[bytes, bytes]:
    """``[start, stop)`` of the tallies of one write pointer, in position order."""
    start, stop = write_pointer_range(topic_id, generation, write_pointer)
    return TALLY_PREFIX + start, TALLY_PREFIX + stop


def tallies_range(topic_id: int, low_generation: int, high_generation: int) -> tuple[bytes, bytes]:
    """``[start, stop)`` of the tallies of generations ``low <= g < high``."""
    return (
        TALLY_PREFIX + _TOPIC_GEN.pack(topic_id, low_generation),
        TALLY_PREFIX + _TOPIC_GEN.pack(topic_id, high_generation),
    )


def open_key(topic_id: int, generation: int, write_pointer: int) -> bytes:
    """Marker of a transaction that published on this topic generation; its value is
    the ``ts_seq`` of the transaction's first entry there."""
    return OPEN_PREFIX + write_pointer_prefix(topic_id, generation, write_pointer)


def open_range(topic_id: int, generation: int) -> tuple[bytes, bytes]:
    """``[start, stop)`` of one topic generation's open-transaction markers."""
    return (
        OPEN_PREFIX + _TOPIC_GEN.pack(topic_id, generation),
        OPEN_PREFIX + _TOPIC_GEN.pack(topic_id, generation + 1),
    )


def open_write_pointer(key: bytes) -> int:
    """The write pointer of an open-transaction marker key."""
    flipped = int.from_bytes(key[len(OPEN_PREFIX) + 8 : len(OPEN_PREFIX) + 16], "big")
    return flipped - (1 << 63)


def producer_key(topic_id: int, generation: int, producer_id: bytes) -> bytes:
    """Where an idempotent producer's last sequence on a topic generation is kept."""
    return PRODUCER_PREFIX + _TOPIC_GEN.pack(topic_id, generation) + producer_id


def parse_expiry_key(key: bytes) -> tuple[int, str, bytes]:
    """``(expires_at, table, row_key)`` of an expiry index entry."""
    offset = len(EXPIRY_PREFIX)
    (expires_at,) = _EXPIRY.unpack_from(key, offset)
    tag = key[offset + 8 : offset + 9]
    table = {b"m": "messages", b"p": "payloads"}.get(tag)
    if table is None:
        raise ValueError(f"unknown table tag {tag!r} in expiry index key")
    return int(expires_at), table, key[offset + 9 :]
