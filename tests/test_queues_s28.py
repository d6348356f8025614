"""The queue coordinator in process, where a race cannot be brought about through the
server: a transactional ack whose transaction ends between its check in memory and
its store write."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidings.consumers.queues import QueueCoordinator
from tidings.errors import TransactionTimedOut
from tidings.messaging import MessagingService
from tidings.store.backends.memory import MemoryStore
from tidings.structs import Message
from tidings.tx import TransactionManager, TxConfig


def test_an_ack_refused_in_its_store_write_leaves_every_lease_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = MemoryStore()
    messaging = MessagingService(store)
    messaging.create_topic("ns", "t")
    messaging.publish("ns", "t", [b"%d" % i for i in range(6)])
    with TransactionManager(tmp_path / "tx", TxConfig(sweep_interval=3600)) as tx:
        queues = QueueCoordinator(store, messaging, tx)

        def pop(worker: str, n: int) -> list[Message]:
            snap = tx.snapshot()
            assert snap is not None
            return queues.pop("ns", "t", "q", worker, max_messages=n, snapshot=snap)

        mine, theirs = pop("w1", 2), pop("w2", 2)  # neither lease written yet
        wp = tx.begin().write_pointer
        checks = 0
        writable = tx.check_writable

        def ends_before_the_write(write_pointer: int, action: str = "publish under") -> None:
            nonlocal checks
            checks += 1
            if checks > 1:  # the check in the store write, not the one in memory
                raise TransactionTimedOut(f"transaction {write_pointer} timed out")
            writable(write_pointer, action)

        monkeypatch.setattr(tx, "check_writable", ends_before_the_write)
        with pytest.raises(TransactionTimedOut):
            queues.ack("ns", "t", "q", "w1", [m.id for m in mine], write_pointer=wp)
        assert checks == 2
        monkeypatch.setattr(tx, "check_writable", writable)
        # Nobody's lease was lost: the others get only what nobody holds.
        assert [m.payload for m in pop("w3", 10)] == [b"4", b"5"]
        stats = queues.describe("ns", "t", "q")
        assert stats.consumers == {"w1": 2, "w2": 2, "w3": 2}
        # The worker keeps its messages and acks them for good.
        queues.ack("ns", "t", "q", "w1", [m.id for m in mine])
        queues.ack("ns", "t", "q", "w2", [m.id for m in theirs])
        # As the store has it after a restart: nothing acked comes back, the rest does.
        queues = QueueCoordinator(store, messaging, tx)
        assert queues.describe("ns", "t", "q").consumers == {"w3": 2}
        assert pop("w4", 10) == []


def test_an_earlier_ack_under_the_refused_pointer_goes_back_to_its_worker_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = MemoryStore()
    messaging = MessagingService(store)
    messaging.create_topic("ns", "t")
    messaging.publish("ns", "t", [b"%d" % i for i in range(6)])
    with TransactionManager(tmp_path / "tx", TxConfig(sweep_interval=3600)) as tx:
        queues = QueueCoordinator(store, messaging, tx)

        def pop(worker: str, n: int) -> list[Message]:
            snap = tx.snapshot()
            assert snap is not None
            return queues.pop("ns", "t", "q", worker, max_messages=n, snapshot=snap)

        first, second, theirs = pop("w1", 2), pop("w1", 2), pop("w2", 2)
        wp = tx.begin().write_pointer
        queues.ack("ns", "t", "q", "w1", [m.id for m in first], write_pointer=wp)
        writable = tx.check_writable
        calls = 0

        def ends_before_the_write(write_pointer: int, action: str = "publish under") -> None:
            nonlocal calls
            calls += 1
            if calls > 1:
                raise TransactionTimedOut(f"transaction {write_pointer} timed out")
            writable(write_pointer, action)

        monkeypatch.setattr(tx, "check_writable", ends_before_the_write)
        with pytest.raises(TransactionTimedOut):
            queues.ack("ns", "t", "q", "w1", [m.id for m in second], write_pointer=wp)
        monkeypatch.setattr(tx, "check_writable", writable)
        queues.ack("ns", "t", "q", "w2", [m.id for m in theirs])  # writes what is behind
        # After a restart too, both batches are the worker's, to ack for good.
        queues = QueueCoordinator(store, messaging, tx)
        assert queues.describe("ns", "t", "q").consumers == {"w1": 4}
        queues.ack("ns", "t", "q", "w1", [m.id for m in first + second])
        assert queues.describe("ns", "t", "q").pending == 0
