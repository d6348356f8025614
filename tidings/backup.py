"""``tidings backup``: a consistent copy of a running server's data directory.

The transaction log is copied before the store, so the store copy holds every message
of each transaction the copied log commits; what changed between the two copies is
then put right in the copy (docs/operations.md, "Backup and restore"). The command
line in :mod:`tidings.cli` only parses arguments and reports.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from tidings.errors import BackupFailed

if TYPE_CHECKING:
    from tidings.store.backend import WriteView
    from tidings.store.backends.lmdb import LmdbStore
    from tidings.tx.state import TxStateMachine

__all__ = ["BACKUP_WORK", "copy_data_dir"]

#: Where a backup is written before it is whole (a DEST holding it is not empty, so an
#: interrupted backup is not taken for one, nor written over by the next).
BACKUP_WORK = ".incomplete"


_TX_FILE = r"^(wal|snapshot)-(\d{20})\.(log|snap)$"


def copy_data_dir(store_dir: Path, tx_dir: Path, dest: Path) -> tuple[dict[int, int], int]:
    """Copy a server's ``store/`` and ``tx/`` into ``dest``, consistently while the
    server runs; returns the copied log generations (generation -> records) and how
    many log records written after the log was copied were left out. Raises
    :class:`~tidings.errors.BackupFailed` (or ``OSError``) with nothing left behind.

    Copy into DEST/.incomplete, then move tx/ and store/ into DEST: a copy cut short
    (no space, a kill) never leaves a store/ beside a tx/ that a server would start on
    as if whole. A failure the command sees removes what it wrote."""
    import shutil

    created = not dest.exists()
    dest.mkdir(parents=True, exist_ok=True)
    work = dest / BACKUP_WORK
    try:
        work.mkdir()
        logs, dropped = _copy_data(store_dir, tx_dir, work)
        # The store last: a DEST with its store/ in place holds the whole copy.
        for part in ("tx", "store"):
            if (work / part).exists():
                (work / part).rename(dest / part)
        work.rmdir()
        return logs, dropped
    except BaseException:
        for written in (work, dest / "tx", dest / "store"):
            shutil.rmtree(written, ignore_errors=True)
        if created:
            with contextlib.suppress(OSError):
                dest.rmdir()
        raise


def _copy_data(store_dir: Path, tx_dir: Path, dest: Path) -> tuple[dict[int, int], int]:
    import lmdb

    # The transaction files first, then the store: the store then holds every message
    # of each transaction the copied log commits. The other order could give a log
    # committing transactions whose messages the store copy lacks.
    has_store = (store_dir / "data.mdb").exists()
    positions: dict[bytes, bytes] = {}
    tail: dict[bytes, bytes] = {}
    if has_store and tx_dir.is_dir():
        positions, tail = _read_before_log(store_dir)
    logs = _copy_tx_files(tx_dir, dest / "tx") if tx_dir.is_dir() else {}
    copied = dest / "store"
    if has_store:
        copied.mkdir()
        try:
            env = lmdb.open(str(store_dir), readonly=True, lock=True, max_dbs=16)
            try:
                env.copy(str(copied), compact=True)
            finally:
                env.close()
        except lmdb.Error as exc:
            raise BackupFailed(f"cannot copy the store {store_dir}: {exc}") from None
        _carry_again(copied, tail)
        dropped = _trim_carried(copied, logs)
        if logs:
            _fence_unknown_pointers(copied, dest / "tx", positions)
        return logs, dropped
    return logs, 0


def _read_before_log(store_dir: Path) -> tuple[dict[bytes, bytes], dict[bytes, bytes]]:
    """Every group position record and every log record the store carries, read from
    the live store before the log is copied."""
    from tidings.codec import groups
    from tidings.store.backends.lmdb import LmdbStore
    from tidings.tx.log import TAIL_PREFIX

    store = LmdbStore(store_dir, readonly=True)
    try:
        with store.read() as view:
            prefix = groups.POSITION_PREFIX
            scan = view.scan("metadata", prefix, prefix + b"\xff")
            positions = {bytes(k): bytes(v) for k, v in scan}
            scan = view.scan("tx", TAIL_PREFIX, TAIL_PREFIX[:-1] + b"0")
            tail = {bytes(k): bytes(v) for k, v in scan}
        return positions, tail
    finally:
        store.close()


def _carry_again(store_dir: Path, tail: Mapping[bytes, bytes]) -> None:
    """Put back into the store copy the carried log records it lost.

    A commit acknowledged before the backup began may be durable only as a record the
    store carries, the log file getting it at a later flush, after the file was
    copied. If the log then started a new generation before the store was copied, the
    live store dropped that generation's carried records (the new snapshot covers
    them), and neither copy held the commit. Read before the file was copied, they
    precede the store copy, which therefore holds everything they commit."""
    from tidings.store.backends.lmdb import LmdbStore

    if not tail:
        return
    store = LmdbStore(store_dir)
    try:

        def put(view: WriteView) -> None:
            for key, payload in tail.items():
                if view.get("tx", key) is None:
                    view.put("tx", key, payload)

        store.apply(put)
    finally:
        store.close()


def _fence_unknown_pointers(
    store_dir: Path, tx_dir: Path, positions_before: Mapping[bytes, bytes]
) -> None:
    """Recover the copied log against the copied store, and keep hidden for good every
    write pointer the store's entries carry that the log does not know.

    Transactions that began while the store was being copied left entries (messages,
    group positions, queue acks) the copied log cannot name; recovery invalidates only
    the pointers reserved when the log was copied. Unnamed, a pointer would be handed
    out again after the restore, and its old entries would show when the new
    transaction commits (a part of a transaction, or one the copied log never
    committed); a group position or queue ack under it would count as committed at
    once. Each such pointer is written to the copied log as begun and invalidated, so
    the restored server hides its entries and hands out pointers above it. (Not one
    reservation up to the highest: pointers follow the clock after a restart, and the
    restored server's recovery would invalidate every pointer of that stretch, one by
    one.)

    Transactions the copied log has in progress are invalidated too: they may have
    published after the log was copied, and the copy would show only their first part
    if they committed on the restored server.

    A group position record the copied log counts may be gone from the store copy: a
    newer one replaced it while the store was being copied, under a pointer the log
    does not know. Each partition left without a record that counts gets back its
    newest record that counted in ``positions_before`` (read before the log was
    copied, so its transaction is one the copied log committed): the position the
    group had when the backup began, not none.
    """
    from tidings.codec import groups, queues
    from tidings.codec.values import read_write_pointer
    from tidings.store.backends.lmdb import LmdbStore
    from tidings.tx.durable import TxStorage
    from tidings.tx.records import Begin, Invalidate, Outcome, encode_record

    store = LmdbStore(store_dir)
    try:
        storage = TxStorage(tx_dir, store=store)
        state = storage.open()
        try:
            known = state.last_write_pointer
            unknown: set[int] = set()
            with store.read() as view:
                for _key, value in view.scan("messages", b"", b"\xff" * 64):
                    wp = read_write_pointer(bytes(value[:9]))
                    if wp is not None and abs(wp) > known:
                        unknown.add(abs(wp))
                prefix = groups.POSITION_PREFIX
                for key, _value in view.scan("metadata", prefix, prefix + b"\xff"):
                    wp = abs(groups.write_pointer_of(bytes(key))[1])
                    if wp > known:
                        unknown.add(wp)
                prefix = queues.LEASE_PREFIX
                for _key, value in view.scan("metadata", prefix, prefix + b"\xff"):
                    wp = abs(queues.decode_lease(bytes(value)).write_pointer)
                    if wp > known:
                        unknown.add(wp)
            _restore_replaced_positions(store, state, positions_before)
            # Open when the log was copied: what they published after it is not in the
            # copy, so a commit sent to the restored server would show a part of one.
            records = [
                encode_record(Invalidate(wp, Outcome.INVALIDATED)) for wp in state.in_progress
            ]
            # In pointer order, as the log's begins always are.
            records += [
                encode_record(record)
                for wp in sorted(unknown)
                for record in (Begin(wp, 0), Invalidate(wp, Outcome.INVALIDATED))
            ]
            if records:
                storage.wal.sync(storage.wal.append(records))
        finally:
            storage.close()
    finally:
        store.close()


def _restore_replaced_positions(
    store: LmdbStore, state: TxStateMachine, positions_before: Mapping[bytes, bytes]
) -> None:
    from tidings.codec import groups

    def counts(key: bytes) -> bool:
        wp = groups.write_pointer_of(key)[1]
        # 0: set by a reset, outside any transaction.
        return wp == 0 or (
            wp <= state.read_pointer and wp not in state.invalid and wp not in state.in_progress
        )

    def partition(key: bytes) -> bytes:
        return key[:-8]  # a position key ends with its 8-byte write pointer

    prefix = groups.POSITION_PREFIX
    with store.read() as view:
        now = [bytes(k) for k, _ in view.scan("metadata", prefix, prefix + b"\xff")]
    settled = {partition(k) for k in now if counts(k)}
    # Only partitions that still have records: a group or topic deleted meanwhile has
    # none, and stays deleted.
    replaced = {partition(k) for k in now} - settled
    back: dict[bytes, bytes] = {}
    for key in sorted(positions_before):  # a partition's newest record last
        if partition(key) in replaced and counts(key):
            back[partition(key)] = key
    if back:

        def put(view: WriteView) -> None:
            for key in back.values():
                view.put("metadata", key, positions_before[key])

        store.apply(put)


def _copy_tx_files(source: Path, target: Path) -> dict[int, int]:
    """Copy the newest snapshot and the logs from it on; return each copied log's
    generation and number of intact records."""
    import re
    import shutil

    from tidings.tx.log import read_log

    name = re.compile(_TX_FILE)
    # The server may start a new generation (and delete the old files) mid-copy: then
    # the copy starts over from the new snapshot.
    for _ in range(5):
        found = [
            (m.group(1), int(m.group(2)), p) for p in source.iterdir() if (m := name.match(p.name))
        ]
        snapshots = sorted(g for kind, g, _ in found if kind == "snapshot")
        if not snapshots:
            raise BackupFailed(f"{source} holds no transaction snapshot to back up")
        base = snapshots[-1]
        wals = sorted((g, p) for kind, g, p in found if kind == "wal" and g >= base)
        if target.exists():
            shutil.rmtree(target)
        target.mkdir()
        try:
            shutil.copyfile(
                source / f"snapshot-{base:020d}.snap", target / f"snapshot-{base:020d}.snap"
            )
            for _generation, path in wals:
                shutil.copyfile(path, target / path.name)
        except FileNotFoundError:
            continue
        return {g: sum(1 for _ in read_log(target / p.name)) for g, p in wals}
    raise BackupFailed(f"{source} kept changing generation; try again")


def _trim_carried(store_dir: Path, logs: dict[int, int]) -> int:
    """Drop from the store copy the log records it carries that do not follow the
    copied log files without a gap (written after the files were copied): recovery
    would refuse a gap, and a generation the copy lacks would be replayed later under
    a reused number. What stays is the log as of some moment before the store copy."""
    from tidings.store.backends.lmdb import LmdbStore
    from tidings.tx.log import TAIL_PREFIX, tail_index

    store = LmdbStore(store_dir)
    try:
        stale: list[bytes] = []
        expected: dict[int, int] = {g: count + 1 for g, count in logs.items()}
        for key, _value in store.scan_list("tx", TAIL_PREFIX, TAIL_PREFIX[:-1] + b"0"):
            generation, index = tail_index(bytes(key))
            if generation not in expected:
                if logs and generation < min(logs):
                    continue  # covered by the snapshot; recovery drops them
                stale.append(bytes(key))
            elif index < expected[generation]:
                continue  # also in the file
            elif index == expected[generation]:
                expected[generation] += 1
            else:
                expected[generation] = -1  # a gap: nothing after it is usable
                stale.append(bytes(key))

        def drop(view: WriteView) -> None:
            for key in stale:
                view.delete("tx", key)

        if stale:
            store.apply(drop)
        return len(stale)
    finally:
        store.close()
