"""Snapshots of the transaction state: binary form and atomic files.

A snapshot ``snapshot-<gen>.snap`` holds the state *before* the first record of
``wal-<gen>.log``; recovery loads the newest snapshot and replays the logs of that
generation and later ones. Files are written to a temporary name, fsynced and renamed,
so a snapshot on disk is always whole; the CRC at its end catches any other damage.

Layout (big-endian)::

    b"TDTXSNP" | version 3
    last_write_pointer q | read_pointer q | next_producer_id Q
    reserved_from q | reserved q                                           (not in version 1)
    epoch_floor Q                                                (not in versions 1 and 2)
    n I | n x (write_pointer q | expiry_ms q | producer_id Q | epoch Q)   in progress
    n I | n x write_pointer q                                              invalid
    n I | n x write_pointer q | n x outcome B                              history
    n I | n x (commit_pointer q | k I | k x (len I | key))                 change sets
    n I | n x (producer_id Q | epoch Q | len H | transactional id)         producers
    crc32 of everything before it I
"""

from __future__ import annotations

import os
import struct
import zlib
from pathlib import Path

from tidings.errors import CorruptSnapshot
from tidings.structs import ProducerInfo
from tidings.tx.log import fsync_dir
from tidings.tx.records import Outcome
from tidings.tx.state import InProgress, StateImage

__all__ = ["decode_state", "encode_state", "write_snapshot"]

MAGIC = b"TDTXSNP\x03"
#: Version 1 (before reservations) is still read: it reserved nothing.
_MAGIC_V1 = b"TDTXSNP\x01"
#: Version 2 (before the epoch floor) is still read: no transactional id was forgotten
#: with it (it is 0), or those forgotten come back with the log (which names them).
_MAGIC_V2 = b"TDTXSNP\x02"
_HEAD = struct.Struct(">qqQ")
_RESERVED = struct.Struct(">qq")
_COUNT = struct.Struct(">I")
_IN_PROGRESS = struct.Struct(">qqQQ")
_CHANGE_SET = struct.Struct(">qI")
_PRODUCER = struct.Struct(">QQH")
_FLOOR = struct.Struct(">Q")


def encode_state(image: StateImage) -> bytes:
    out = bytearray(MAGIC)
    out += _HEAD.pack(image.last_write_pointer, image.read_pointer, image.next_producer_id)
    out += _RESERVED.pack(image.reserved_from, image.reserved)
    out += _FLOOR.pack(image.epoch_floor)
    out += _COUNT.pack(len(image.in_progress))
    for wp, tx in image.in_progress:
        out += _IN_PROGRESS.pack(wp, tx.expiry_ms, tx.producer_id, tx.epoch)
    out += _COUNT.pack(len(image.invalid))
    out += struct.pack(f">{len(image.invalid)}q", *image.invalid)
    out += _COUNT.pack(len(image.history))
    out += struct.pack(f">{len(image.history)}q", *image.history)
    out += image.history_outcomes
    out += _COUNT.pack(len(image.change_sets))
    for commit_pointer, keys in image.change_sets:
        out += _CHANGE_SET.pack(commit_pointer, len(keys))
        for key in keys:
            out += _COUNT.pack(len(key))
            out += key
    out += _COUNT.pack(len(image.producers))
    for info in image.producers:
        tid = info.transactional_id.encode()
        out += _PRODUCER.pack(info.producer_id, info.epoch, len(tid))
        out += tid
    out += _COUNT.pack(zlib.crc32(out))
    return bytes(out)


def decode_state(data: bytes) -> StateImage:
    """Parse :func:`encode_state`'s output; :class:`CorruptSnapshot` on any damage."""
    magic = data[: len(MAGIC)]
    if len(data) < len(MAGIC) + _COUNT.size or magic not in (MAGIC, _MAGIC_V2, _MAGIC_V1):
        raise CorruptSnapshot("not a Tidings transaction snapshot (bad header)")
    body, (crc,) = data[:-4], _COUNT.unpack(data[-4:])
    if zlib.crc32(body) != crc:
        raise CorruptSnapshot("transaction snapshot fails its checksum")
    try:
        return _Reader(body, len(MAGIC)).image(
            reservations=magic != _MAGIC_V1, floor=magic == MAGIC
        )
    except (struct.error, ValueError) as exc:
        raise CorruptSnapshot(f"transaction snapshot cannot be parsed: {exc}") from None


class _Reader:
    def __init__(self, data: bytes, pos: int) -> None:
        self.data = data
        self.pos = pos

    def take(self, shape: struct.Struct) -> tuple[int, ...]:
        values = shape.unpack_from(self.data, self.pos)
        self.pos += shape.size
        return values

    def count(self) -> int:
        return self.take(_COUNT)[0]

    def ints(self, n: int) -> tuple[int, ...]:
        shape = struct.Struct(f">{n}q")
        return self.take(shape)

    def raw(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise ValueError("field runs past the end")
        value = self.data[self.pos : self.pos + n]
        self.pos += n
        return value

    def image(self, *, reservations: bool, floor: bool) -> StateImage:
        last, read, next_pid = self.take(_HEAD)
        reserved_from, reserved = self.take(_RESERVED) if reservations else (1, 0)
        (epoch_floor,) = self.take(_FLOOR) if floor else (0,)
        in_progress = []
        for _ in range(self.count()):
            wp, expiry, pid, epoch = self.take(_IN_PROGRESS)
            in_progress.append((wp, InProgress(expiry, pid, epoch)))
        invalid = self.ints(self.count())
        n = self.count()
        history_ids = self.ints(n)
        outcomes = [Outcome(b) for b in self.raw(n)]
        change_sets = []
        for _ in range(self.count()):
            commit_pointer, k = self.take(_CHANGE_SET)
            change_sets.append((commit_pointer, tuple(self.raw(self.count()) for _ in range(k))))
        producers = []
        for _ in range(self.count()):
            pid, epoch, size = self.take(_PRODUCER)
            producers.append(ProducerInfo(self.raw(size).decode(), pid, epoch))
        if self.pos != len(self.data):
            raise ValueError("trailing bytes")
        return StateImage(
            last_write_pointer=last,
            read_pointer=read,
            next_producer_id=next_pid,
            reserved_from=reserved_from,
            reserved=reserved,
            in_progress=tuple(in_progress),
            invalid=invalid,
            history=history_ids,
            history_outcomes=bytes(outcomes),
            change_sets=tuple(change_sets),
            producers=tuple(producers),
            epoch_floor=epoch_floor,
        )


def write_snapshot(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically and durably (temp file, fsync, rename)."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path.parent)
