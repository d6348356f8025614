"""The transaction log's records: one per state change, and their binary form.

Records describe *what happened*, never what was asked: a begin carries the write
pointer and absolute expiry it was given, a commit its commit pointer, a register the
epoch it produced. Replaying them through :meth:`TxStateMachine.apply` is therefore
deterministic and needs no clock, which is what makes recovery exact.

Payload layout (big-endian; framing and CRC live in ``log.py``)::

    BEGIN       1 | wp q | expiry_ms q | producer_id Q (0: none) | epoch Q
    COMMIT      2 | wp q | commit_ptr q | n I | n x (len I | key)
    ABORT       3 | wp q
    INVALIDATE  4 | wp q | reason B
    PRUNE       5 | n I | n x wp q
    REGISTER    6 | producer_id Q | epoch Q | transactional id (UTF-8, rest)
    RESERVE     7 | start q | upto q
    RELEASE     8 | upto q
"""

from __future__ import annotations

import enum
import struct
from typing import NamedTuple

__all__ = [
    "Abort",
    "Begin",
    "Commit",
    "CorruptRecord",
    "Invalidate",
    "Outcome",
    "Prune",
    "Record",
    "Register",
    "Release",
    "Reserve",
    "decode_record",
    "encode_record",
]


class Outcome(enum.IntEnum):
    """How a transaction ended; kept in the bounded history to answer late calls."""

    COMMITTED = 1
    ABORTED = 2
    #: Explicitly invalidated (``invalidate``).
    INVALIDATED = 3
    #: Its timeout passed while in progress (sweeper, or a late commit noticed it).
    TIMED_OUT = 4
    #: Left in progress by a producer whose transactional id was registered again.
    FENCED = 5
    #: Its pointer was reserved, but no record of it reached the log before the
    #: service stopped: it may have been handed out by a begin whose record was lost,
    #: so recovery invalidates it (see ``Reserve``).
    UNLOGGED = 6


class Begin(NamedTuple):
    write_pointer: int
    expiry_ms: int
    producer_id: int = 0
    epoch: int = 0


class Commit(NamedTuple):
    write_pointer: int
    commit_pointer: int
    changes: tuple[bytes, ...] = ()


class Abort(NamedTuple):
    write_pointer: int


class Invalidate(NamedTuple):
    write_pointer: int
    reason: Outcome


class Prune(NamedTuple):
    ids: tuple[int, ...]


class Register(NamedTuple):
    transactional_id: str
    producer_id: int
    epoch: int


class Reserve(NamedTuple):
    """Pointers ``start..upto`` may be handed out before their begin is durable.

    ``start`` is one above the previous reservation's end when this one extends it.
    Recovery invalidates every reserved pointer above the last one the log names:
    whichever of them a begin handed out, its data stays hidden, and none is handed
    out again.
    """

    start: int
    upto: int


class Release(NamedTuple):
    """The reservation ends at ``upto``, the last pointer handed out (a clean stop:
    every begin's record is in the log, so recovery has nothing to invalidate)."""

    upto: int


Record = Begin | Commit | Abort | Invalidate | Prune | Register | Reserve | Release


class CorruptRecord(ValueError):
    """A log record passed its CRC but cannot be parsed (a bug or a format mismatch)."""


_BEGIN = struct.Struct(">BqqQQ")
_COMMIT = struct.Struct(">BqqI")
_ABORT = struct.Struct(">Bq")
_INVALIDATE = struct.Struct(">BqB")
_COUNT = struct.Struct(">BI")
_LEN = struct.Struct(">I")
_REGISTER = struct.Struct(">BQQ")
_RESERVE = struct.Struct(">Bqq")
_RELEASE = struct.Struct(">Bq")

_INVALID_REASONS = frozenset({Outcome.INVALIDATED, Outcome.TIMED_OUT, Outcome.FENCED})


def encode_record(record: Record) -> bytes:
    """The payload bytes of ``record`` (without framing)."""
    if isinstance(record, Begin):
        return _BEGIN.pack(1, *record)
    if isinstance(record, Commit):
        parts = [_COMMIT.pack(2, record.write_pointer, record.commit_pointer, len(record.changes))]
        for key in record.changes:
            parts.append(_LEN.pack(len(key)))
            parts.append(key)
        return b"".join(parts)
    if isinstance(record, Abort):
        return _ABORT.pack(3, record.write_pointer)
    if isinstance(record, Invalidate):
        return _INVALIDATE.pack(4, record.write_pointer, record.reason)
    if isinstance(record, Prune):
        return _COUNT.pack(5, len(record.ids)) + struct.pack(f">{len(record.ids)}q", *record.ids)
    if isinstance(record, Reserve):
        return _RESERVE.pack(7, *record)
    if isinstance(record, Release):
        return _RELEASE.pack(8, record.upto)
    return _REGISTER.pack(6, record.producer_id, record.epoch) + record.transactional_id.encode()


def decode_record(payload: bytes) -> Record:
    """Parse a payload written by :func:`encode_record`; :class:`CorruptRecord` if not one."""
    try:
        return _decode(payload)
    except (struct.error, ValueError, IndexError) as exc:
        raise CorruptRecord(f"unreadable transaction log record: {exc}") from None


def _decode(payload: bytes) -> Record:
    kind = payload[0]
    if kind == 1:
        _, wp, expiry, pid, epoch = _exact(_BEGIN, payload)
        return Begin(wp, expiry, pid, epoch)
    if kind == 2:
        _, wp, commit_ptr, n = _COMMIT.unpack_from(payload)
        pos = _COMMIT.size
        keys = []
        for _ in range(n):
            (size,) = _LEN.unpack_from(payload, pos)
            pos += _LEN.size
            if pos + size > len(payload):
                raise ValueError("change key runs past the record")
            keys.append(payload[pos : pos + size])
            pos += size
        if pos != len(payload):
            raise ValueError("trailing bytes after the change keys")
        return Commit(wp, commit_ptr, tuple(keys))
    if kind == 3:
        return Abort(_exact(_ABORT, payload)[1])
    if kind == 4:
        _, wp, reason = _exact(_INVALIDATE, payload)
        if reason not in _INVALID_REASONS:
            raise ValueError(f"invalidation reason {reason}")
        return Invalidate(wp, Outcome(reason))
    if kind == 5:
        _, n = _COUNT.unpack_from(payload)
        if len(payload) != _COUNT.size + 8 * n:
            raise ValueError("prune record length does not match its count")
        return Prune(struct.unpack_from(f">{n}q", payload, _COUNT.size))
    if kind == 6:
        _, pid, epoch = _REGISTER.unpack_from(payload)
        return Register(payload[_REGISTER.size :].decode(), pid, epoch)
    if kind == 7:
        _, start, upto = _exact(_RESERVE, payload)
        if start > upto:
            raise ValueError(f"reservation {start}..{upto} is empty")
        return Reserve(start, upto)
    if kind == 8:
        return Release(_exact(_RELEASE, payload)[1])
    raise ValueError(f"unknown record type {kind}")


def _exact(shape: struct.Struct, payload: bytes) -> tuple[int, ...]:
    if len(payload) != shape.size:
        raise ValueError(f"record of {len(payload)} bytes, expected {shape.size}")
    return shape.unpack(payload)
