"""The payloads request body (``application/vnd.tidings.payloads``): the payloads of a
publish or a store, and their keys if they have any, with their positions up front, for
writers that send many.

An Avro ``PublishRequest`` has to be walked payload by payload (every length is a
varint), which was most of what the server spent on a batch of small messages after
its store write (BENCHMARKS.md, "A publish body of payloads and their positions").
This body gives every payload's (and key's) position first, so the server checks the
body with a few loops that run in C and stores the payloads of a batch entry with one
copy. Messages with headers or a TTL are sent in Avro or JSON.

All integers are little-endian; ``n`` messages::

    offset 0   b"TDP1"
           4   u32 n
           8   u32 flags: 1 = a keys column follows the payload positions; no other
               flag is defined (a body with one set is refused)
          12   i64 the transaction write pointer, 0 for none (write pointers are
               positive)
          20   payload positions: (n + 1) x u32, absolute in the body: payload i is
               body[positions[i]:positions[i + 1]]
    if keys:   key positions: (n + 1) x u32, absolute (a message without a key:
               length 0); then n presence bytes (1: the message has a key, possibly
               empty; 0: it has none), then zero bytes up to a multiple of 4
               the payloads back to back, then the keys

Each positions column runs without decreasing from where the previous region ended
(the payloads from the end of the fixed part, the keys from the payloads' end), and
the last ends at the body's end: the layout of the columnar poll response without
its ids. A publish or a store accepts it (docs/api.md); the server answers such a
request in JSON. Servers before this medium answer 415, and the clients then send Avro.
"""

from __future__ import annotations

import struct
import sys
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import accumulate, compress, repeat
from operator import is_not, itemgetter, not_, sub
from typing import cast

from tidings.errors import BadRequest
from tidings.structs import NO_HEADERS, Record

__all__ = [
    "CONTENT_TYPE",
    "KEYS",
    "POSITIONS_AT",
    "PayloadFrames",
    "names_frames",
    "read_frames",
    "write_frames",
]

CONTENT_TYPE = "application/vnd.tidings.payloads"
MAGIC = b"TDP1"
#: The flag of a body with a keys column.
KEYS = 1
_BYTES = frozenset((bytes,))
_RECORDS = frozenset((Record,))
_payload_of, _key_of, _headers_of, _ttl_of = map(itemgetter, range(4))
_HEAD = struct.Struct("<4sIIq")
#: Where the positions start: right after the fixed head.
POSITIONS_AT = _HEAD.size
_BIG_ENDIAN = sys.byteorder == "big"


@dataclass(frozen=True, slots=True)
class PayloadFrames:
    """A payloads body checked by :func:`read_frames`: the body itself and its
    payloads' ``n + 1`` positions in it (and its keys'), kept rather than cut into a
    bytes each."""

    body: bytes
    positions: array[int]
    write_pointer: int | None
    #: The keys' positions, or None for a body without a keys column.
    key_positions: array[int] | None = None
    #: Per message 1 if it has a key, 0 if not (empty without a keys column).
    presence: bytes = b""

    def __len__(self) -> int:
        return len(self.positions) - 1

    @property
    def size(self) -> int:
        """The payloads' bytes."""
        return self.positions[-1] - self.positions[0]

    def payloads(self) -> list[bytes]:
        """Each payload as a bytes of its own (the general path's input)."""
        positions = self.positions
        return list(map(self.body.__getitem__, map(slice, positions[:-1], positions[1:])))

    def keys(self) -> list[bytes]:
        """Each message's key as a bytes of its own (empty for a message without one)."""
        positions = self.key_positions
        if positions is None:
            return [b""] * len(self)
        return list(map(self.body.__getitem__, map(slice, positions[:-1], positions[1:])))

    @property
    def all_keyed(self) -> bool:
        """True if there is a keys column and every message has a key."""
        return self.key_positions is not None and self.presence == b"\x01" * len(self)

    def records(self) -> list[Record | bytes]:
        """The messages as the general path takes them: a payload alone, or with a key
        a :class:`Record`."""
        payloads = self.payloads()
        if self.key_positions is None:
            return list(payloads)
        new, record = tuple.__new__, Record
        return [
            new(record, (p, k, NO_HEADERS, None)) if has else p
            for p, k, has in zip(payloads, self.keys(), self.presence, strict=True)
        ]


def names_frames(content_type: str | None) -> bool:
    """Whether a Content-Type header names this medium (any case, any parameters)."""
    return (
        content_type is not None and content_type.partition(";")[0].strip().lower() == CONTENT_TYPE
    )


