"""The payloads request body (``application/vnd.tidings.payloads``): the plain payloads
of a publish or a store with their positions up front, for writers that send many.

An Avro ``PublishRequest`` has to be walked payload by payload (every length is a
varint), which was most of what the server spent on a batch of small messages after
its store write (BENCHMARKS.md, "A publish body of payloads and their positions").
This body gives every payload's position first, so the server checks the body with a
few loops that run in C and stores the payloads of a batch entry with one copy. It
carries payloads only: messages with keys, headers or a TTL are sent in Avro or JSON.

All integers are little-endian; ``n`` payloads::

    offset 0   b"TDP1"
           4   u32 n
           8   u32 flags: 0 (the bits are kept for columns to come, such as keys, as
               the columnar poll response has them; a body with any set is refused)
          12   i64 the transaction write pointer, 0 for none (write pointers are
               positive)
          20   positions: (n + 1) x u32, absolute in the body: payload i is
               body[positions[i]:positions[i + 1]]; positions[0] is 24 + 4n, the end
               of this column, and positions[n] the body's length
               the payloads, back to back

A publish or a store accepts it (docs/api.md); the server answers such a request in
JSON. Servers before this medium answer 415, and the clients then send Avro.
"""

from __future__ import annotations

import struct
import sys
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate

from tidings.errors import BadRequest

__all__ = [
    "CONTENT_TYPE",
    "POSITIONS_AT",
    "PayloadFrames",
    "names_frames",
    "read_frames",
    "write_frames",
]

CONTENT_TYPE = "application/vnd.tidings.payloads"
MAGIC = b"TDP1"
_HEAD = struct.Struct("<4sIIq")
#: Where the positions start: right after the fixed head.
POSITIONS_AT = _HEAD.size
_BIG_ENDIAN = sys.byteorder == "big"


@dataclass(frozen=True, slots=True)
class PayloadFrames:
    """A payloads body checked by :func:`read_frames`: the body itself and its
    payloads' ``n + 1`` positions in it, kept rather than cut into a bytes each."""

    body: bytes
    positions: array[int]
    write_pointer: int | None

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


def names_frames(content_type: str | None) -> bool:
    """Whether a Content-Type header names this medium (any case, any parameters)."""
    return (
        content_type is not None and content_type.partition(";")[0].strip().lower() == CONTENT_TYPE
    )


def write_frames(write_pointer: int | None, payloads: Sequence[bytes]) -> bytes:
    """The body of a publish or store of ``payloads`` (bytes each)."""
    count = len(payloads)
    first = POSITIONS_AT + 4 * (count + 1)
    positions = array("I", list(accumulate(map(len, payloads), initial=first)))
    if _BIG_ENDIAN:  # pragma: no cover - the format is little-endian everywhere
        positions.byteswap()
    head = _HEAD.pack(MAGIC, count, 0, write_pointer or 0)
    return b"".join((head, positions.tobytes(), *payloads))


def read_frames(body: bytes) -> PayloadFrames:
    """The payloads of a payloads body; :class:`BadRequest` naming what is wrong unless
    every part of it is exactly as the module docstring lays out."""
    if len(body) < POSITIONS_AT + 4:
        raise BadRequest("malformed payloads body: shorter than its head")
    magic, count, flags, write_pointer = _HEAD.unpack_from(body)
    if magic != MAGIC:
        raise BadRequest(f"malformed payloads body: it starts {magic!r}, not {MAGIC!r}")
    if flags:
        raise BadRequest(f"payloads body flags {flags:#x}: no flag is defined yet")
    if write_pointer < 0:
        raise BadRequest(f"a write pointer is positive (0 for none), got {write_pointer}")
    first = POSITIONS_AT + 4 * (count + 1)
    if first > len(body):
        raise BadRequest(f"malformed payloads body: {count} payloads need {first} bytes")
    positions = array("I")
    positions.frombytes(body[POSITIONS_AT:first])
    if _BIG_ENDIAN:  # pragma: no cover
        positions.byteswap()
    if positions[0] != first or positions[-1] != len(body):
        raise BadRequest(
            "malformed payloads body: positions must run from the end of their column "
            f"({first}) to the body's end ({len(body)})"
        )
    # Never decreasing, checked in C: sorting a sorted array is one pass.
    if positions != array("I", sorted(positions)):
        raise BadRequest("malformed payloads body: positions decrease")
    return PayloadFrames(body, positions, write_pointer or None)
