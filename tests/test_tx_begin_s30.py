"""A begin's idempotency key (``begin_id``): a begin sent again because its answer was
lost answers the transaction it began, rather than begin another that nobody can end
(it would hold a ``max_open`` slot and show in every snapshot until its timeout)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tidings.clock import FakeClock
from tidings.errors import (
    BeginIdConflict,
    TransactionAborted,
    TransactionCommitted,
    TransactionInvalid,
    TransactionTimedOut,
)
from tidings.tx import TransactionManager, TxConfig


@pytest.fixture
def tm() -> Iterator[TransactionManager]:
    with TransactionManager(None, TxConfig(), FakeClock()) as manager:
        yield manager


def test_a_resent_begin_answers_the_same_transaction(tm: TransactionManager) -> None:
    first = tm.begin(begin_id="k1")
    other = tm.begin()
    tm.commit(other.write_pointer)
    again = tm.begin(begin_id="k1")
    # The snapshot as first answered: not one that sees what committed since.
    assert again == first
    assert list(tm.state().in_progress) == [first.write_pointer]
    assert tm.begin(begin_id="k2").write_pointer > other.write_pointer


def test_the_answer_says_nothing_was_begun_again(tm: TransactionManager) -> None:
    first = tm.begin_once_future(begin_id="k").result()
    again = tm.begin_once_future(begin_id="k").result()
    assert (first.again, again.again) == (False, True)
    assert first.transaction == again.transaction


def test_a_resend_takes_no_slot_of_max_open() -> None:
    with TransactionManager(None, TxConfig(max_open=1)) as tm:
        first = tm.begin(begin_id="k")
        assert tm.begin(begin_id="k") == first


@pytest.mark.parametrize(
    ("end", "error"),
    [
        (TransactionManager.commit, TransactionCommitted),
        (TransactionManager.abort, TransactionAborted),
        (TransactionManager.invalidate, TransactionInvalid),
    ],
)
def test_the_key_of_an_ended_transaction_says_how_it_ended(
    tm: TransactionManager, end: object, error: type[Exception]
) -> None:
    tx = tm.begin(begin_id="k")
    end(tm, tx.write_pointer)  # type: ignore[operator]
    with pytest.raises(error, match="beginId 'k' began transaction"):
        tm.begin(begin_id="k")
    assert tm.state().in_progress == {}


def test_a_timed_out_transaction_is_not_answered_again() -> None:
    clock = FakeClock()
    with TransactionManager(None, TxConfig(), clock) as tm:
        tm.begin(1.0, begin_id="k")
        clock.advance(1000)  # expired, not swept yet
        with pytest.raises(TransactionTimedOut):
            tm.begin(1.0, begin_id="k")
        tm.expire()
        with pytest.raises(TransactionTimedOut):
            tm.begin(1.0, begin_id="k")
        assert tm.state().in_progress == {}


def test_a_fenced_transaction_is_not_answered_again(tm: TransactionManager) -> None:
    producer = tm.register_producer("app")
    tm.begin(transactional_id="app", epoch=producer.epoch, begin_id="k")
    tm.register_producer("app")  # fences epoch 0: its transaction is invalid
    with pytest.raises(TransactionInvalid):
        tm.begin(transactional_id="app", epoch=producer.epoch, begin_id="k")
    tm.expire()  # the sweep forgets the id of a transaction fencing ended
    with pytest.raises(TransactionInvalid):
        tm.begin(transactional_id="app", epoch=producer.epoch, begin_id="k")


@pytest.mark.parametrize(
    "changed",
    [{"timeout": 5.0}, {"transactional_id": "app", "epoch": 0}],
    ids=["timeout", "producer"],
)
def test_the_same_key_with_other_parameters_is_a_conflict(
    tm: TransactionManager, changed: dict[str, object]
) -> None:
    tm.register_producer("app")
    tx = tm.begin(begin_id="k")
    with pytest.raises(BeginIdConflict):
        tm.begin(begin_id="k", **changed)  # type: ignore[arg-type]
    assert list(tm.state().in_progress) == [tx.write_pointer]


def test_a_resend_is_answered_after_its_begin_is_durable(tmp_path: Path) -> None:
    with TransactionManager(tmp_path, TxConfig()) as tm:
        first = tm.begin(begin_id="k")
        again = tm.begin_future(begin_id="k").result(timeout=10)
        assert again.write_pointer == first.write_pointer
        assert again.read_pointer == first.read_pointer


def test_after_a_restart_the_keys_are_forgotten(tmp_path: Path) -> None:
    # Documented (docs/transactions.md): the ids live in memory only.
    with TransactionManager(tmp_path, TxConfig()) as tm:
        first = tm.begin(begin_id="k")
    with TransactionManager(tmp_path, TxConfig()) as tm:
        again = tm.begin(begin_id="k")
        assert again.write_pointer > first.write_pointer
