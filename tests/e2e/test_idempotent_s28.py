"""Idempotent producers and the background publisher, end to end: retries through the
real server and clients, outages, kill -9 and restart."""

from __future__ import annotations

import asyncio

import pytest

from tests.e2e.serverproc import free_port
from tidings import AsyncClient, Client, RetryPolicy, TidingsConnectionError
from tidings.client.asyncio_transport import AsyncioTransport
from tidings.client.socket_transport import SocketTransport
from tidings.client.transports import Request, Response

pytestmark = pytest.mark.e2e

QUICK = RetryPolicy(attempts=2, initial_backoff=0.01, max_backoff=0.02)


class CountingTransport(SocketTransport):
    """Counts the publish requests sent."""

    def __init__(self) -> None:
        super().__init__()
        self.publishes = 0

    def send(self, request: Request) -> Response:
        if request.url.endswith("/publish"):
            self.publishes += 1
        return super().send(request)


class AsyncCountingTransport(AsyncioTransport):
    def __init__(self) -> None:
        super().__init__()
        self.publishes = 0

    async def send(self, request: Request) -> Response:
        if request.url.endswith("/publish"):
            self.publishes += 1
        return await super().send(request)


def test_the_publisher_tries_a_batch_retry_attempts_times() -> None:
    # The publisher's ``retry`` is what decides how often a batch is sent (docs/client.md);
    # the client's own retry policy must not multiply it.
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    transport = CountingTransport()
    with Client(url, transport=transport, retry=RetryPolicy(attempts=4)) as client:
        with client.publisher(retry=QUICK) as publisher:
            future = publisher.send("events", b"x")
            publisher.flush(timeout=30)
        with pytest.raises(TidingsConnectionError):
            future.result(timeout=0)
    assert transport.publishes == QUICK.attempts


def test_the_async_publisher_tries_a_batch_retry_attempts_times() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    transport = AsyncCountingTransport()

    async def main() -> None:
        async with AsyncClient(url, transport=transport, retry=RetryPolicy(attempts=4)) as client:
            async with client.publisher(retry=QUICK) as publisher:
                future = await publisher.send("events", b"x")
                await publisher.flush(timeout=30)
            with pytest.raises(TidingsConnectionError):
                await future

    asyncio.run(main())
    assert transport.publishes == QUICK.attempts
