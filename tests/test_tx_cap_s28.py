"""The cap on open transactions (``TxConfig.max_open``, the server's ``tx_max_open``).

Without it anyone could begin transactions without end: each stays open until its
timeout, costs memory and holds back every read-committed reader.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tidings.clock import FakeClock
from tidings.errors import ServiceUnavailable, TooManyTransactions
from tidings.tx import TransactionManager, TxConfig
from tidings.tx.log import read_log
from tidings.tx.records import Begin, decode_record

CAPPED = TxConfig(sweep_interval=3600, max_open=2)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(params=["volatile", "durable"])
def manager(
    request: pytest.FixtureRequest, tmp_path: Path, clock: FakeClock
) -> Iterator[TransactionManager]:
    data_dir = None if request.param == "volatile" else tmp_path / "tx"
    with TransactionManager(data_dir, CAPPED, clock) as m:
        yield m


def _refused(manager: TransactionManager, **kwargs: object) -> None:
    """A begin is refused and changes nothing the state shows."""
    before = manager.state()
    with pytest.raises(TooManyTransactions) as caught:
        manager.begin(**kwargs)  # type: ignore[arg-type]
    assert caught.value.retriable and caught.value.status == 503
    assert isinstance(caught.value, ServiceUnavailable)
    assert "tx_max_open" in caught.value.message
    with pytest.raises(TooManyTransactions):
        manager.begin_future(**kwargs).result(5)  # type: ignore[arg-type]
    assert manager.state() == before


def test_a_begin_beyond_the_cap_is_refused_and_changes_nothing(
    manager: TransactionManager,
) -> None:
    manager.begin()
    manager.begin()
    _refused(manager)


def test_every_way_a_transaction_ends_frees_its_slot(
    manager: TransactionManager, clock: FakeClock
) -> None:
    a, b = manager.begin(), manager.begin()
    _refused(manager)
    manager.commit(a.write_pointer)
    c = manager.begin()
    _refused(manager)
    manager.abort(b.write_pointer)
    d = manager.begin()
    _refused(manager)
    manager.invalidate(c.write_pointer)
    e = manager.begin(1)
    _refused(manager)
    clock.advance(1000)
    _refused(manager)  # timed out, but not swept yet: the sweep frees the slot
    assert manager.expire() == [e.write_pointer]
    manager.begin()
    _refused(manager)
    assert d.write_pointer in manager.state().in_progress


def test_transactional_ids_count_and_fencing_frees_their_slots(
    manager: TransactionManager,
) -> None:
    producer = manager.register_producer("app")
    held = manager.begin(transactional_id="app", epoch=producer.epoch)
    manager.begin()
    _refused(manager, transactional_id="app", epoch=producer.epoch)
    again = manager.register_producer("app")  # fences the holder: its transaction ends
    assert held.write_pointer in manager.state().invalid
    manager.begin(transactional_id="app", epoch=again.epoch)
    _refused(manager)


def test_a_refused_begin_writes_no_log_record(tmp_path: Path, clock: FakeClock) -> None:
    with TransactionManager(tmp_path / "tx", CAPPED, clock) as m:
        m.begin()
        m.begin()
        for _ in range(5):
            with pytest.raises(TooManyTransactions):
                m.begin()
        last = m.state().last_write_pointer
    records = [
        decode_record(raw)
        for path in sorted((tmp_path / "tx").glob("wal-*.log"))
        for raw in read_log(path)
    ]
    begun = [r for r in records if isinstance(r, Begin)]
    assert len(begun) == 2
    # A restart recovers both, whatever the cap it restarts with.
    with TransactionManager(tmp_path / "tx", TxConfig(sweep_interval=3600, max_open=1)) as m:
        state = m.state()
        assert len(state.in_progress) == 2 and state.last_write_pointer >= last
        with pytest.raises(TooManyTransactions):
            m.begin()


@pytest.mark.parametrize("bad", [0, -1, True, 1.5])
def test_the_cap_is_a_positive_integer(bad: object) -> None:
    with pytest.raises(ValueError, match="max_open"):
        TxConfig(max_open=bad)  # type: ignore[arg-type]
