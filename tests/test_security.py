"""What the server's permission checks ask the transaction manager (docs/security.md):
who began a transaction, and whether a transaction committed. Through the real
server: tests/e2e/test_security.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidings.clock import FakeClock
from tidings.structs import ProducerInfo
from tidings.tx import TransactionManager, TxConfig
from tidings.tx.producers import ProducerTable

QUIET = TxConfig(sweep_interval=3600, producer_expiry=60.0, max_timeout=3600)


def test_the_producer_table_finds_a_registration_by_its_producer_id() -> None:
    table = ProducerTable()
    table.apply(ProducerInfo("a", 1, 0))
    table.apply(ProducerInfo("a", 1, 1))  # a new epoch keeps the producer id
    table.apply(ProducerInfo("b", 2, 0))
    assert table.of_producer(1) == ProducerInfo("a", 1, 1)
    assert table.of_producer(2) == ProducerInfo("b", 2, 0)
    assert table.of_producer(3) is None
    table.last_used["a"] = 0
    table.last_used["b"] = 10_000
    assert table.expire(10_000, 5_000, busy=set()) == ["a"]
    assert table.of_producer(1) is None and table.of_producer(2) is not None
    table.apply(ProducerInfo("a", 3, 0))  # registered again: a new producer id
    assert table.of_producer(3) == ProducerInfo("a", 3, 0) and table.of_producer(1) is None


@pytest.mark.parametrize("durable", [False, True])
def test_began_under_names_the_transactional_id_of_an_open_transaction(
    tmp_path: Path, durable: bool
) -> None:
    data_dir = tmp_path / "tx" if durable else None
    with TransactionManager(data_dir, QUIET, FakeClock()) as m:
        info = m.register_producer("orders-1")
        owned = m.begin(transactional_id="orders-1", epoch=info.epoch)
        plain = m.begin()
        assert m.began_under(owned.write_pointer) == "orders-1"
        assert m.began_under(plain.write_pointer) is None
        assert m.began_under(12345) is None  # never begun: the commit answers why
    if durable:  # recovered from the log, the same
        with TransactionManager(data_dir, QUIET, FakeClock()) as m:
            assert m.began_under(owned.write_pointer) == "orders-1"
            m.commit(owned.write_pointer)
            assert m.began_under(owned.write_pointer) is None  # ended


def test_has_committed_only_for_committed_transactions() -> None:
    with TransactionManager(None, TxConfig(sweep_interval=3600, history_size=2)) as m:
        committed, aborted, invalid, open_ = (m.begin() for _ in range(4))
        m.commit(committed.write_pointer)
        m.abort(aborted.write_pointer)
        m.invalidate(invalid.write_pointer)
        assert m.has_committed(committed.write_pointer)
        for tx in (aborted, invalid, open_):
            assert not m.has_committed(tx.write_pointer)
        # Too old for the history: committed if readers see it, that is, unless invalid.
        later = [m.begin() for _ in range(3)]
        for tx in later:
            m.commit(tx.write_pointer)
        assert m.has_committed(committed.write_pointer)
        assert not m.has_committed(invalid.write_pointer)
        assert not m.has_committed(open_.write_pointer)
        assert not m.has_committed(later[-1].write_pointer + 10**9)  # never begun, above
