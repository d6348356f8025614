"""Transactional ids, epochs and fencing (KIP-98), through the manager's API."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tidings.clock import FakeClock
from tidings.errors import (
    InvalidProducer,
    ProducerFenced,
    ProducerNotFound,
    TransactionInvalid,
    UnknownProducerEpoch,
)
from tidings.tx import TransactionManager, TxConfig

CONFIG = TxConfig(sweep_interval=3600)


@pytest.fixture(params=["volatile", "durable"])
def manager(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[TransactionManager]:
    data_dir = None if request.param == "volatile" else tmp_path / "tx"
    with TransactionManager(data_dir, CONFIG, FakeClock()) as m:
        yield m


def test_register_hands_out_one_producer_id_and_rising_epochs(
    manager: TransactionManager,
) -> None:
    first = manager.register_producer("orders")
    other = manager.register_producer("billing")
    again = manager.register_producer("orders")
    assert (first.producer_id, first.epoch) == (again.producer_id, 0)
    assert again.epoch == 1
    assert other.producer_id != first.producer_id


def test_registering_again_fences_the_old_epoch(manager: TransactionManager) -> None:
    old = manager.register_producer("p")
    tx = manager.begin(transactional_id="p", epoch=old.epoch)
    new = manager.register_producer("p")

    # What the old holder left in progress was invalidated, not merely aborted.
    assert tx.write_pointer in manager.state().invalid
    assert tx.write_pointer not in manager.state().in_progress
    for call in (
        lambda: manager.begin(transactional_id="p", epoch=old.epoch),
        lambda: manager.commit(tx.write_pointer, transactional_id="p", epoch=old.epoch),
        lambda: manager.abort(tx.write_pointer, transactional_id="p", epoch=old.epoch),
    ):
        with pytest.raises(ProducerFenced):
            call()
    # Without the epoch the zombie still cannot commit the invalidated transaction.
    with pytest.raises(TransactionInvalid):
        manager.commit(tx.write_pointer)

    # The new holder works normally.
    fresh = manager.begin(transactional_id="p", epoch=new.epoch)
    manager.commit(fresh.write_pointer, transactional_id="p", epoch=new.epoch)


def test_fencing_leaves_other_producers_and_anonymous_transactions_alone(
    manager: TransactionManager,
) -> None:
    a = manager.register_producer("a")
    b = manager.register_producer("b")
    ta = manager.begin(transactional_id="a", epoch=a.epoch)
    tb = manager.begin(transactional_id="b", epoch=b.epoch)
    anon = manager.begin()
    manager.register_producer("a")
    assert set(manager.state().in_progress) == {tb.write_pointer, anon.write_pointer}
    assert manager.state().invalid == (ta.write_pointer,)


def test_producer_calls_must_be_well_formed(manager: TransactionManager) -> None:
    info = manager.register_producer("p")
    with pytest.raises(ProducerNotFound):
        manager.begin(transactional_id="nobody", epoch=0)
    with pytest.raises(InvalidProducer):
        manager.begin(transactional_id="p")  # epoch missing
    with pytest.raises(UnknownProducerEpoch):
        manager.begin(transactional_id="p", epoch=info.epoch + 1)  # never handed out
    with pytest.raises(InvalidProducer):
        manager.begin(epoch=0)  # epoch without an id
    for bad in ("", "x" * 256, "tab\there"):
        with pytest.raises(InvalidProducer):
            manager.register_producer(bad)


def test_a_producer_may_only_end_its_own_transactions(manager: TransactionManager) -> None:
    a = manager.register_producer("a")
    b = manager.register_producer("b")
    ta = manager.begin(transactional_id="a", epoch=a.epoch)
    anon = manager.begin()
    with pytest.raises(InvalidProducer):
        manager.commit(ta.write_pointer, transactional_id="b", epoch=b.epoch)
    with pytest.raises(InvalidProducer):
        manager.abort(anon.write_pointer, transactional_id="b", epoch=b.epoch)
    # The anonymous (admin) path may end any transaction.
    manager.abort(ta.write_pointer)
    manager.commit(anon.write_pointer)


def test_the_new_holder_may_abort_what_was_fenced(manager: TransactionManager) -> None:
    manager.register_producer("p")
    tx = manager.begin(transactional_id="p", epoch=0)
    manager.register_producer("p")
    manager.abort(tx.write_pointer, transactional_id="p", epoch=1)  # no-op, it is invalid
    assert manager.state().invalid == (tx.write_pointer,)


def test_epochs_and_fencing_survive_restarts(tmp_path: Path) -> None:
    clock = FakeClock()
    with TransactionManager(tmp_path, CONFIG, clock) as m:
        m.register_producer("p")
        tx = m.begin(transactional_id="p", epoch=0)
        m.register_producer("p")
        m.take_snapshot()
        m.register_producer("p")  # epoch 2, only in the log
        m.register_producer("q")
    with TransactionManager(tmp_path, CONFIG, clock) as m:
        for epoch in (0, 1):
            with pytest.raises(ProducerFenced):
                m.begin(transactional_id="p", epoch=epoch)
        with pytest.raises(TransactionInvalid):
            m.commit(tx.write_pointer)
        m.begin(transactional_id="p", epoch=2)
        again = m.register_producer("p")
        assert (again.producer_id, again.epoch) == (1, 3)
        assert m.register_producer("r").producer_id == 3


def test_idle_transactional_ids_are_forgotten(tmp_path: Path) -> None:
    clock = FakeClock()
    config = TxConfig(sweep_interval=3600, producer_expiry=60.0, max_timeout=3600)
    with TransactionManager(tmp_path / "tx", config, clock) as m:
        idle = m.register_producer("idle")
        busy = m.register_producer("busy")
        m.expire()  # starts their idle clocks
        open_tx = m.begin(600, transactional_id="busy", epoch=busy.epoch)
        clock.advance(30_000)
        m.expire()
        m.begin(transactional_id="idle", epoch=idle.epoch)  # still known
        clock.advance(61_000)
        m.expire()
        with pytest.raises(ProducerNotFound):  # unused for 61 s: forgotten
            m.begin(transactional_id="idle", epoch=idle.epoch)
        # An id with a transaction open is kept, whatever its idle time.
        m.commit(open_tx.write_pointer, transactional_id="busy", epoch=busy.epoch)
        again = m.register_producer("idle")
        # Afresh: a new producer id, and an epoch above the forgotten one's, so that
        # the forgotten holder (a zombie calling with its id and epoch) is fenced.
        assert again.epoch == idle.epoch + 1 and again.producer_id != idle.producer_id
