"""The manager: lifecycle, timeouts (fake clock), recovery across restarts, threads."""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tidings.clock import FakeClock
from tidings.errors import (
    BadRequest,
    ServiceUnavailable,
    TimeoutTooLarge,
    TransactionAborted,
    TransactionCommitted,
    TransactionConflict,
    TransactionInvalid,
    TransactionTimedOut,
)
from tidings.tx import TransactionManager, TxConfig, Visibility, classify
from tidings.tx.state import RESERVATION

QUIET = TxConfig(sweep_interval=3600)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(params=["volatile", "durable"])
def manager(
    request: pytest.FixtureRequest, tmp_path: Path, clock: FakeClock
) -> Iterator[TransactionManager]:
    data_dir = None if request.param == "volatile" else tmp_path / "tx"
    with TransactionManager(data_dir, QUIET, clock) as m:
        yield m


def wait_for(condition: Callable[[], bool], seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


def test_lifecycle(tmp_path: Path) -> None:
    m = TransactionManager(tmp_path, QUIET)
    with pytest.raises(ServiceUnavailable):
        m.begin()
    m.start()
    m.start()
    with pytest.raises(ServiceUnavailable):  # one manager per data directory
        TransactionManager(tmp_path, QUIET).start()
    m.close()
    m.close()
    with pytest.raises(ServiceUnavailable):
        m.begin()
    with pytest.raises(ServiceUnavailable):
        m.state()
    with TransactionManager(tmp_path, QUIET) as again:  # the directory is free again
        again.begin()


def test_timeouts(manager: TransactionManager, clock: FakeClock) -> None:
    now = clock.now_ms()
    default = manager.begin()
    assert manager.state().in_progress[default.write_pointer] == now + 30_000
    longest = manager.begin(3600)
    assert manager.state().in_progress[longest.write_pointer] == now + 3_600_000
    short = manager.begin(0.5)
    assert manager.state().in_progress[short.write_pointer] == now + 500
    for bad in (3600.5, 0, -1, float("nan"), float("inf")):
        with pytest.raises(TimeoutTooLarge):
            manager.begin(bad)
    for wrong in ("10", True):
        with pytest.raises(BadRequest):
            manager.begin(wrong)  # type: ignore[arg-type]


def test_expired_transactions_become_invalid_and_are_skipped(
    manager: TransactionManager, clock: FakeClock
) -> None:
    stale = manager.begin(1)
    fresh = manager.begin(10)
    clock.advance(999)
    assert manager.expire() == []
    clock.advance(1)
    assert manager.expire() == [stale.write_pointer]
    with pytest.raises(TransactionTimedOut):
        manager.commit(stale.write_pointer)
    reader = manager.begin()
    assert classify(reader, stale.write_pointer) == Visibility.SKIP
    assert classify(reader, fresh.write_pointer) == Visibility.BLOCK
    manager.commit(fresh.write_pointer)
    assert manager.state().invalid == (stale.write_pointer,)
    assert manager.prune(ids=[stale.write_pointer]) == [stale.write_pointer]
    assert manager.state().invalid == ()


def test_the_sweeper_thread_expires_transactions(tmp_path: Path, clock: FakeClock) -> None:
    config = TxConfig(sweep_interval=0.02)
    with TransactionManager(tmp_path, config, clock) as m:
        tx = m.begin(5)
        clock.advance(5_000)
        wait_for(lambda: m.state().invalid == (tx.write_pointer,))


def test_commit_conflicts(manager: TransactionManager) -> None:
    a = manager.begin()
    b = manager.begin()
    manager.commit(b.write_pointer, [b"offset:g:t:0"])
    with pytest.raises(TransactionConflict):
        manager.commit(a.write_pointer, iter([b"offset:g:t:0"]))
    manager.abort(a.write_pointer)
    with pytest.raises(TransactionAborted):
        manager.commit(a.write_pointer)
    with pytest.raises(BadRequest):
        manager.commit(manager.begin().write_pointer, b"not-a-list")
    with pytest.raises(BadRequest):
        manager.commit("1")  # type: ignore[arg-type]


def test_recovery_restores_everything(tmp_path: Path, clock: FakeClock) -> None:
    with TransactionManager(tmp_path, QUIET, clock) as m:
        committed = m.begin()
        open_ = m.begin(60)
        invalid = m.begin()
        timed_out = m.begin(1)
        aborted = m.begin()
        conflicting = m.begin()
        m.commit(committed.write_pointer, [b"k"])
        m.invalidate(invalid.write_pointer)
        m.abort(aborted.write_pointer)
        clock.advance(1_000)
        m.expire()
        before = m.state()
    clock.set(clock.now_ms() - 3_600_000)  # the wall clock steps back an hour
    with TransactionManager(tmp_path, QUIET, clock) as m:
        assert m.state() == before
        with pytest.raises(TransactionCommitted):
            m.commit(committed.write_pointer)
        with pytest.raises(TransactionAborted):
            m.commit(aborted.write_pointer)
        with pytest.raises(TransactionTimedOut):
            m.commit(timed_out.write_pointer)
        # Change sets of recovered commits still catch conflicts.
        with pytest.raises(TransactionConflict):
            m.commit(conflicting.write_pointer, [b"k"])
        # Pointers keep rising although the clock went back.
        assert m.begin().write_pointer > before.last_write_pointer
        # Recovered transactions time out normally.
        clock.set(before.in_progress[open_.write_pointer])
        assert open_.write_pointer in m.expire()


def test_a_crash_invalidates_begins_that_were_not_yet_logged(
    tmp_path: Path, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    data_dir, crashed = tmp_path / "tx", tmp_path / "crashed"
    with TransactionManager(data_dir, QUIET, clock) as m:
        logged = m.begin()
        m.state()  # logged's begin and its reservation are on disk
        written: list[int] = []
        real_pwrite = os.pwrite
        monkeypatch.setattr(os, "pwrite", lambda fd, data, offset: written.append(fd) or 0)
        # Answered at once from the durable reservation; their records stay in memory.
        lost = [m.begin().write_pointer for _ in range(5)]
        assert written == []
        shutil.copytree(data_dir, crashed)  # the disk as a crash would leave it
        monkeypatch.setattr(os, "pwrite", real_pwrite)
    with TransactionManager(crashed, QUIET, clock) as m:
        state = m.state()
        assert logged.write_pointer in state.in_progress
        assert set(lost) <= set(state.invalid)  # whatever they wrote stays hidden
        assert len(state.invalid) <= RESERVATION
        with pytest.raises(TransactionInvalid, match="before its begin was durable"):
            m.commit(lost[0])
        assert m.begin().write_pointer > max(state.invalid)  # never handed out again
    with TransactionManager(data_dir, QUIET, clock) as m:  # a clean stop loses nothing
        state = m.state()
        assert set(lost) <= set(state.in_progress) and not state.invalid


def test_snapshots_truncate_the_log(tmp_path: Path, clock: FakeClock) -> None:
    config = TxConfig(sweep_interval=3600, snapshot_every=20)
    with TransactionManager(tmp_path, config, clock) as m:
        committed = []
        for _ in range(200):
            tx = m.begin()
            m.commit(tx.write_pointer)
            committed.append(tx.write_pointer)
        open_ = m.begin()
        wait_for(lambda: len(list(tmp_path.glob("wal-*"))) == 1)
        before = m.state()
    names = sorted(p.name for p in tmp_path.iterdir())
    # One snapshot, and no log older than it. A snapshot may still have been under way
    # at the close (its log rotated, its file not yet written): then two logs remain,
    # both at or after the snapshot, and the reopen below replays them.
    snapshots = [n for n in names if n.startswith("snapshot-")]
    logs = [n for n in names if n.startswith("wal-")]
    assert len(snapshots) == 1 and 1 <= len(logs) <= 2, names
    newest_snapshot = int(snapshots[0].split("-")[1].split(".")[0])
    assert all(int(n.split("-")[1].split(".")[0]) >= newest_snapshot for n in logs), names
    with TransactionManager(tmp_path, config, clock) as m:
        assert m.state() == before
        assert open_.write_pointer in m.state().in_progress
        with pytest.raises(TransactionCommitted):
            m.commit(committed[-1])


def test_many_threads(tmp_path: Path) -> None:
    config = TxConfig(sweep_interval=3600, snapshot_every=100)
    seen: list[list[int]] = []
    with TransactionManager(tmp_path, config) as m:

        def work(n: int) -> None:
            mine = []
            for i in range(100):
                tx = m.begin()
                mine.append(tx.write_pointer)
                if i % 3:
                    m.commit(tx.write_pointer, [b"%d:%d" % (n, i)] if i % 2 else [])
                else:
                    m.abort(tx.write_pointer)
            seen.append(mine)

        threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        before = m.state()
    pointers = [wp for mine in seen for wp in mine]
    assert len(pointers) == len(set(pointers)) == 800
    assert all(mine == sorted(mine) for mine in seen)
    with TransactionManager(tmp_path, config) as m:
        assert m.state() == before
        assert m.begin().write_pointer > max(pointers)


def test_relaxed_sync_still_survives_a_clean_restart(tmp_path: Path) -> None:
    config = TxConfig(sweep_interval=3600, sync=False)
    with TransactionManager(tmp_path, config) as m:
        tx = m.begin()
        m.commit(tx.write_pointer)
    with TransactionManager(tmp_path, config) as m, pytest.raises(TransactionCommitted):
        m.commit(tx.write_pointer)


def test_config_is_checked() -> None:
    with pytest.raises(ValueError):
        TxConfig(default_timeout=10, max_timeout=5)
    with pytest.raises(ValueError):
        TxConfig(sweep_interval=0)
    with pytest.raises(ValueError):
        TxConfig(snapshot_every=0)


def test_public_names() -> None:
    import tidings.tx

    assert sorted(tidings.tx.__all__) == sorted(
        [
            "TransactionManager",
            "TxConfig",
            "is_visible",
            "classify",
            "Visibility",
        ]
    )
    for name in tidings.tx.__all__:
        assert getattr(tidings.tx, name) is not None
