"""The write-ahead log: framed, checksummed records, appended with group commit.

File layout::

    header  b"TDTXLOG" | version (1 byte)
    frame   length I | crc32(payload) I | payload      (repeated, big-endian)

Group commit: callers append records under the manager's lock (so log order is apply
order) and then call :meth:`WriteAheadLog.sync` with the sequence number of their last
record. The first caller to find no flush running becomes the leader: it writes every
pending frame with one ``write`` and one ``fdatasync`` while the others wait, and all whose
records it covered return together. Followers that arrived during that flush form the
next batch, so the batch size grows with the load and no timer is needed.

Callers that must not block (the server's event loop) use :meth:`WriteAheadLog.sync_future`
instead: a future that resolves once the records up to a sequence number are on disk. A
flusher thread, started with the first such call, flushes for them and resolves their
futures (outside the lock), sharing the same batches with the blocking callers: whichever
thread flushes, everyone its flush covers is answered.

Files are preallocated in chunks (``posix_fallocate``) and written at an explicit offset:
on ext4 an ``fdatasync`` that need not also record a new file size is about half the
price of one after a plain append (measured here: ~130 us against ~250 us). The
preallocated tail reads as zeros, which no frame can be (a record is never empty).

A flush that fails leaves the log *failed*: the records may or may not be on disk, the
in-memory state has already moved, so the only safe answer to this and every later
call is an error (fail-stop; see docs/transactions.md).

**The tail carried by a store write** (:meth:`WriteAheadLog.append_carried`). Where one
process runs both services, a one-request transaction's commit record is made durable
by the store write that holds its messages, not by a flush of this file: the records
not yet durable, up to and including the commit, are put into that write (``tx`` table,
:func:`tail_key`), and they count as durable once it commits (:meth:`carried`).
Until then the commit is *held*: no flush writes it (or anything after it) to the file,
because a commit record on disk whose messages were never written would commit them
absent. If that store write fails, :meth:`fail` stops the log, as a failed flush does.
Later flushes write the carried records to the file as usual, so the file alone is
complete again after the next flush; recovery (``durable.py``) replays the file and
then the carried records that follow its last intact one.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import logging
import os
import struct
import threading
import zlib
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path

from tidings.errors import LogFailed, ServerError

__all__ = ["HEADER", "TAIL_PREFIX", "WriteAheadLog", "frame", "fsync_dir", "read_log", "tail_key"]

log = logging.getLogger(__name__)

HEADER = b"TDTXLOG\x01"
_FRAME = struct.Struct(">II")
#: Larger frames are treated as garbage when reading (a torn length field).
MAX_FRAME = 1 << 30
#: Preallocation step of a log file.
CHUNK = 4 << 20
_UNBOUNDED = 1 << 62
#: Keys of records carried by store writes, in the store's ``tx`` table:
#: ``TAIL_PREFIX | generation (8) | index in that generation's file (8)``, from 1.
TAIL_PREFIX = b"txtail/"
_TAIL = struct.Struct(">QQ")


def tail_key(generation: int, index: int) -> bytes:
    """The ``tx`` table key of the ``index``-th record (from 1) of log ``generation``."""
    return TAIL_PREFIX + _TAIL.pack(generation, index)


def tail_index(key: bytes) -> tuple[int, int]:
    """``(generation, index)`` of a :func:`tail_key`."""
    generation, index = _TAIL.unpack(key[len(TAIL_PREFIX) :])
    return generation, index


def frame(payload: bytes) -> bytes:
    """``payload`` with its length and CRC32 in front."""
    return _FRAME.pack(len(payload), zlib.crc32(payload)) + payload


def read_log(path: Path) -> Iterator[bytes]:
    """Every intact record payload in ``path``, in order.

    Reading stops at the first frame that is short or fails its CRC: a crash while
    appending leaves a torn tail, and nothing after it was ever acknowledged (each
    batch is fsynced before anyone covered by it is answered).
    """
    data = path.read_bytes()
    if len(data) < len(HEADER):
        log.warning("%s: no complete header (crash while creating it); treated as empty", path)
        return
    if data[: len(HEADER)] != HEADER:
        raise ServerError(f"{path} is not a Tidings transaction log (bad header)")
    pos = len(HEADER)
    end = len(data)
    while pos < end:
        if pos + _FRAME.size > end:
            break
        size, crc = _FRAME.unpack_from(data, pos)
        start = pos + _FRAME.size
        if size == 0 or size > MAX_FRAME or start + size > end:
            break
        payload = data[start : start + size]
        if zlib.crc32(payload) != crc:
            break
        yield payload
        pos = start + size
    if pos < end and data.count(0, pos) != end - pos:
        log.warning(
            "%s: ignoring a torn tail of %d bytes at offset %d (crash mid-write)",
            path,
            end - pos,
            pos,
        )


def fsync_dir(path: Path) -> None:
    """Make a file creation, rename or removal in ``path`` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _create(path: Path) -> int:
    """A new log file holding only the header, durable including its directory entry."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        _write_all(fd, HEADER, 0)
        _preallocate(fd, CHUNK)
        os.fsync(fd)
        fsync_dir(path.parent)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _write_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view = view[written:]
        offset += written


def _preallocate(fd: int, size: int) -> int:
    """Make the file ``size`` bytes long (zeros) if the filesystem can; returns its size."""
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError:
        return _UNBOUNDED  # not supported here: the log grows as it is written, only slower
    return os.fstat(fd).st_size


class WriteAheadLog:
    """One open log file with group commit; :meth:`rotate` switches to a new file."""

    def __init__(self, path: Path, *, sync: bool = True, generation: int = 0) -> None:
        self.path = path
        #: The generation of the current file (its name's number), for carried keys.
        self.generation = generation
        self._sync = sync
        self._fd = _create(path)
        self._offset = len(HEADER)
        self._allocated = os.fstat(self._fd).st_size
        self._cond = threading.Condition(threading.Lock())
        #: Frames of the records after ``_written``, not yet handed to the file.
        self._pending: list[bytes] = []
        #: Payloads of the records after ``_durable``: what a store write may carry.
        self._unsynced: deque[bytes] = deque()
        self._appended = 0  # sequence number of the last appended record
        self._written = 0  # ... of the last record handed to the file
        self._file_durable = 0  # ... of the last record the file holds durably
        self._durable = 0  # ... below which every record is durable (file or store)
        self._file_base = 0  # sequence number of the record before the file's first
        #: First sequence numbers of held records (a heap): flushes stop before them.
        self._holds: list[int] = []
        self._flushing = False
        self._failed: BaseException | None = None
        self._closed = False
        #: sync_future() callers: (seq, tie-breaker, future), a heap by seq.
        self._waiters: list[tuple[int, int, Future[None]]] = []
        self._tickets = itertools.count()
        self._flusher: threading.Thread | None = None

    @staticmethod
    def create_file(path: Path) -> None:
        """Create an empty log file (header only) durably, ready for :meth:`rotate`."""
        os.close(_create(path))

    @property
    def durable(self) -> int:
        """Sequence number of the last record known durable (on disk, or carried by a
        committed store write), with every record before it."""
        return self._durable

    @property
    def tail(self) -> int:
        """Sequence number of the last appended record (a barrier for read-only calls)."""
        return self._appended

    @property
    def failed(self) -> bool:
        """The log stopped (a failed flush or carrying store write): the file may lack
        records that were acknowledged from a store write."""
        return self._failed is not None

    def append(self, payloads: list[bytes]) -> int:
        """Queue ``payloads`` (in order); returns the sequence number to :meth:`sync` on."""
        frames = [frame(p) for p in payloads]
        with self._cond:
            self._check()
            self._pending.extend(frames)
            self._unsynced.extend(payloads)
            self._appended += len(frames)
            return self._appended

    def append_carried(self, payloads: list[bytes]) -> tuple[int, list[tuple[bytes, bytes]]]:
        """Queue ``payloads`` held (no flush writes them until :meth:`carried` or
        :meth:`fail`), and return their last sequence number with the ``tx`` table
        items of every record not yet durable up to it: the caller puts those into a
        store write, and calls :meth:`carried` once that write has committed."""
        frames = [frame(p) for p in payloads]
        with self._cond:
            self._check()
            first = self._appended + 1
            self._pending.extend(frames)
            self._unsynced.extend(payloads)
            self._appended += len(frames)
            # Held in the same critical section as the append: a flush running now
            # must not take these frames to the file.
            heapq.heappush(self._holds, first)
            base, generation = self._file_base, self.generation
            items = [
                (tail_key(generation, seq - base), payload)
                for seq, payload in enumerate(self._unsynced, self._durable + 1)
            ]
            return self._appended, items

    def carried(self, first: int, seq: int) -> None:
        """The store write carrying the records up to ``seq`` (held from ``first``) has
        committed: they are durable, and flushes may write them to the file."""
        with self._cond:
            self._holds.remove(first)
            heapq.heapify(self._holds)
            self._advance_locked(seq)
            self._cond.notify_all()

    def fail(self, error: BaseException) -> None:
        """Stop the log (fail-stop): a held record's store write failed, so memory has
        moved where nothing durable followed. Every waiting and later call fails."""
        with self._cond:
            if self._failed is None:
                log.error("transaction log write failed; refusing further changes: %s", error)
                self._failed = error
            self._holds.clear()
            self._cond.notify_all()

    def sync(self, seq: int) -> None:
        """Return once every record up to ``seq`` is on disk (or raise :class:`LogFailed`)."""
        if self._durable >= seq and self._failed is None:
            return
        with self._cond:
            while self._durable < seq:
                self._check()
                if self._flushing or self._limit_locked() <= self._written:
                    # A flush is running, or what is left is held for a store write
                    # (whose commit notifies): either way, wait.
                    self._cond.wait()
                else:
                    self._flush_locked()
            self._check()

    def sync_future(self, seq: int) -> Future[None]:
        """:meth:`sync` without blocking: the future resolves once every record up to
        ``seq`` is on disk, or fails with :class:`LogFailed`. The flusher thread resolves
        it (never with the log's lock held), so its callbacks must not block."""
        future: Future[None] = Future()
        future.set_running_or_notify_cancel()  # a flush cannot be called off
        if self._durable >= seq and self._failed is None:
            future.set_result(None)
            return future
        with self._cond:
            try:
                self._check()
            except LogFailed as exc:
                future.set_exception(exc)
                return future
            if self._durable >= seq:
                future.set_result(None)
                return future
            heapq.heappush(self._waiters, (seq, next(self._tickets), future))
            if self._flusher is None:
                self._flusher = threading.Thread(
                    target=self._flush_for_waiters, name="tidings-tx-log-flusher", daemon=True
                )
                self._flusher.start()
            elif not self._flushing:
                self._cond.notify_all()
        return future

    def rotate(self, new_path: Path) -> None:
        """Flush everything to the current file, then append to ``new_path`` from now on.

        ``new_path`` must have been made with :meth:`create_file`. The caller holds the
        manager's lock, so no record is appended meanwhile; held records are waited for
        (the manager keeps new ones from being made while it rotates).
        """
        fd = os.open(new_path, os.O_WRONLY)
        with self._cond:
            while (self._flushing or self._holds) and self._failed is None:
                self._cond.wait()
            try:
                self._check()
                if self._written < self._appended:
                    self._flush_locked()
                self._check()
            except BaseException:
                os.close(fd)
                raise
            old, self._fd, self.path = self._fd, fd, new_path
            self._offset = len(HEADER)
            self._allocated = os.fstat(fd).st_size
            self._file_base = self._appended
        os.close(old)

    def close(self) -> None:
        """Flush what is pending and close the file; idempotent."""
        with self._cond:
            while (self._flushing or self._holds) and self._failed is None:
                self._cond.wait()
            if self._closed:
                return
            try:
                if self._failed is None and self._written < self._appended:
                    self._flush_locked()
            finally:
                self._closed = True
                self._cond.notify_all()
                with contextlib.suppress(OSError):
                    os.close(self._fd)
                flusher = self._flusher
        # The flusher answers the futures the last flush covered (and fails any other).
        if flusher is not None and flusher is not threading.current_thread():
            flusher.join()

    def _check(self) -> None:
        if self._failed is not None:
            raise LogFailed(f"transaction log write failed: {self._failed}")
        if self._closed:
            raise LogFailed("transaction log is closed")

    def _limit_locked(self) -> int:
        # The last record a flush may write now: everything before the first held one.
        return self._holds[0] - 1 if self._holds else self._appended

    def _advance_locked(self, seq: int) -> None:
        # Every record up to ``seq`` is durable: no store write needs to carry it.
        if seq > self._durable:
            for _ in range(min(seq - self._durable, len(self._unsynced))):
                self._unsynced.popleft()
            self._durable = seq

    def _flush_for_waiters(self) -> None:
        """The flusher thread: flush while futures wait, resolve those a flush covered."""
        while True:
            with self._cond:
                while True:
                    durable = self._durable
                    ready = self._take_ready_locked()
                    if ready:
                        break
                    if self._failed is not None or self._closed:
                        self._flusher = None
                        return
                    if (
                        self._waiters
                        and not self._flushing
                        and self._limit_locked() > self._written
                    ):
                        with contextlib.suppress(LogFailed):  # its waiters fail next round
                            self._flush_locked()
                        continue
                    self._cond.wait()
                error = self._failed
                closed = self._closed
            for seq, future in ready:
                if seq <= durable:
                    future.set_result(None)
                elif error is not None:
                    future.set_exception(LogFailed(f"transaction log write failed: {error}"))
                else:
                    assert closed
                    future.set_exception(LogFailed("transaction log is closed"))

    def _take_ready_locked(self) -> list[tuple[int, Future[None]]]:
        # The waiters a flush has covered; all of them once the log failed or closed.
        waiters = self._waiters
        ready: list[tuple[int, Future[None]]] = []
        if self._failed is not None or self._closed:
            ready = [(seq, future) for seq, _, future in waiters]
            waiters.clear()
            return ready
        while waiters and waiters[0][0] <= self._durable:
            seq, _, future = heapq.heappop(waiters)
            ready.append((seq, future))
        return ready

    def _flush_locked(self) -> None:
        # Called with the condition held, no flush running and something to write
        # (``_limit_locked() > _written``); releases it for the I/O. Held records and
        # those after them stay pending.
        self._flushing = True
        target = self._limit_locked()
        count = target - self._written
        batch = b"".join(self._pending[:count])
        del self._pending[:count]
        self._written = target
        fd, offset = self._fd, self._offset
        self._offset += len(batch)
        self._cond.release()
        try:
            if offset + len(batch) > self._allocated:
                wanted = offset + len(batch) + CHUNK
                self._allocated = _preallocate(fd, wanted - wanted % CHUNK)
            _write_all(fd, batch, offset)
            if self._sync:
                os.fdatasync(fd)
        except BaseException as exc:
            self._cond.acquire()
            self._failed = exc
            self._flushing = False
            self._cond.notify_all()
            log.error("transaction log write failed; refusing further changes: %s", exc)
            raise LogFailed(f"transaction log write failed: {exc}") from exc
        self._cond.acquire()
        self._file_durable = target
        self._advance_locked(target)
        self._flushing = False
        self._cond.notify_all()
