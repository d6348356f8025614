"""The transaction manager with its log and snapshots in a store (every backend):
recovery across restarts, snapshots that drop the log they cover, threads, fail-stop."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import TypeVar

import pytest

from tidings.clock import FakeClock
from tidings.errors import (
    LogFailed,
    ServerError,
    TransactionAborted,
    TransactionCommitted,
    TransactionConflict,
    TransactionTimedOut,
)
from tidings.store.backend import AFTER_ALL_KEYS, Store, WriteView
from tidings.store.backends.memory import MemoryStore
from tidings.tx import TransactionManager, TxConfig

T = TypeVar("T")
QUIET = TxConfig(sweep_interval=3600)


def _tx_keys(store: Store, prefix: bytes) -> list[bytes]:
    return [k for k, _ in store.scan_list("tx", prefix, AFTER_ALL_KEYS) if k.startswith(prefix)]


def test_recovery_restores_everything(store: Store) -> None:
    clock = FakeClock()
    with TransactionManager(None, QUIET, clock, store=store) as m:
        committed = m.begin()
        open_ = m.begin(60)
        timed_out = m.begin(1)
        aborted = m.begin()
        conflicting = m.begin()
        m.commit(committed.write_pointer, [b"k"])
        m.abort(aborted.write_pointer)
        clock.advance(1_000)
        m.expire()
        before = m.state()
    assert _tx_keys(store, b"txlog/") or _tx_keys(store, b"txsnap/")
    with TransactionManager(None, QUIET, clock, store=store) as m:
        assert m.state() == before
        assert open_.write_pointer in m.state().in_progress
        with pytest.raises(TransactionCommitted):
            m.commit(committed.write_pointer)
        with pytest.raises(TransactionAborted):
            m.commit(aborted.write_pointer)
        with pytest.raises(TransactionTimedOut):
            m.commit(timed_out.write_pointer)
        with pytest.raises(TransactionConflict):
            m.commit(conflicting.write_pointer, [b"k"])
        assert m.begin().write_pointer > before.last_write_pointer


def test_snapshots_drop_the_log_they_cover(store: Store) -> None:
    config = TxConfig(sweep_interval=3600, snapshot_every=20)
    with TransactionManager(None, config, store=store) as m:
        for _ in range(100):
            m.commit(m.begin().write_pointer)
        open_ = m.begin()
        m.take_snapshot()
        before = m.state()
    # Recovery wrote a snapshot of its own; every older snapshot and log is gone.
    assert len(_tx_keys(store, b"txsnap/")) == 1
    assert len(_tx_keys(store, b"txlog/")) < 20
    with TransactionManager(None, config, store=store) as m:
        assert m.state() == before
        assert open_.write_pointer in m.state().in_progress


def test_many_threads_one_order(store: Store) -> None:
    config = TxConfig(sweep_interval=3600, snapshot_every=50)
    seen: list[list[int]] = []
    with TransactionManager(None, config, store=store) as m:

        def work(n: int) -> None:
            mine = []
            for i in range(40):
                tx = m.begin()
                mine.append(tx.write_pointer)
                if i % 3:
                    m.commit(tx.write_pointer, [b"%d:%d" % (n, i)])
                else:
                    m.abort(tx.write_pointer)
            seen.append(mine)

        threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        before = m.state()
    pointers = [wp for mine in seen for wp in mine]
    assert len(pointers) == len(set(pointers)) == 160
    with TransactionManager(None, config, store=store) as m:
        assert m.state() == before


class _FailingStore(MemoryStore):
    """Commits until told to fail, then fails every write as a lost database would."""

    fail = False

    def submit(self, fn: Callable[[WriteView], T]) -> Future[T]:
        if self.fail:
            future: Future[T] = Future()
            future.set_exception(ServerError("the store could not commit"))
            return future
        return super().submit(fn)


def test_a_failed_store_write_stops_the_log() -> None:
    store = _FailingStore()
    m = TransactionManager(None, QUIET, store=store)
    m.start()
    tx = m.begin()
    m.state()
    store.fail = True
    with pytest.raises(LogFailed):
        m.commit(tx.write_pointer)
    with pytest.raises(LogFailed):  # fail-stop: nothing later is accepted either
        m.begin()
    store.fail = False
    with pytest.raises(LogFailed):
        m.begin()
    m.close()
    # What was acknowledged survives: the begin; the commit was never acknowledged.
    with TransactionManager(None, QUIET, store=store) as again:
        assert tx.write_pointer in again.state().in_progress


def test_data_dir_and_store_are_exclusive(tmp_path: object) -> None:
    with pytest.raises(ValueError, match="not both"):
        TransactionManager("somewhere", QUIET, store=MemoryStore())
