"""Queue calls whose store write fails change nothing a caller can see: the rollback
of a transaction's acks, a purge, and the calls of a store that refuses a write at
once (its submit raises, rather than returning a failed future). In process, as a
store write cannot be made to fail inside a server process."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tidings.consumers.queues import QueueCoordinator
from tidings.errors import AckConflict, StoreFull
from tidings.messaging import MessagingService
from tidings.store.backend import Store, WriteView
from tidings.store.backends.memory import MemoryStore
from tidings.structs import Message, MessageId
from tidings.tx import TransactionManager, TxConfig

T = TypeVar("T")


def _fail_next_write(store: Store, monkeypatch: pytest.MonkeyPatch, *, at_once: bool) -> None:
    """The store's next write fails as a full store's does: its submit raises
    (``at_once``), or the future it returns fails."""
    submit = store.submit

    def full(fn: Callable[[WriteView], T]) -> Future[T]:
        monkeypatch.setattr(store, "submit", submit)
        if at_once:
            raise StoreFull("the store is full")

        def refused(view: WriteView) -> T:
            raise StoreFull("the store is full")

        return submit(refused)

    monkeypatch.setattr(store, "submit", full)


class _Queue:
    """A queue "q" of topic "t" over a memory store, and what a caller sees of it."""

    def __init__(self, tmp_path: Path, payloads: list[bytes]) -> None:
        self.store = MemoryStore()
        self.messaging = MessagingService(self.store)
        self.messaging.create_topic("ns", "t")
        self.messaging.publish("ns", "t", payloads)
        self.tx = TransactionManager(tmp_path / "tx", TxConfig(sweep_interval=3600))
        self.now = [1000.0]
        self.queues = QueueCoordinator(
            self.store, self.messaging, self.tx, clock=lambda: self.now[0]
        )

    def pop(self, worker: str, n: int, **kwargs: Any) -> list[Message]:
        snap = self.tx.snapshot()
        assert snap is not None
        return self.queues.pop(
            "ns", "t", "q", worker, max_messages=n, snapshot=snap, ack_timeout_ms=5000, **kwargs
        )

    def seen(self) -> tuple[object, ...]:
        """Leases per worker, depth, counters and rates."""
        s = self.queues.describe("ns", "t", "q")
        return (
            s.consumers,
            s.pending,
            s.waiting,
            s.read,
            s.cursor,
            (s.popped, s.acked, s.nacked, s.redelivered, s.dead_lettered, s.expired),
            (s.pop_rate, s.ack_rate),
        )


@contextmanager
def _queue(tmp_path: Path, payloads: list[bytes]) -> Iterator[_Queue]:
    q = _Queue(tmp_path, payloads)
    with q.tx:
        yield q


def _payloads(messages: list[Message]) -> list[tuple[bytes, int]]:
    return [(m.payload, m.delivery_count) for m in messages]


@pytest.mark.parametrize("keep_leases", [False, True])
@pytest.mark.parametrize("at_once", [False, True])
def test_a_failed_rollback_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, keep_leases: bool, at_once: bool
) -> None:
    with _queue(tmp_path, [b"a", b"b", b"c", b"d", b"e"]) as q:
        mine = q.pop("w1", 3)
        t = q.tx.begin()
        acked = [m.id for m in mine[:2]]
        q.queues.ack("ns", "t", "q", "w1", acked, write_pointer=t.write_pointer)
        theirs = q.pop("w2", 1)  # not written: a pop writes nothing
        before = q.seen()
        _fail_next_write(q.store, monkeypatch, at_once=at_once)
        with pytest.raises(StoreFull):
            q.queues.rollback("ns", "t", "q", t.write_pointer, keep_leases=keep_leases)
        assert q.seen() == before
        # The acks still wait on their transaction: nobody else gets those messages,
        # nor w2's.
        assert _payloads(q.pop("w3", 10)) == [(b"e", 1)]
        q.tx.commit(t.write_pointer, [])
        q.queues.ack("ns", "t", "q", "w1", [mine[2].id])
        q.queues.ack("ns", "t", "q", "w2", [theirs[0].id])
        assert q.queues.describe("ns", "t", "q").consumers == {"w3": 1}
        assert q.queues.describe("ns", "t", "q").acked == 4


@pytest.mark.parametrize("at_once", [False, True])
def test_a_rollback_after_a_failed_one_gives_the_messages_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, at_once: bool
) -> None:
    with _queue(tmp_path, [b"a", b"b"]) as q:
        mine = q.pop("w1", 2)
        t = q.tx.begin()
        q.queues.ack("ns", "t", "q", "w1", [mine[0].id], write_pointer=t.write_pointer)
        _fail_next_write(q.store, monkeypatch, at_once=at_once)
        with pytest.raises(StoreFull):
            q.queues.rollback("ns", "t", "q", t.write_pointer)
        assert q.queues.rollback("ns", "t", "q", t.write_pointer) == 1
        assert _payloads(q.pop("w2", 10)) == [(b"a", 2)]


@pytest.mark.parametrize("at_once", [False, True])
def test_a_failed_purge_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, at_once: bool
) -> None:
    with _queue(tmp_path, [b"a", b"b", b"c", b"d", b"e", b"f"]) as q:
        first = q.pop("w1", 2)
        q.queues.nack("ns", "t", "q", "w1", [first[1].id])  # written: "b" returned
        t = q.tx.begin()
        q.queues.ack("ns", "t", "q", "w1", [first[0].id], write_pointer=t.write_pointer)
        theirs = q.pop("w2", 2)  # "b" again and "c": not written
        assert _payloads(theirs) == [(b"b", 2), (b"c", 1)]
        before = q.seen()
        _fail_next_write(q.store, monkeypatch, at_once=at_once)
        with pytest.raises(StoreFull):
            q.queues.purge("ns", "t", "q")
        assert q.seen() == before
        # w2 keeps its lease, the transaction holding w1's ack is still open, and the
        # next pop gets what it would have got.
        q.tx.check_writable(t.write_pointer)
        assert _payloads(q.pop("w3", 10)) == [(b"d", 1), (b"e", 1), (b"f", 1)]
        q.queues.ack("ns", "t", "q", "w2", [m.id for m in theirs])
        q.tx.commit(t.write_pointer, [])
        assert q.queues.describe("ns", "t", "q").acked == 3
        # A purge whose write lands still acks everything.
        assert q.queues.purge("ns", "t", "q") == 3
        assert q.pop("w4", 10) == []


def _call(q: _Queue, call: str, ids: list[MessageId], write_pointer: int | None) -> None:
    queues = q.queues
    if call == "ack":
        queues.ack("ns", "t", "q", "w1", ids, write_pointer=write_pointer)
    elif call == "ack_nowait":  # the event loop's
        snap = q.tx.snapshot()
        assert snap is not None
        done = queues.ack_nowait("ns", "t", "q", "w1", ids, snapshot=snap)
        assert done is not None
        done.result()
    elif call == "nack":
        queues.nack("ns", "t", "q", "w1", ids)
    elif call == "release":
        queues.release("ns", "t", "q", "w1")
    else:
        queues.extend("ns", "t", "q", "w1", ids, ack_timeout_ms=600_000)


@pytest.mark.parametrize(
    "call", ["ack", "ack_nowait", "transactional ack", "nack", "release", "extend"]
)
def test_a_call_whose_store_refuses_its_write_at_once_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, call: str
) -> None:
    with _queue(tmp_path, [b"a", b"b", b"c"]) as q:
        mine = q.pop("w1", 2)
        before = q.seen()
        t = q.tx.begin() if call == "transactional ack" else None
        _fail_next_write(q.store, monkeypatch, at_once=True)
        with pytest.raises(StoreFull):
            _call(q, call.split()[-1], [mine[0].id], None if t is None else t.write_pointer)
        assert q.seen() == before
        # Still w1's, under the deadline the pop gave them.
        assert _payloads(q.pop("w2", 10)) == [(b"c", 1)]
        q.now[0] += 5
        assert _payloads(q.pop("w3", 10)) == [(b"a", 2), (b"b", 2), (b"c", 2)]


def test_a_failed_settings_change_leaves_the_queue_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with _queue(tmp_path, [b"a"]) as q:
        first = q.pop("w1", 1, max_deliveries=5)
        _fail_next_write(q.store, monkeypatch, at_once=True)
        with pytest.raises(StoreFull):
            q.pop("w1", 1, max_deliveries=1)
        assert q.queues.describe("ns", "t", "q").max_deliveries == 5
        q.queues.nack("ns", "t", "q", "w1", [first[0].id])
        assert _payloads(q.pop("w2", 1)) == [(b"a", 2)]  # not dead-lettered


def test_a_failed_ack_takes_its_count_back_from_the_ack_rate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with _queue(tmp_path, [b"a", b"b"]) as q:
        mine = q.pop("w1", 2)
        q.queues.ack("ns", "t", "q", "w1", [mine[0].id])
        rates = q.seen()[-1]
        assert rates[1] > 0
        _fail_next_write(q.store, monkeypatch, at_once=False)
        with pytest.raises(StoreFull):
            q.queues.ack("ns", "t", "q", "w1", [mine[1].id])
        assert q.seen()[-1] == rates


@pytest.mark.parametrize("at_once", [False, True])
def test_a_pop_whose_dead_lettering_fails_takes_its_count_back_from_the_pop_rate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, at_once: bool
) -> None:
    with _queue(tmp_path, [b"poison", b"fine"]) as q:
        got = q.pop("w1", 1, max_deliveries=1)
        q.queues.nack("ns", "t", "q", "w1", [got[0].id])
        rates = q.seen()[-1]
        publish = q.messaging.publish_with_future

        def fails_once(*args: Any) -> Future[Any]:
            monkeypatch.setattr(q.messaging, "publish_with_future", publish)
            if at_once:
                raise StoreFull("the store is full")
            failed: Future[Any] = Future()
            failed.set_exception(StoreFull("the store is full"))
            return failed

        monkeypatch.setattr(q.messaging, "publish_with_future", fails_once)
        with pytest.raises(StoreFull):
            q.pop("w2", 2)
        assert q.seen()[-1] == rates
        assert _payloads(q.pop("w3", 2)) == [(b"fine", 1)]
        assert q.seen()[-1][0] > rates[0]


def test_a_dead_lettering_that_fails_after_a_purge_landed_leaves_the_queue_purged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with _queue(tmp_path, [b"poison", b"fine"]) as q:
        got = q.pop("w1", 1, max_deliveries=1)
        q.queues.nack("ns", "t", "q", "w1", [got[0].id])
        publish = q.messaging.publish_with_future
        pending: Future[None] = Future()

        def later(*args: Any) -> Future[Any]:
            monkeypatch.setattr(q.messaging, "publish_with_future", publish)
            return pending

        monkeypatch.setattr(q.messaging, "publish_with_future", later)
        with ThreadPoolExecutor(1) as pool:
            popping = pool.submit(q.pop, "w2", 2)
            deadline = time.monotonic() + 10
            while q.messaging.publish_with_future is later:
                assert time.monotonic() < deadline
                time.sleep(0.01)
            assert q.queues.purge("ns", "t", "q") == 1  # "fine", leased to w2
            pending.set_exception(StoreFull("the store is full"))
            with pytest.raises(StoreFull):
                popping.result(timeout=10)
        stats = q.queues.describe("ns", "t", "q")
        assert (stats.consumers, stats.pending, stats.waiting) == ({}, 0, 0)
        assert (stats.popped, stats.dead_lettered) == (1, 0)
        assert q.pop("w3", 10) == []


@pytest.mark.parametrize("at_once", [False, True])
def test_a_message_whose_dead_lettering_failed_keeps_its_deliveries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, at_once: bool
) -> None:
    # Its deliveries since the last write were in memory only: the rebuild after the
    # failure must not take them back, or it would be delivered again, not
    # dead-lettered.
    with _queue(tmp_path, [b"poison", b"fine"]) as q:
        got = q.pop("w1", 1, max_deliveries=3)
        q.queues.nack("ns", "t", "q", "w1", [got[0].id])  # written: 1 delivery
        for _ in range(2):  # deliveries 2 and 3, written nowhere
            assert _payloads(q.pop("w1", 1)) == [(b"poison", _ + 2)]
            q.now[0] += 6
        publish = q.messaging.publish_with_future

        def fails_once(*args: Any) -> Future[Any]:
            monkeypatch.setattr(q.messaging, "publish_with_future", publish)
            if at_once:
                raise StoreFull("the store is full")
            failed: Future[Any] = Future()
            failed.set_exception(StoreFull("the store is full"))
            return failed

        monkeypatch.setattr(q.messaging, "publish_with_future", fails_once)
        with pytest.raises(StoreFull):
            q.pop("w2", 1)
        assert _payloads(q.pop("w2", 1)) == [(b"fine", 1)]
        assert [m.payload for m in q.messaging.fetch("ns", "t-dlq")] == [b"poison"]


def test_a_failed_write_leaves_the_workers_a_message_was_delivered_to(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The records name at most the worker holding a message: the rebuild takes the
    # ones before it from memory, so the calls' answers stay as they were.
    with _queue(tmp_path, [b"a", b"b", b"c"]) as q:
        first = q.pop("w1", 1)
        q.queues.nack("ns", "t", "q", "w1", [first[0].id])  # written: "a" returned
        q.pop("w2", 1)  # "a" again
        mine = q.pop("w1", 2)
        q.queues.ack("ns", "t", "q", "w1", [mine[1].id])  # written: w2 holds "a"
        _fail_next_write(q.store, monkeypatch, at_once=False)
        with pytest.raises(StoreFull):
            q.queues.ack("ns", "t", "q", "w1", [mine[0].id])
        with pytest.raises(AckConflict):  # passed on to w2, not "never delivered"
            q.queues.ack("ns", "t", "q", "w1", [first[0].id])


def test_a_failed_write_leaves_a_returned_message_ackable_by_its_last_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with _queue(tmp_path, [b"a", b"b"]) as q:
        got = q.pop("w1", 1)
        q.queues.nack("ns", "t", "q", "w1", [got[0].id])  # written: "a" returned
        _fail_next_write(q.store, monkeypatch, at_once=False)
        with pytest.raises(StoreFull):
            q.queues.ack("ns", "t", "q", "w1", [got[0].id])
        q.queues.ack("ns", "t", "q", "w1", [got[0].id])  # as before the failure
        assert _payloads(q.pop("w2", 10)) == [(b"b", 1)]


def test_a_failed_ack_is_not_remembered_as_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Once purged, an ack of the message is answered as done, not as one another
    # worker made.
    with _queue(tmp_path, [b"a"]) as q:
        first = q.pop("w1", 1)
        q.now[0] += 6
        q.pop("w2", 1)
        _fail_next_write(q.store, monkeypatch, at_once=False)
        with pytest.raises(StoreFull):
            q.queues.ack("ns", "t", "q", "w2", [first[0].id])
        assert q.queues.purge("ns", "t", "q") == 1
        q.queues.ack("ns", "t", "q", "w1", [first[0].id])
