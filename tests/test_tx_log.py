"""The write-ahead log and snapshots on disk: framing, torn tails, damage, failures."""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path

import pytest

from tidings.clock import FakeClock
from tidings.errors import CorruptSnapshot, ServerError, TransactionCommitted, TransactionNotFound
from tidings.structs import TransactionState
from tidings.tx import TransactionManager, TxConfig
from tidings.tx import log as txlog
from tidings.tx.log import HEADER, WriteAheadLog, read_log
from tidings.tx.state import RESERVATION

QUIET = TxConfig(sweep_interval=3600)


def test_records_round_trip(tmp_path: Path) -> None:
    wal = WriteAheadLog(tmp_path / "w.log")
    payloads = [b"one", b"two" * 100, bytes(range(256))]
    wal.sync(wal.append(payloads[:2]))
    wal.sync(wal.append(payloads[2:]))
    wal.close()
    assert list(read_log(tmp_path / "w.log")) == payloads
    # The file is preallocated; its zero tail is not mistaken for records or damage.
    assert (tmp_path / "w.log").stat().st_size >= txlog.CHUNK


def test_torn_tails_are_ignored(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "w.log"
    wal = WriteAheadLog(path)
    wal.sync(wal.append([b"first", b"second-record"]))
    wal.close()
    data = _used(path)
    last = len(data) - (8 + len(b"second-record"))
    for cut in range(last, len(data)):
        path.write_bytes(data[:cut])
        assert list(read_log(path)) == [b"first"], cut
    damaged = bytearray(data)
    damaged[-1] ^= 0xFF  # CRC mismatch in the last record
    path.write_bytes(bytes(damaged) + b"\0" * 100)
    with caplog.at_level(logging.WARNING):
        assert list(read_log(path)) == [b"first"]
    assert "torn tail" in caplog.text
    path.write_bytes(data + b"\x00\x00\x00\x05garbage")
    assert list(read_log(path)) == [b"first", b"second-record"]


def test_bad_header(tmp_path: Path) -> None:
    path = tmp_path / "w.log"
    path.write_bytes(HEADER[:3])  # crash while creating the file
    assert list(read_log(path)) == []
    path.write_bytes(b"NOTALOG!" + b"\0" * 10)
    with pytest.raises(ServerError):
        list(read_log(path))


def _wal(data_dir: Path) -> Path:
    (path,) = data_dir.glob("wal-*.log")
    return path


def _used(path: Path) -> bytes:
    """The log's bytes without its preallocated zero tail (records may end in zeros)."""
    end = len(HEADER) + sum(8 + len(payload) for payload in read_log(path))
    return path.read_bytes()[:end]


def assert_recovered_with_unlogged(after: TransactionState, before: TransactionState) -> None:
    """``after`` is ``before`` except that recovery invalidated the pointers that were
    reserved above the last one the log names (a few, all above ``before``'s)."""
    assert after.read_pointer == before.read_pointer
    assert after.in_progress == before.in_progress
    assert set(before.invalid) <= set(after.invalid)
    unlogged = set(after.invalid) - set(before.invalid)
    assert 0 < len(unlogged) <= RESERVATION
    assert all(before.last_write_pointer < wp <= after.last_write_pointer for wp in unlogged)


def test_truncated_log_loses_only_the_unfinished_record(tmp_path: Path) -> None:
    """Cut the log inside its last record at every byte: recovery keeps everything
    before it, and the cut record's change simply did not happen."""
    clock = FakeClock()
    data_dir = tmp_path / "tx"
    with TransactionManager(data_dir, QUIET, clock) as m:
        kept = m.begin()
        m.commit(kept.write_pointer, [b"k"])
        pending = m.begin()
        before_last = m.state()
        size_before_last = len(_used(_wal(data_dir)))
        m.commit(pending.write_pointer, [b"a-change-key"])  # the record we will tear
        size_after_last = len(_used(_wal(data_dir)))
    original = data_dir.with_name("original")
    os.rename(data_dir, original)
    full = _used(_wal(original))
    assert size_after_last > size_before_last
    for cut in range(size_before_last, size_after_last):
        for entry in original.iterdir():
            (data_dir / entry.name).parent.mkdir(exist_ok=True)
            (data_dir / entry.name).write_bytes(entry.read_bytes())
        _wal(data_dir).write_bytes(full[:cut])
        with TransactionManager(data_dir, QUIET, clock) as m:
            # Also lost: the record that ended the reservation at the clean stop.
            assert_recovered_with_unlogged(m.state(), before_last)
            with pytest.raises(TransactionCommitted):
                m.commit(kept.write_pointer)
            m.commit(pending.write_pointer)  # the lost commit can simply be redone
        # ...and that is durable.
        with TransactionManager(data_dir, QUIET, clock) as m, pytest.raises(TransactionCommitted):
            m.commit(pending.write_pointer)
        for entry in data_dir.iterdir():
            entry.unlink()


def test_a_crash_between_rotation_and_snapshot_replays_both_logs(tmp_path: Path) -> None:
    clock = FakeClock()
    with TransactionManager(tmp_path, QUIET, clock) as m:
        a = m.begin()
        m.commit(a.write_pointer)
        # Rotate by hand as take_snapshot does, but "crash" before the snapshot exists.
        storage = m._storage
        assert storage is not None
        generation, path = storage.new_log()
        with m._lock:
            storage.wal.rotate(path)
            storage.rotated(generation)
        b = m.begin()
        m.commit(b.write_pointer)
        before = m.state()
    assert len(list(tmp_path.glob("wal-*.log"))) == 2
    with TransactionManager(tmp_path, QUIET, clock) as m:
        assert m.state() == before
        with pytest.raises(TransactionCommitted):
            m.commit(a.write_pointer)


def test_a_damaged_snapshot_is_reported(tmp_path: Path) -> None:
    with TransactionManager(tmp_path, QUIET) as m:
        m.begin()
    (snapshot,) = tmp_path.glob("snapshot-*.snap")
    data = bytearray(snapshot.read_bytes())
    data[12] ^= 0x01
    snapshot.write_bytes(bytes(data))
    with pytest.raises(CorruptSnapshot):
        TransactionManager(tmp_path, QUIET).start()
    # The failed start released the directory; a log without its snapshot is refused too.
    snapshot.unlink()
    with pytest.raises(ServerError, match="refusing to guess"):
        TransactionManager(tmp_path, QUIET).start()
    _wal(tmp_path).unlink()
    with TransactionManager(tmp_path, QUIET) as m:
        assert m.state().last_write_pointer == 0


def test_a_failed_fsync_stops_the_service(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with TransactionManager(tmp_path, QUIET) as m:
        tx = m.begin()

        def broken(fd: int) -> None:
            raise OSError(5, "Input/output error")

        monkeypatch.setattr(txlog.os, "fdatasync", broken)
        with pytest.raises(ServerError):
            m.commit(tx.write_pointer)
        monkeypatch.undo()
        # The commit may or may not be on disk, so nothing is answered any more.
        with pytest.raises(ServerError):
            m.begin()
        with pytest.raises(ServerError):
            m.state()
    # A restart recovers whatever is on disk.
    with (
        TransactionManager(tmp_path, QUIET) as m,
        contextlib.suppress(TransactionCommitted, TransactionNotFound),
    ):
        m.commit(tx.write_pointer)
