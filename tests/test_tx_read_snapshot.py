"""The manager's read-only ``snapshot()`` and its listeners (server-side read-committed)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tidings.clock import FakeClock
from tidings.errors import ServiceUnavailable
from tidings.tx import TransactionManager, TxConfig, Visibility, classify

QUIET = TxConfig(sweep_interval=3600)
READ_ONLY = 2**63 - 1


@pytest.fixture(params=["volatile", "durable"])
def manager(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[TransactionManager]:
    data_dir = None if request.param == "volatile" else tmp_path / "tx"
    with TransactionManager(data_dir, QUIET, FakeClock()) as m:
        yield m


def test_snapshot_sees_what_a_transaction_begun_now_would(manager: TransactionManager) -> None:
    done = manager.begin()
    manager.commit(done.write_pointer)
    bad = manager.begin()
    manager.invalidate(bad.write_pointer)
    open_ = manager.begin()
    snap = manager.snapshot()
    assert snap is not None
    begun = manager.begin()
    assert (snap.read_pointer, snap.invalid, snap.in_progress) == (
        begun.read_pointer,
        begun.invalid,
        begun.in_progress,
    )
    assert snap.in_progress == (open_.write_pointer,)
    assert snap.write_pointer == READ_ONLY
    assert classify(snap, done.write_pointer) == Visibility.VISIBLE
    assert classify(snap, bad.write_pointer) == Visibility.SKIP
    assert classify(snap, open_.write_pointer) == Visibility.BLOCK
    assert classify(snap, begun.write_pointer) == Visibility.BLOCK  # begun after it
    assert manager.snapshot(wait=False) is not None


def test_snapshot_writes_nothing(tmp_path: Path) -> None:
    with TransactionManager(tmp_path, QUIET, FakeClock()) as m:
        m.begin()
        before = m.state()
        for _ in range(5):
            m.snapshot()
        assert m.state() == before
        assert m.state().last_write_pointer == before.last_write_pointer


def test_snapshot_without_waiting_refuses_a_commit_not_yet_durable(tmp_path: Path) -> None:
    with TransactionManager(tmp_path, QUIET, FakeClock()) as m:
        tx = m.begin()
        m.commit(tx.write_pointer)
        m._synced_seq = 0  # as if the commit's group commit had not returned yet
        assert m.snapshot(wait=False) is None
        snap = m.snapshot()  # waits (here: at once) and remembers
        assert snap is not None and snap.read_pointer == tx.write_pointer
        assert m.snapshot(wait=False) == snap
        m._synced_seq = 0
        m.begin()  # a begin alone does not change what a reader sees
        m._visible_seq = 0
        assert m.snapshot(wait=False) is not None


def test_listeners_hear_every_end_but_not_begins(manager: TransactionManager) -> None:
    heard: list[int] = []
    manager.add_listener(lambda: heard.append(1))
    manager.add_listener(lambda: 1 / 0)  # a failing listener is logged, not raised
    a, b, c = manager.begin(), manager.begin(), manager.begin()
    assert heard == []
    manager.commit(a.write_pointer)
    manager.abort(b.write_pointer)
    manager.invalidate(c.write_pointer)
    assert len(heard) == 3
    manager.begin(timeout=0.001)
    manager._clock.advance(1000)  # type: ignore[attr-defined]
    assert manager.expire() and len(heard) == 4


def test_snapshot_after_close_is_unavailable(tmp_path: Path) -> None:
    m = TransactionManager(tmp_path, QUIET)
    m.start()
    m.close()
    with pytest.raises(ServiceUnavailable):
        m.snapshot()
