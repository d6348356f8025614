"""The background publisher against a fake client: batching, futures, flush, retries."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import Future
from typing import Any, cast

import pytest

from tidings.client import AsyncClient, AsyncPublisher, Client, Publisher, RetryPolicy
from tidings.client.base import ProducerLane, as_record
from tidings.client.batching import Batcher
from tidings.errors import RequestTimeout, TidingsConnectionError, TopicNotFound
from tidings.structs import Record

FAST_RETRY = RetryPolicy(attempts=3, initial_backoff=0.001, max_backoff=0.002)


def batcher(**kw: Any) -> Batcher[int]:
    args = {
        "max_batch_messages": 3,
        "max_batch_bytes": 100,
        "buffer_messages": 5,
        "buffer_bytes": 1000,
        "linger": 1.0,
    }
    return Batcher(**{**args, **kw})


def test_batches_are_per_topic_in_send_order_and_bounded() -> None:
    b = batcher()
    for i, topic in enumerate(["a", "b", "a", "a", "a"]):
        b.add(topic, Record(bytes([i])), i, now=0.0)
    taken = b.take()
    assert taken is not None
    topic, batch = taken
    assert topic == "a" and [p.future for p in batch] == [0, 2, 3]  # max 3 per batch
    taken = b.take()
    assert taken is not None and taken[0] == "b"  # the oldest head next
    taken = b.take()
    assert taken is not None and [p.future for p in taken[1]] == [4]
    assert b.take() is None and b.buffered == 0


def test_batch_bytes_and_buffer_room() -> None:
    b = batcher(max_batch_bytes=10, buffer_messages=2, buffer_bytes=12)
    assert b.has_room(500)  # an empty buffer takes any one message
    b.add("a", Record(b"x" * 6), 0, now=0.0)
    assert not b.has_room(7) and b.has_room(6)
    b.add("a", Record(b"y" * 6), 1, now=0.0)
    assert not b.has_room(0)  # two messages is the count limit
    taken = b.take()
    assert taken is not None and len(taken[1]) == 1  # 12 bytes exceed the batch limit


def test_linger_and_flush_decide_when_a_batch_is_due() -> None:
    b = batcher(linger=0.5)
    assert b.next_due(0.0, urgent=False) is None
    b.add("a", Record(b"x"), 0, now=10.0)
    assert b.next_due(10.1, urgent=False) == pytest.approx(0.4)
    assert b.next_due(10.1, urgent=True) == 0
    assert b.next_due(10.6, urgent=False) == 0
    for i in range(2):
        b.add("a", Record(b"x"), i, now=10.0)
    assert b.next_due(10.0, urgent=False) == 0  # a full batch goes at once


def test_resolved_through_tracks_out_of_order_completion() -> None:
    b = batcher()
    items = [b.add(t, Record(b"x"), i, now=0.0) for i, t in enumerate("aba")]
    assert not b.resolved_through(0)
    b.resolve([items[1]])
    assert not b.resolved_through(1)
    b.resolve([items[0], items[2]])
    assert b.resolved_through(2) and b.unresolved == 0


class FakeClient:
    """``publish`` records batches; ``failures`` are raised first, one per call."""

    def __init__(self, *failures: BaseException, delay: float = 0.0) -> None:
        self.batches: list[tuple[str, list[bytes]]] = []
        self.failures = list(failures)
        self.calls = 0
        self.gate = threading.Event()
        self.gate.set()

    def publish(self, topic: str, records: list[Record | bytes]) -> None:
        self.gate.wait()
        self.calls += 1
        if self.failures:
            raise self.failures.pop(0)
        self.batches.append((topic, [as_record(r).payload for r in records]))

    def _new_lane(self) -> None:
        return None  # not idempotent: what the publisher sends is all there is to see

    def _publish_on(
        self,
        topic: str,
        records: list[Record | bytes],
        lane: None,
        policy: object = None,
        cancel: object = None,
    ) -> None:
        self.publish(topic, records)


def publisher(client: FakeClient, **kw: Any) -> Publisher:
    return Publisher(cast(Client, client), retry=FAST_RETRY, **kw)


def test_futures_resolve_once_durable_and_flush_waits() -> None:
    client = FakeClient()
    with publisher(client, max_batch_messages=2, linger=10) as pub:
        futures = [pub.send("t", f"m{i}") for i in range(5)]
        pub.flush(timeout=5)
        assert all(f.done() and f.result() is None for f in futures)
        assert sum(len(b) for _, b in client.batches) == 5
        assert [p for _, b in client.batches for p in b] == [f"m{i}".encode() for i in range(5)]
        assert max(len(b) for _, b in client.batches) == 2
        assert pub.sent == 5 and pub.failed == 0


def test_linger_sends_without_flush() -> None:
    client = FakeClient()
    with publisher(client, linger=0.01) as pub:
        pub.send("t", b"x").result(timeout=5)
    assert client.batches == [("t", [b"x"])]


def test_retriable_errors_are_retried() -> None:
    client = FakeClient(TidingsConnectionError("down"), RequestTimeout("slow"))
    with publisher(client) as pub:
        pub.send("t", b"x").result(timeout=5)
    assert client.calls == 3 and pub.sent == 1


def test_when_retries_run_out_the_batch_is_dropped_and_reported() -> None:
    errors = [TidingsConnectionError(f"down {i}") for i in range(3)]
    client = FakeClient(*errors)
    reported: list[tuple[str, list[bytes], BaseException]] = []
    with publisher(
        client, on_error=lambda t, recs, e: reported.append((t, [r.payload for r in recs], e))
    ) as pub:
        lost = pub.send("t", b"lost")
        pub.flush(timeout=5)
        kept = pub.send("t", b"kept")  # the publisher goes on
    with pytest.raises(TidingsConnectionError, match="down 2"):
        lost.result()
    assert kept.result() is None
    assert reported == [("t", [b"lost"], errors[2])]
    assert (pub.sent, pub.failed, client.calls) == (1, 1, 4)
    assert client.batches == [("t", [b"kept"])]


def test_errors_no_retry_can_fix_fail_at_once() -> None:
    client = FakeClient(TopicNotFound("no t"))
    with publisher(client) as pub:
        future = pub.send("t", b"x")
        pub.flush()
    with pytest.raises(TopicNotFound):
        future.result()
    assert client.calls == 1


def test_a_full_buffer_blocks_send_until_timeout() -> None:
    client = FakeClient()
    client.gate.clear()  # the sender hangs in its first publish
    pub = publisher(client, buffer_messages=1, max_batch_messages=1, linger=0)
    try:
        pub.send("t", b"1")
        deadline_hit = False
        # The first message may be taken by the sender; fill what room is left.
        try:
            for _ in range(3):
                pub.send("t", b"more", timeout=0.05)
        except RequestTimeout:
            deadline_hit = True
        assert deadline_hit
    finally:
        client.gate.set()
        pub.close(timeout=5)


def test_cancelled_futures_are_not_sent() -> None:
    client = FakeClient()
    pub = publisher(client, linger=10)
    future: Future[None] = pub.send("t", b"x")
    assert future.cancel()
    pub.send("t", b"y")
    pub.close(timeout=5)
    assert client.batches == [("t", [b"y"])]
    with pytest.raises(RuntimeError):
        pub.send("t", b"z")


def test_flush_timeout() -> None:
    client = FakeClient()
    client.gate.clear()
    pub = publisher(client)
    pub.send("t", b"x")
    with pytest.raises(TimeoutError):
        pub.flush(timeout=0.05)
    client.gate.set()
    pub.close(timeout=5)


class AsyncFakeClient:
    def __init__(self, inner: FakeClient) -> None:
        self.inner = inner

    async def publish(self, topic: str, records: list[Record | bytes]) -> None:
        await asyncio.sleep(0)
        self.inner.publish(topic, records)

    def _new_lane(self) -> None:
        return None

    async def _publish_on(
        self,
        topic: str,
        records: list[Record | bytes],
        lane: None,
        policy: object = None,
        cancel: object = None,
    ) -> None:
        await self.publish(topic, records)


async def test_async_publisher_batches_flushes_and_reports_failures() -> None:
    inner = FakeClient(
        TidingsConnectionError("a"), TidingsConnectionError("b"), TidingsConnectionError("c")
    )
    reported: list[str] = []
    pub = AsyncPublisher(
        cast(AsyncClient, AsyncFakeClient(inner)),
        retry=FAST_RETRY,
        max_batch_messages=2,
        linger=10,
        on_error=lambda t, recs, e: reported.append(str(e)),
    )
    async with pub:
        lost = await pub.send("t", b"lost")
        await pub.flush(timeout=5)
        futures = [await pub.send("t", f"m{i}") for i in range(5)]
        await pub.flush(timeout=5)
        assert all(f.done() and f.exception() is None for f in futures)
    with pytest.raises(TidingsConnectionError):
        await lost
    assert reported == ["c"]
    assert [len(b) for _, b in inner.batches] == [2, 2, 1]
    assert (pub.sent, pub.failed) == (5, 1)
    with pytest.raises(RuntimeError):
        await pub.send("t", b"late")


async def test_async_publisher_linger() -> None:
    inner = FakeClient()
    async with AsyncPublisher(cast(AsyncClient, AsyncFakeClient(inner)), linger=0.01) as pub:
        await asyncio.wait_for(await pub.send("t", b"x"), 5)
    assert inner.batches == [("t", [b"x"])]


class IdempotentFakeClient(FakeClient):
    """Records the producer id and sequence each try was sent under."""

    def __init__(self, *failures: BaseException) -> None:
        super().__init__(*failures)
        self.tries: list[tuple[str, int, list[bytes]]] = []

    def _new_lane(self) -> ProducerLane:  # type: ignore[override]
        return ProducerLane()

    def _publish_on(  # type: ignore[override]
        self,
        topic: str,
        records: list[Record | bytes],
        lane: ProducerLane,
        policy: object = None,
        cancel: object = None,
    ) -> None:
        payloads = [as_record(r).payload for r in records]
        self.tries.append((lane.producer_id, lane.sequence(topic), payloads))
        self.publish(topic, records)
        lane.advance(topic)


def test_a_batch_is_retried_under_the_same_producer_sequence() -> None:
    # So that a try whose answer was lost after it was stored is not stored again:
    # the server answers the retry of a sequence it wrote without a second copy.
    client = IdempotentFakeClient(TidingsConnectionError("lost"), RequestTimeout("slow"))
    with publisher(client) as pub:
        pub.send("t", b"a").result(timeout=5)
        pub.send("t", b"b").result(timeout=5)
    first, retry, again, second = client.tries
    assert first == retry == again == (first[0], 0, [b"a"])
    assert second == (first[0], 1, [b"b"])


def test_after_a_dropped_batch_the_publisher_takes_a_new_producer() -> None:
    # The dropped batch may or may not have been written: its sequence is unknown.
    client = IdempotentFakeClient(*[TidingsConnectionError(f"down {i}") for i in range(3)])
    with publisher(client) as pub:
        lost = pub.send("t", b"lost")
        pub.flush(timeout=5)
        pub.send("t", b"kept").result(timeout=5)
    with pytest.raises(TidingsConnectionError):
        lost.result()
    dropped = {producer for producer, _, payloads in client.tries if payloads == [b"lost"]}
    assert len(dropped) == 1
    ((producer, sequence, _),) = [t for t in client.tries if t[2] == [b"kept"]]
    assert producer not in dropped and sequence == 0
