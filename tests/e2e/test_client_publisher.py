"""The background publishers against a real server: batching, flush, futures, and what
happens when the server goes away and the retries run out."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from tests.e2e.serverproc import ServerProcess
from tidings import AsyncClient, Client, RetryPolicy, TidingsConnectionError, TopicNotFound
from tidings.structs import Record

pytestmark = pytest.mark.e2e

FAST_RETRY = RetryPolicy(attempts=3, initial_backoff=0.01, max_backoff=0.02)


class CountingAsyncClient(AsyncClient):
    """Counts the publishes the background publisher sends (each try)."""

    requests = 0

    async def _publish_on(
        self, topic: str, records: list[Any], lane: Any, policy: Any = None, cancel: Any = None
    ) -> None:
        self.requests += 1
        await super()._publish_on(topic, records, lane, policy, cancel)


class CountingClient(Client):
    requests = 0

    def _publish_on(
        self, topic: str, records: list[Any], lane: Any, policy: Any = None, cancel: Any = None
    ) -> None:
        self.requests += 1
        super()._publish_on(topic, records, lane, policy, cancel)


async def test_async_publisher_batches_and_resolves_every_future(
    server: ServerProcess, topic: str
) -> None:
    async with CountingAsyncClient(server.url) as client:
        await client.create_topic(topic)
        async with client.publisher(max_batch_messages=100, linger=0.05) as publisher:
            futures = [await publisher.send(topic, f"m{i}") for i in range(1000)]
            await publisher.flush()
            assert all(f.done() and f.exception() is None for f in futures)
            # After flush, a new message still gets sent (by linger) and resolves.
            await asyncio.wait_for(await publisher.send(topic, "last"), 10)
        assert 10 <= client.requests <= 60  # batched, not one request per message
        got = [m.payload async for m in client.consume(topic, follow=False, batch_size=1000)]
        assert got == [f"m{i}".encode() for i in range(1000)] + [b"last"]
        assert publisher.sent == 1001 and publisher.failed == 0


def test_sync_publisher_from_many_threads(server: ServerProcess, topic: str) -> None:
    from concurrent.futures import ThreadPoolExecutor

    with CountingClient(server.url) as client:
        client.create_topic(topic)
        with client.publisher(linger=0.02) as publisher:

            def send_all(n: int) -> list[Any]:
                return [publisher.send(topic, f"{n}-{i}") for i in range(100)]

            with ThreadPoolExecutor(4) as pool:
                futures = [f for batch in pool.map(send_all, range(4)) for f in batch]
        assert all(f.result(timeout=0) is None for f in futures)
        assert client.requests < 400
        got = [m.payload.decode() for m in client.consume(topic, follow=False)]
        assert len(got) == 400
        for n in range(4):  # each thread's messages keep their order
            mine = [p for p in got if p.startswith(f"{n}-")]
            assert mine == [f"{n}-{i}" for i in range(100)]


def test_when_retries_run_out_messages_are_dropped_and_reported(
    start_server: Callable[..., ServerProcess], topic: str
) -> None:
    server = start_server()
    dropped: list[tuple[str, Sequence[Record], BaseException]] = []
    with Client(server.url, timeout=2) as client:
        client.create_topic(topic)
        publisher = client.publisher(
            retry=FAST_RETRY, on_error=lambda t, r, e: dropped.append((t, r, e))
        )
        publisher.send(topic, b"before").result(timeout=10)
        missing = publisher.send("missing-" + topic, b"x")
        with pytest.raises(TopicNotFound):
            missing.result(timeout=10)  # not retriable: dropped at once
        server.kill()
        lost = [publisher.send(topic, f"lost{i}") for i in range(3)]
        publisher.flush(timeout=30)
        for future in lost:
            with pytest.raises(TidingsConnectionError):
                future.result(timeout=0)
        publisher.close()
    assert publisher.sent == 1 and publisher.failed == 4
    assert [len(records) for _, records, _ in dropped] == [1, 3]
    assert isinstance(dropped[1][2], TidingsConnectionError)