def write_frames(write_pointer: int | None, messages: Sequence[Record | bytes]) -> bytes:
    """The body of a publish or store of ``messages``: payloads (bytes), or records
    with a key at most (no headers or TTL: ValueError)."""
    count = len(messages)
    kinds = set(map(type, messages))
    if kinds <= _BYTES:
        payloads = cast("Sequence[bytes]", messages)
        first = POSITIONS_AT + 4 * (count + 1)
        column = _u32s(accumulate(map(len, payloads), initial=first))
        head = _HEAD.pack(MAGIC, count, 0, write_pointer or 0)
        return b"".join((head, column, *payloads))
    records: Sequence[Record] = (
        cast("Sequence[Record]", messages)
        if kinds <= _RECORDS
        else [m if type(m) is Record else Record(cast(bytes, m)) for m in messages]
    )
    # Field by field over all records at once: loops that run in C.
    if any(map(_headers_of, records)) or set(map(_ttl_of, records)) - {None}:
        raise ValueError("the payloads body carries keys only: no headers or TTL")
    payloads = list(map(_payload_of, records))
    keys: list[bytes | None] = list(map(_key_of, records))
    presence = bytes(map(is_not, keys, repeat(None)))
    key_bytes = cast("list[bytes]", keys if None not in keys else [k or b"" for k in keys])
    first = POSITIONS_AT + 8 * (count + 1) + (count + 3) // 4 * 4
    positions = list(accumulate(map(len, payloads), initial=first))
    key_positions = list(accumulate(map(len, key_bytes), initial=positions[-1]))
    head = _HEAD.pack(MAGIC, count, KEYS, write_pointer or 0)
    columns = (_u32s(positions), _u32s(key_positions), presence, bytes(-count % 4))
    return b"".join((head, *columns, *payloads, *key_bytes))


def _u32s(numbers: Iterable[int]) -> bytes:
    column = array("I", list(numbers))
    if _BIG_ENDIAN:  # pragma: no cover - the format is little-endian everywhere
        column.byteswap()
    return column.tobytes()


def _column(body: bytes, at: int, count: int, first: int, last: int, what: str) -> array[int]:
    """``count + 1`` positions at ``at``, checked to run from ``first`` to ``last``
    without decreasing."""
    positions = array("I")
    positions.frombytes(body[at : at + 4 * (count + 1)])
    if _BIG_ENDIAN:  # pragma: no cover
        positions.byteswap()
    if positions[0] != first or positions[-1] != last:
        raise BadRequest(
            f"malformed payloads body: {what} positions must run from {first} to {last}"
        )
    # Never decreasing, checked in C: sorting a sorted array is one pass.
    if positions != array("I", sorted(positions)):
        raise BadRequest(f"malformed payloads body: {what} positions decrease")
    return positions


def read_frames(body: bytes) -> PayloadFrames:
    """The messages of a payloads body; :class:`BadRequest` naming what is wrong unless
    every part of it is exactly as the module docstring lays out."""
    if len(body) < POSITIONS_AT + 4:
        raise BadRequest("malformed payloads body: shorter than its head")
    magic, count, flags, write_pointer = _HEAD.unpack_from(body)
    if magic != MAGIC:
        raise BadRequest(f"malformed payloads body: it starts {magic!r}, not {MAGIC!r}")
    if flags & ~KEYS:
        raise BadRequest(f"payloads body flags {flags:#x}: only 1 (keys) is defined")
    if write_pointer < 0:
        raise BadRequest(f"a write pointer is positive (0 for none), got {write_pointer}")
    keyed = bool(flags & KEYS)
    first = POSITIONS_AT + 4 * (count + 1)
    if keyed:
        first += 4 * (count + 1) + (count + 3) // 4 * 4
    if first > len(body):
        raise BadRequest(f"malformed payloads body: {count} messages need {first} bytes")
    if not keyed:
        positions = _column(body, POSITIONS_AT, count, first, len(body), "payload")
        return PayloadFrames(body, positions, write_pointer or None)
    key_at = POSITIONS_AT + 4 * (count + 1)
    presence_at = key_at + 4 * (count + 1)
    # The payloads end where the keys begin: the first key position says where.
    payloads_end = int.from_bytes(body[key_at : key_at + 4], "little")
    positions = _column(body, POSITIONS_AT, count, first, payloads_end, "payload")
    key_positions = _column(body, key_at, count, payloads_end, len(body), "key")
    presence = body[presence_at : presence_at + count]
    if presence.translate(None, b"\x00\x01"):
        raise BadRequest("malformed payloads body: a key presence byte is neither 0 nor 1")
    if body[presence_at + count : first].strip(b"\x00"):
        raise BadRequest("malformed payloads body: the presence bytes' padding is not zero")
    if presence.count(0):
        # A message without a key has a key of length 0 there.
        lengths = map(sub, key_positions[1:], key_positions[:-1])
        if any(compress(lengths, map(not_, presence))):
            raise BadRequest("malformed payloads body: a message without a key has key bytes")
    return PayloadFrames(body, positions, write_pointer or None, key_positions, presence)
