"""The non-blocking API: ``WriteAheadLog.sync_future`` and the manager's ``*_future`` calls.

A future resolves only after the fsync that covers its records, carries the same errors
the blocking call raises, and many concurrent futures share one fsync.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path

import pytest

from tidings.clock import FakeClock
from tidings.errors import (
    BadRequest,
    LogFailed,
    ProducerFenced,
    ServiceUnavailable,
    TimeoutTooLarge,
    TransactionConflict,
    TransactionTimedOut,
)
from tidings.structs import Transaction
from tidings.tx import TransactionManager, TxConfig
from tidings.tx import log as txlog
from tidings.tx.log import WriteAheadLog, read_log
from tidings.tx.state import RESERVATION

QUIET = TxConfig(sweep_interval=3600)


class GatedSync:
    """Replaces ``os.fdatasync``: counts calls and, while closed, holds them."""

    def __init__(self) -> None:
        self.calls = 0
        self.entered = threading.Event()
        self.gate = threading.Event()
        self.gate.set()
        self.fail = False
        self._real = os.fdatasync

    def __call__(self, fd: int) -> None:
        self.calls += 1
        self.entered.set()
        assert self.gate.wait(10), "gate never opened"
        if self.fail:
            raise OSError(5, "Input/output error")
        self._real(fd)


@pytest.fixture
def gated(monkeypatch: pytest.MonkeyPatch) -> GatedSync:
    sync = GatedSync()
    monkeypatch.setattr(txlog.os, "fdatasync", sync)
    return sync


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def manager(tmp_path: Path, clock: FakeClock) -> Iterator[TransactionManager]:
    with TransactionManager(tmp_path / "tx", QUIET, clock) as m:
        yield m


def _error(future: Future[object]) -> BaseException | None:
    return future.exception(timeout=10)


# -- the log ---------------------------------------------------------------------------


def test_sync_future_resolves_only_after_the_fsync(tmp_path: Path, gated: GatedSync) -> None:
    wal = WriteAheadLog(tmp_path / "w.log")
    gated.gate.clear()
    future = wal.sync_future(wal.append([b"one", b"two"]))
    assert gated.entered.wait(10)
    assert not future.done()  # written, perhaps, but not yet durable
    gated.gate.set()
    assert future.result(timeout=10) is None
    assert wal.sync_future(2).done()  # already durable: resolved at once
    wal.close()
    assert list(read_log(tmp_path / "w.log")) == [b"one", b"two"]


def test_sync_futures_share_fsyncs_with_blocking_callers(tmp_path: Path, gated: GatedSync) -> None:
    wal = WriteAheadLog(tmp_path / "w.log")
    gated.gate.clear()
    first = wal.sync_future(wal.append([b"first"]))
    assert gated.entered.wait(10)
    # While that flush runs, many callers queue up: they form one next batch.
    futures = [wal.sync_future(wal.append([b"x%d" % i])) for i in range(100)]
    blocking = threading.Thread(target=lambda: wal.sync(wal.append([b"blocking"])))
    blocking.start()
    assert not any(f.done() for f in futures)
    gated.gate.set()
    for future in [first, *futures]:
        assert future.result(timeout=10) is None
    blocking.join(10)
    assert gated.calls <= 3, gated.calls
    wal.close()
    assert len(list(read_log(tmp_path / "w.log"))) == 102


def test_a_failed_flush_fails_every_future(tmp_path: Path, gated: GatedSync) -> None:
    wal = WriteAheadLog(tmp_path / "w.log")
    gated.gate.clear()
    gated.fail = True
    futures = [wal.sync_future(wal.append([b"x"])) for _ in range(5)]
    gated.gate.set()
    for future in futures:
        assert isinstance(_error(future), LogFailed)
    assert isinstance(_error(wal.sync_future(1)), LogFailed)  # fail-stop
    with pytest.raises(LogFailed):
        wal.append([b"more"])
    wal.close()


def test_close_answers_pending_futures(tmp_path: Path, gated: GatedSync) -> None:
    wal = WriteAheadLog(tmp_path / "w.log")
    gated.gate.clear()
    futures = [wal.sync_future(wal.append([b"x"])) for _ in range(10)]
    closer = threading.Thread(target=wal.close)
    closer.start()
    gated.gate.set()
    closer.join(10)
    assert not closer.is_alive()
    assert all(f.result(timeout=0) is None for f in futures)
    assert isinstance(_error(wal.sync_future(100)), LogFailed)  # closed


# -- the manager -----------------------------------------------------------------------


def test_begin_and_commit_futures_wait_for_the_log(
    manager: TransactionManager, gated: GatedSync
) -> None:
    heard: list[bool] = []
    manager.add_listener(lambda: heard.append(True))
    gated.gate.clear()
    begun = manager.begin_future()
    assert gated.entered.wait(10)
    assert not begun.done()
    gated.gate.set()
    tx = begun.result(timeout=10)
    assert isinstance(tx, Transaction)
    gated.entered.clear()
    gated.gate.clear()
    committed = manager.commit_future(tx.write_pointer, [b"k"])
    assert gated.entered.wait(10)
    assert not committed.done()
    assert heard == []  # listeners hear only of durable changes
    gated.gate.set()
    assert committed.result(timeout=10) is None
    assert heard == [True]
    assert manager.state().read_pointer >= tx.write_pointer


def test_errors_travel_in_the_future(manager: TransactionManager, clock: FakeClock) -> None:
    a = manager.begin_future().result(10)
    b = manager.begin()
    manager.commit_future(a.write_pointer, [b"key"]).result(10)
    assert isinstance(_error(manager.commit_future(b.write_pointer, [b"key"])), TransactionConflict)
    manager.abort_future(b.write_pointer).result(10)  # still in progress after a conflict

    c = manager.begin_future(timeout=1).result(10)
    clock.advance(2000)
    assert isinstance(_error(manager.commit_future(c.write_pointer)), TransactionTimedOut)

    old = manager.register_producer("p")
    manager.register_producer("p")
    fenced = manager.begin_future(transactional_id="p", epoch=old.epoch)
    assert isinstance(_error(fenced), ProducerFenced)

    # Bad input is in the future too, not raised by the call.
    assert isinstance(_error(manager.begin_future(timeout=-1)), TimeoutTooLarge)
    assert isinstance(_error(manager.commit_future(True)), BadRequest)  # type: ignore[arg-type]
    assert isinstance(_error(manager.commit_future(1, b"not-a-list")), BadRequest)
    assert isinstance(_error(manager.invalidate_future("1")), BadRequest)  # type: ignore[arg-type]


def test_invalidate_future(manager: TransactionManager) -> None:
    tx = manager.begin()
    manager.invalidate_future(tx.write_pointer).result(10)
    assert tx.write_pointer in manager.state().invalid


def test_futures_of_a_closed_manager_fail(tmp_path: Path) -> None:
    m = TransactionManager(tmp_path, QUIET)
    assert isinstance(_error(m.begin_future()), ServiceUnavailable)  # not started
    m.start()
    m.close()
    assert isinstance(_error(m.begin_future()), ServiceUnavailable)


def test_a_failed_fsync_fails_the_futures(manager: TransactionManager, gated: GatedSync) -> None:
    tx = manager.begin()
    gated.fail = True
    assert isinstance(_error(manager.commit_future(tx.write_pointer)), LogFailed)
    assert isinstance(_error(manager.begin_future()), LogFailed)


def test_volatile_manager_futures_resolve_at_once(clock: FakeClock) -> None:
    with TransactionManager(None, QUIET, clock) as m:
        begun = m.begin_future()
        assert begun.done()
        committed = m.commit_future(begun.result().write_pointer)
        assert committed.done() and committed.result() is None


def test_many_concurrent_futures_share_fsyncs(
    manager: TransactionManager, gated: GatedSync
) -> None:
    txs = [manager.begin() for _ in range(201)]
    assert len({t.write_pointer for t in txs}) == 201
    manager.state()  # everything so far is on disk
    gated.calls = 0
    gated.entered.clear()
    gated.gate.clear()
    first = manager.commit_future(txs[0].write_pointer)
    assert gated.entered.wait(10)
    commits = [manager.commit_future(t.write_pointer) for t in txs[1:]]
    gated.gate.set()
    for c in [first, *commits]:
        c.result(timeout=10)
    assert gated.calls <= 3, gated.calls


def test_begins_in_a_durable_reservation_do_not_wait_for_the_log(
    manager: TransactionManager, gated: GatedSync
) -> None:
    committed = manager.begin()
    manager.commit(committed.write_pointer)
    older = manager.begin()
    gated.gate.clear()  # from now on no fsync completes
    in_flight = manager.commit_future(older.write_pointer)
    assert gated.entered.wait(10)
    begun = [manager.begin_future() for _ in range(RESERVATION // 4)]
    assert all(f.done() for f in begun)  # answered while the log is stuck
    first = begun[0].result()
    # The commit still in flight is shown as in progress: a crash could undo it.
    assert first.read_pointer >= committed.write_pointer
    assert older.write_pointer in first.in_progress
    assert not in_flight.done()
    gated.gate.set()
    in_flight.result(timeout=10)
    after = manager.begin()
    assert older.write_pointer not in after.in_progress
    assert after.read_pointer >= older.write_pointer


def test_a_begin_outside_the_durable_reservation_waits(
    manager: TransactionManager, gated: GatedSync
) -> None:
    manager.begin()
    gated.gate.clear()
    # A reservation is renewed half-way, one flush ahead of need: with the log stuck,
    # begins run out of durable pointers within one reservation and must wait.
    futures = [manager.begin_future() for _ in range(2 * RESERVATION)]
    waiting = [f for f in futures if not f.done()]
    assert waiting and len(waiting) > RESERVATION // 2
    assert not any(f.done() for f in futures[futures.index(waiting[0]) :])
    gated.gate.set()
    pointers = [f.result(timeout=10).write_pointer for f in futures]
    assert pointers == sorted(set(pointers))


def test_futures_can_be_awaited_on_an_event_loop(manager: TransactionManager) -> None:
    async def transact() -> int:
        txs = await asyncio.gather(
            *(asyncio.wrap_future(manager.begin_future()) for _ in range(50))
        )
        await asyncio.gather(
            *(asyncio.wrap_future(manager.commit_future(t.write_pointer)) for t in txs)
        )
        # Cancelling the awaiting task does not call off the commit.
        tx = await asyncio.wrap_future(manager.begin_future())
        waiting = asyncio.ensure_future(
            asyncio.wrap_future(manager.commit_future(tx.write_pointer))
        )
        waiting.cancel()
        return tx.write_pointer

    wp = asyncio.run(transact())
    state = manager.state()
    assert wp not in state.in_progress
    assert wp not in state.invalid
