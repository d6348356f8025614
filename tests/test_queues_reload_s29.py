"""A queue whose store write fails rebuilds its memory from its records; leases that
no write recorded yet (a pop writes nothing) must stay with the workers that hold
them, and no message may go to a second worker meanwhile. In process, as a store
write cannot be made to fail inside a server process."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tidings.consumers.queues import QueueCoordinator
from tidings.errors import AckConflict, StoreFull
from tidings.messaging import MessagingService
from tidings.store.backend import Store, WriteView
from tidings.store.backends.memory import MemoryStore
from tidings.structs import Message
from tidings.tx import TransactionManager, TxConfig

T = TypeVar("T")


def _fail_next_write(store: Store, monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """The store's next write fails as a full store's does; the list gets it."""
    submit = store.submit
    failed: list[object] = []

    def full(fn: Callable[[WriteView], T]) -> Future[T]:
        def refused(view: WriteView) -> T:
            raise StoreFull("the store is full")

        monkeypatch.setattr(store, "submit", submit)
        done = submit(refused)
        failed.append(done)
        return done

    monkeypatch.setattr(store, "submit", full)
    return failed


def test_a_failed_ack_write_leaves_every_unwritten_lease_with_its_worker(
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
        failed = _fail_next_write(store, monkeypatch)
        with pytest.raises(StoreFull):
            queues.ack("ns", "t", "q", "w2", [theirs[0].id])
        assert len(failed) == 1
        # Nobody's lease was lost: another worker gets only what nobody holds, and
        # the message whose ack failed stays with the worker that acked it.
        assert [m.payload for m in pop("w3", 10)] == [b"4", b"5"]
        stats = queues.describe("ns", "t", "q")
        assert stats.consumers == {"w1": 2, "w2": 2, "w3": 2}
        # The failed ack counts nothing: acked once, when it is acked again.
        assert (stats.pending, stats.waiting, stats.popped, stats.acked) == (6, 0, 6, 0)
        # Each worker acks what it holds (w2 its failed ack again).
        queues.ack("ns", "t", "q", "w1", [m.id for m in mine])
        queues.ack("ns", "t", "q", "w2", [m.id for m in theirs])
        stats = queues.describe("ns", "t", "q")
        assert (stats.consumers, stats.acked) == ({"w3": 2}, 4)
        # As the store has it after a restart: nothing acked comes back, w3's lease
        # (written with those acks) holds.
        queues = QueueCoordinator(store, messaging, tx)
        assert queues.describe("ns", "t", "q").consumers == {"w3": 2}
        assert pop("w4", 10) == []


def test_a_failed_write_keeps_an_unwritten_lease_of_a_message_given_back_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The records say the message is back in the queue (a nack was written); memory
    # knows a worker popped it since.
    store = MemoryStore()
    messaging = MessagingService(store)
    messaging.create_topic("ns", "t")
    messaging.publish("ns", "t", [b"a", b"b", b"c"])
    with TransactionManager(tmp_path / "tx", TxConfig(sweep_interval=3600)) as tx:
        queues = QueueCoordinator(store, messaging, tx)

        def pop(worker: str, n: int) -> list[Message]:
            snap = tx.snapshot()
            assert snap is not None
            return queues.pop("ns", "t", "q", worker, max_messages=n, snapshot=snap)

        first = pop("w1", 2)
        queues.nack("ns", "t", "q", "w1", [first[0].id])  # written: "a" is returned
        again = pop("w2", 1)
        assert [(m.payload, m.delivery_count) for m in again] == [(b"a", 2)]
        _fail_next_write(store, monkeypatch)
        with pytest.raises(StoreFull):
            queues.nack("ns", "t", "q", "w1", [first[1].id])
        # "a" stays w2's (with its count); "b" stays w1's (its nack failed).
        assert [m.payload for m in pop("w3", 10)] == [b"c"]
        assert queues.describe("ns", "t", "q").consumers == {"w1": 1, "w2": 1, "w3": 1}
        queues.nack("ns", "t", "q", "w2", [again[0].id])
        assert [(m.payload, m.delivery_count) for m in pop("w3", 10)] == [(b"a", 3)]


@pytest.mark.parametrize("at_once", [True, False])
def test_a_pop_whose_dead_lettering_fails_leaves_nothing_leased(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, at_once: bool
) -> None:
    # The rebuild keeps unwritten leases, but not the failed pop's own: its worker
    # was told it failed, and its deliveries do not count. The dead letter's write
    # fails before it is queued, or once the store gets to it.
    store = MemoryStore()
    messaging = MessagingService(store)
    messaging.create_topic("ns", "t")
    messaging.publish("ns", "t", [b"poison", b"fine1", b"fine2"])
    with TransactionManager(tmp_path / "tx", TxConfig(sweep_interval=3600)) as tx:
        queues = QueueCoordinator(store, messaging, tx)

        def pop(worker: str, n: int) -> list[Message]:
            snap = tx.snapshot()
            assert snap is not None
            return queues.pop(
                "ns", "t", "q", worker, max_messages=n, snapshot=snap, max_deliveries=1
            )

        poison = pop("w1", 1)
        queues.nack("ns", "t", "q", "w1", [poison[0].id])
        publish = messaging.publish_with_future

        def fails_once(*args: Any) -> Future[Any]:
            monkeypatch.setattr(messaging, "publish_with_future", publish)
            if at_once:
                raise StoreFull("the store is full")
            failed: Future[Any] = Future()
            failed.set_exception(StoreFull("the store is full"))
            return failed

        monkeypatch.setattr(messaging, "publish_with_future", fails_once)
        with pytest.raises(StoreFull):
            pop("w2", 2)
        got = pop("w3", 5)
        assert [(m.payload, m.delivery_count) for m in got] == [(b"fine1", 1), (b"fine2", 1)]
        assert [m.payload for m in messaging.fetch("ns", "t-dlq")] == [b"poison"]
        assert queues.describe("ns", "t", "q").consumers == {"w3": 2}


def _queues(
    tmp_path: Path, payloads: list[bytes]
) -> tuple[MemoryStore, MessagingService, TransactionManager]:
    store = MemoryStore()
    messaging = MessagingService(store)
    messaging.create_topic("ns", "t")
    messaging.publish("ns", "t", payloads)
    return store, messaging, TransactionManager(tmp_path / "tx", TxConfig(sweep_interval=3600))


def _counters(queues: QueueCoordinator) -> tuple[int, ...]:
    s = queues.describe("ns", "t", "q")
    return (s.popped, s.acked, s.nacked, s.redelivered, s.dead_lettered, s.expired)


def test_a_reload_counts_no_committed_transactional_ack_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, messaging, manager = _queues(tmp_path, [b"a", b"b", b"c"])
    with manager as tx:
        queues = QueueCoordinator(store, messaging, tx)
        snap = tx.snapshot()
        assert snap is not None
        got = queues.pop("ns", "t", "q", "w1", max_messages=3, snapshot=snap)
        t = tx.begin()
        queues.ack("ns", "t", "q", "w1", [got[0].id], write_pointer=t.write_pointer)
        tx.commit(t.write_pointer, [])
        # Resolved (and counted) in memory; its record is rewritten by the next write,
        # which fails: the reload finds the record under the committed pointer again.
        assert _counters(queues) == (3, 1, 0, 0, 0, 0)
        _fail_next_write(store, monkeypatch)
        with pytest.raises(StoreFull):
            queues.ack("ns", "t", "q", "w1", [got[1].id])
        assert _counters(queues) == (3, 1, 0, 0, 0, 0)
        queues.ack("ns", "t", "q", "w1", [m.id for m in got])
        assert _counters(queues) == (3, 3, 0, 0, 0, 0)


def test_a_transactional_ack_that_commits_after_a_failed_write_counts_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The memory the reload replaces never saw the commit: the rebuilt one counts it.
    store, messaging, manager = _queues(tmp_path, [b"a", b"b"])
    with manager as tx:
        queues = QueueCoordinator(store, messaging, tx)
        snap = tx.snapshot()
        assert snap is not None
        got = queues.pop("ns", "t", "q", "w1", max_messages=2, snapshot=snap)
        t = tx.begin()
        queues.ack("ns", "t", "q", "w1", [got[0].id], write_pointer=t.write_pointer)
        submit = store.submit

        def commits_then_fails(fn: Callable[[WriteView], T]) -> Future[T]:
            # The commit lands after the nack's call saw the transaction open.
            monkeypatch.setattr(store, "submit", submit)
            tx.commit(t.write_pointer, [])
            failed: Future[T] = Future()
            failed.set_exception(StoreFull("the store is full"))
            return failed

        monkeypatch.setattr(store, "submit", commits_then_fails)
        with pytest.raises(StoreFull):
            queues.nack("ns", "t", "q", "w1", [got[1].id])
        assert _counters(queues) == (2, 1, 0, 0, 0, 0)
        # w1 made that ack: the rebuilt memory saw it resolve, and knows who.
        with pytest.raises(AckConflict):
            queues.ack("ns", "t", "q", "w2", [got[0].id])


def test_a_pop_whose_dead_lettering_fails_counts_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, messaging, manager = _queues(tmp_path, [b"again", b"poison", b"fine"])
    with manager as tx:
        queues = QueueCoordinator(store, messaging, tx)

        def pop(worker: str, n: int) -> list[Message]:
            snap = tx.snapshot()
            assert snap is not None
            return queues.pop(
                "ns", "t", "q", worker, max_messages=n, snapshot=snap, max_deliveries=2
            )

        first = pop("w1", 2)
        queues.nack("ns", "t", "q", "w1", [first[1].id])
        assert [m.payload for m in pop("w1", 1)] == [b"poison"]
        queues.nack("ns", "t", "q", "w1", [m.id for m in first])  # delivered once, twice
        assert _counters(queues) == (3, 0, 3, 1, 0, 0)
        publish = messaging.publish_with_future

        def fails_once(*args: Any) -> Future[Any]:
            monkeypatch.setattr(messaging, "publish_with_future", publish)
            failed: Future[Any] = Future()
            failed.set_exception(StoreFull("the store is full"))
            return failed

        monkeypatch.setattr(messaging, "publish_with_future", fails_once)
        with pytest.raises(StoreFull):
            pop("w2", 3)  # would dead-letter "poison" and hand out "again" and "fine"
        assert _counters(queues) == (3, 0, 3, 1, 0, 0)
        got = pop("w3", 3)
        assert [(m.payload, m.delivery_count) for m in got] == [(b"again", 2), (b"fine", 1)]
        assert _counters(queues) == (5, 0, 3, 2, 1, 0)


def test_a_pop_whose_dead_lettering_fails_at_once_counts_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, messaging, manager = _queues(tmp_path, [b"poison", b"fine"])
    with manager as tx:
        queues = QueueCoordinator(store, messaging, tx)
        snap = tx.snapshot()
        assert snap is not None
        got = queues.pop("ns", "t", "q", "w1", max_messages=1, snapshot=snap, max_deliveries=1)
        queues.nack("ns", "t", "q", "w1", [got[0].id])

        def refused(*args: Any) -> Future[Any]:
            raise StoreFull("the store is full")

        monkeypatch.setattr(messaging, "publish_with_future", refused)
        with pytest.raises(StoreFull):
            queues.pop("ns", "t", "q", "w2", max_messages=2, snapshot=snap)
        assert _counters(queues) == (1, 0, 1, 0, 0, 0)


@pytest.mark.parametrize("call", ["nack", "release", "extend"])
def test_a_failed_give_back_of_an_unwritten_lease_leaves_it_with_its_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, call: str
) -> None:
    # The worker was told its nack (release, extension) failed: as for a failed ack,
    # its messages stay with it, under the lease it held them by, and nothing counts.
    store, messaging, manager = _queues(tmp_path, [b"a", b"b", b"c"])
    with manager as tx:
        now = [1000.0]
        queues = QueueCoordinator(store, messaging, tx, clock=lambda: now[0])

        def pop(worker: str, n: int) -> list[Message]:
            snap = tx.snapshot()
            assert snap is not None
            return queues.pop(
                "ns", "t", "q", worker, max_messages=n, snapshot=snap, ack_timeout_ms=5000
            )

        mine = pop("w1", 2)  # not written: a pop writes nothing
        _fail_next_write(store, monkeypatch)
        with pytest.raises(StoreFull):
            if call == "nack":
                queues.nack("ns", "t", "q", "w1", [mine[0].id])
            elif call == "release":
                queues.release("ns", "t", "q", "w1")
            else:
                queues.extend("ns", "t", "q", "w1", [mine[0].id], ack_timeout_ms=600_000)
        assert [m.payload for m in pop("w2", 10)] == [b"c"]
        stats = queues.describe("ns", "t", "q")
        assert stats.consumers == {"w1": 2, "w2": 1}
        assert (stats.popped, stats.nacked) == (3, 0)
        # Under the deadline the pop gave them (no later one: the extension failed).
        now[0] += 5
        got = [(m.payload, m.delivery_count) for m in pop("w3", 10)]
        assert got == [(b"a", 2), (b"b", 2), (b"c", 2)]
