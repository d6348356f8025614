"""The data directory of a durable transaction manager: recovery, rotation, cleanup.

Files (``<gen>`` is a 20-digit generation number)::

    LOCK                    flock'ed while a manager has the directory open
    snapshot-<gen>.snap     the state before the first record of wal-<gen>.log
    wal-<gen>.log           records appended since that snapshot

Recovery loads the newest snapshot, replays every log of its generation and later ones
(a torn last record is ignored, see ``log.py``), then writes a fresh snapshot of the
result under a new generation and starts a new log there. Only after that snapshot is
durable are the older files deleted, so a crash at any point of recovery or of
:meth:`TxStorage.finish_snapshot` leaves a directory that recovers to the same state.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
from pathlib import Path

from tidings.errors import ServerError, ServiceUnavailable
from tidings.tx.log import WriteAheadLog, fsync_dir, read_log
from tidings.tx.records import decode_record
from tidings.tx.snapshot import decode_state, encode_state, write_snapshot
from tidings.tx.state import StateImage, TxStateMachine

__all__ = ["TxStorage"]

log = logging.getLogger(__name__)

_NAME = re.compile(r"^(wal|snapshot)-(\d{20})\.(log|snap)$")


class TxStorage:
    """Owns the data directory: the lock, the open log, snapshots and old-file cleanup."""

    def __init__(self, data_dir: Path, *, sync: bool = True, history_size: int = 100_000) -> None:
        self.dir = data_dir
        self._sync = sync
        self._history_size = history_size
        self._lock_fd: int | None = None
        self._wal: WriteAheadLog | None = None
        self.generation = 0

    @property
    def wal(self) -> WriteAheadLog:
        if self._wal is None:
            raise ServiceUnavailable("the transaction log is not open")
        return self._wal

    def open(self) -> TxStateMachine:
        """Lock the directory and recover the state; the log is open afterwards."""
        self.dir.mkdir(parents=True, exist_ok=True)
        self._lock()
        try:
            state = self._recover()
            self.generation = self._last_generation() + 1
            self._write_snapshot(self.generation, state.export())
            self._wal = WriteAheadLog(self._path("wal", self.generation), sync=self._sync)
            self._remove_before(self.generation)
            return state
        except BaseException:
            self.close()
            raise

    def new_log(self) -> tuple[int, Path]:
        """Create the next generation's (empty) log file, ready for ``wal.rotate``."""
        generation = self.generation + 1
        path = self._path("wal", generation)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # left by a rotation that failed half-way
        WriteAheadLog.create_file(path)
        return generation, path

    def rotated(self, generation: int) -> None:
        """Note that the log now appends to ``generation``'s file."""
        self.generation = generation

    def finish_snapshot(self, generation: int, image: StateImage) -> None:
        """Write the snapshot for ``generation`` and delete what it makes obsolete."""
        self._write_snapshot(generation, image)
        self._remove_before(generation)

    def close(self) -> None:
        if self._wal is not None:
            try:
                self._wal.close()
            finally:
                self._wal = None
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = None

    # -- internals -----------------------------------------------------------------------

    def _lock(self) -> None:
        fd = os.open(self.dir / "LOCK", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise ServiceUnavailable(
                f"{self.dir} is in use by another transaction manager"
            ) from None
        self._lock_fd = fd

    def _files(self, kind: str) -> dict[int, Path]:
        found = {}
        for path in self.dir.iterdir():
            match = _NAME.match(path.name)
            if match and match.group(1) == kind:
                found[int(match.group(2))] = path
        return found

    def _path(self, kind: str, generation: int) -> Path:
        suffix = "log" if kind == "wal" else "snap"
        return self.dir / f"{kind}-{generation:020d}.{suffix}"

    def _last_generation(self) -> int:
        return max([0, *self._files("wal"), *self._files("snapshot")])

    def _recover(self) -> TxStateMachine:
        for tmp in self.dir.glob("*.tmp"):
            tmp.unlink()
        snapshots = self._files("snapshot")
        base = max(snapshots, default=0)
        if snapshots:
            image = decode_state(snapshots[base].read_bytes())
            state = TxStateMachine.from_image(image, self._history_size)
        else:
            state = TxStateMachine(self._history_size)
        logs = sorted((g, p) for g, p in self._files("wal").items() if g >= base)
        if logs and (not snapshots or [g for g, _ in logs] != list(range(base, base + len(logs)))):
            # Every generation's log starts where a snapshot or the previous log ended;
            # a gap means files were removed by hand, and replaying would invent a state.
            raise ServerError(
                f"{self.dir}: transaction log files do not follow snapshot {base} "
                f"without gaps ({[g for g, _ in logs]}); refusing to guess"
            )
        replayed = 0
        for _, path in logs:
            for payload in read_log(path):
                state.apply(decode_record(payload))
                replayed += 1
        # The fresh snapshot written after recovery keeps these invalidations.
        unlogged = state.invalidate_unlogged()
        log.info(
            "transaction state recovered from %s (snapshot %d, %d log records, "
            "%d reserved pointers invalidated): "
            "%d in progress, %d invalid, last write pointer %d",
            self.dir,
            base,
            replayed,
            len(unlogged),
            len(state.in_progress),
            len(state.invalid),
            state.last_write_pointer,
        )
        return state

    def _write_snapshot(self, generation: int, image: StateImage) -> None:
        write_snapshot(self._path("snapshot", generation), encode_state(image))

    def _remove_before(self, generation: int) -> None:
        removed = False
        for kind in ("wal", "snapshot"):
            for gen, path in self._files(kind).items():
                if gen < generation:
                    path.unlink()
                    removed = True
        if removed:
            fsync_dir(self.dir)
