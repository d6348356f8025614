"""The data directory of a durable transaction manager: recovery, rotation, cleanup.

Files (``<gen>`` is a 20-digit generation number)::

    LOCK                    flock'ed while a manager has the directory open
    TAIL-IN-STORE           present while store writes may carry records the files lack
    snapshot-<gen>.snap     the state before the first record of wal-<gen>.log
    wal-<gen>.log           records appended since that snapshot

Recovery loads the newest snapshot, replays every log of its generation and later ones
(a torn last record is ignored, see ``log.py``), each followed by the records a store
write carried past the file's last intact one (where a store is attached: see
``log.py``, "The tail carried by a store write"), then writes a fresh snapshot of the
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
from tidings.store.backend import Store, WriteView
from tidings.tx.log import TAIL_PREFIX, WriteAheadLog, fsync_dir, read_log, tail_index, tail_key
from tidings.tx.records import decode_record
from tidings.tx.snapshot import decode_state, encode_state, write_snapshot
from tidings.tx.state import StateImage, TxStateMachine

__all__ = ["TxStorage"]

log = logging.getLogger(__name__)

_NAME = re.compile(r"^(wal|snapshot)-(\d{20})\.(log|snap)$")
#: Present while the log's tail may be in the attached store rather than in the files.
TAIL_MARKER = "TAIL-IN-STORE"
_TX_TABLE = "tx"


class TxStorage:
    """Owns the data directory: the lock, the open log, snapshots and old-file cleanup."""

    def __init__(
        self,
        data_dir: Path,
        *,
        sync: bool = True,
        history_size: int = 100_000,
        store: Store | None = None,
    ) -> None:
        self.dir = data_dir
        #: The store whose writes may carry the log's tail (``WriteAheadLog.append_carried``).
        self.store = store
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
            marker = self.dir / TAIL_MARKER
            if self.store is None and marker.exists():
                # The last run crashed with records only a store write holds: recovering
                # without them would lose acknowledged commits.
                raise ServerError(
                    f"{self.dir}: the transaction log's last records may be in the message "
                    "store (the last run ran both services and did not stop cleanly); "
                    "start once with both services (role `all`) to recover them"
                )
            state = self._recover()
            self.generation = self._last_generation() + 1
            self._write_snapshot(self.generation, state.export())
            self._wal = WriteAheadLog(
                self._path("wal", self.generation), sync=self._sync, generation=self.generation
            )
            self._remove_before(self.generation)
            if self.store is not None:
                if not marker.exists():
                    marker.touch()
                    fsync_dir(self.dir)
                self._drop_tails(self.generation)
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
        self.wal.generation = generation

    def finish_snapshot(self, generation: int, image: StateImage) -> None:
        """Write the snapshot for ``generation`` and delete what it makes obsolete."""
        self._write_snapshot(generation, image)
        self._remove_before(generation)
        if self.store is not None:
            self._drop_tails(generation)

    def close(self) -> None:
        if self._wal is not None:
            try:
                self._wal.close()
                if self.store is not None and not self._wal.failed:
                    # The file holds every record now: a restart needs no store.
                    with contextlib.suppress(FileNotFoundError):
                        (self.dir / TAIL_MARKER).unlink()
                        fsync_dir(self.dir)
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
        replayed = carried = 0
        for generation, path in logs:
            count = 0
            for payload in read_log(path):
                state.apply(decode_record(payload))
                count += 1
            # Then what store writes carried past the file's end (a crash before the
            # file caught up): they follow its last intact record.
            for payload in self._carried(generation, count):
                state.apply(decode_record(payload))
                carried += 1
            replayed += count
        # The fresh snapshot written after recovery keeps these invalidations.
        unlogged = state.invalidate_unlogged()
        log.info(
            "transaction state recovered from %s (snapshot %d, %d log records and %d "
            "from the store, %d reserved pointers invalidated): "
            "%d in progress, %d invalid, last write pointer %d",
            self.dir,
            base,
            replayed,
            carried,
            len(unlogged),
            len(state.in_progress),
            len(state.invalid),
            state.last_write_pointer,
        )
        return state

    def _carried(self, generation: int, after: int) -> list[bytes]:
        """The records of ``generation``'s log after its ``after``-th that store writes
        carried, in order, up to the first missing one."""
        if self.store is None:
            return []
        found: list[bytes] = []
        with self.store.read() as view:
            for key, payload in view.scan(
                _TX_TABLE, tail_key(generation, after + 1), tail_key(generation + 1, 0)
            ):
                index = tail_index(key)[1]
                if index != after + len(found) + 1:
                    # A carried write holds every record after what was durable when it
                    # was made, so a gap means the file lost a record it had made
                    # durable: damage, not a crash (or, with sync off, an OS crash that
                    # took what was not flushed, which that setting accepts). Replaying
                    # past a gap would invent a state; going on without the records
                    # after it would lose acknowledged commits for good, since recovery
                    # then deletes the files and the carried records.
                    if self._sync:
                        raise ServerError(
                            f"{self.dir}: log {generation} holds {after} intact records, "
                            f"but the store carries records of it from {index} on; record "
                            f"{after + len(found) + 1} is damaged or missing, and the "
                            "acknowledged records after it cannot be replayed without it. "
                            "Refusing to start; the files and the store are left as they are"
                        )
                    log.warning("%s: carried records of log %d stop at a gap", self.dir, generation)
                    break
                found.append(bytes(payload))
        return found

    def _drop_tails(self, generation: int) -> None:
        # The records carried for logs before ``generation``: its snapshot covers them.
        def drop(view: WriteView) -> None:
            view.delete_range(_TX_TABLE, TAIL_PREFIX, tail_key(generation, 0))

        assert self.store is not None
        if self.store.scan_list(_TX_TABLE, TAIL_PREFIX, tail_key(generation, 0), limit=1):
            self.store.apply(drop)

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
