"""Queue calls whose store write fails change nothing a caller can see: the rollback
of a transaction's acks, a purge, and the calls of a store that refuses a write at
once (its submit raises, rather than returning a failed future). In process, as a
store write cannot be made to fail inside a server process."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tidings.consumers.queues import QueueCoordinator
from tidings.errors import StoreFull
from tidings.messaging import MessagingService
from tidings.store.backend import Store, WriteView
from tidings.store.backends.memory import MemoryStore
from tidings.structs import Message
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
