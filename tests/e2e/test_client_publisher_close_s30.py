"""A background publisher's close(timeout) that runs out of time stops its sender:
the request in flight is cut off, nothing is sent after close returned, and every
future is settled with an error. Against the real server through
:class:`~tests.e2e.faultproxy.FaultProxy`, which holds publishes far longer than the
close waits (and the clients here wait for ever: no timeout)."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest

from tests.e2e.faultproxy import Fault, FaultProxy
from tests.e2e.serverproc import ServerProcess
from tidings import AsyncClient, Client
from tidings.client.asyncio_transport import AsyncioTransport
from tidings.client.socket_transport import SocketTransport
from tidings.client.transports import Cancellation, Request
from tidings.errors import RequestTimeout, TidingsConnectionError

pytestmark = pytest.mark.e2e

HELD = 2.0


@pytest.fixture
def proxy(server: ServerProcess) -> Iterator[FaultProxy]:
    port = urlsplit(server.url).port
    assert port is not None
    with FaultProxy(port, delay=HELD, matches=lambda line: b"/publish" in line) as p:
        p.load([Fault.DELAY] * 5)
        yield p


def fresh_topic(server: ServerProcess) -> str:
    name = "pc-" + uuid.uuid4().hex[:12]
    with Client(server.url) as client:
        client.create_topic(name)
    return name


def senders() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "tidings-publisher"]


def test_sync_close_out_of_time_stops_the_sender(server: ServerProcess, proxy: FaultProxy) -> None:
    topic = fresh_topic(server)
    before = senders()
    with Client(proxy.url, timeout=None) as client:
        publisher = client.publisher(max_batch_messages=1)
        futures = [publisher.send(topic, f"m{i}") for i in range(3)]
        time.sleep(0.2)  # the first batch is on its way, held by the proxy
        assert len(proxy.requests) == 1
        began = time.monotonic()
        with pytest.raises(TimeoutError):
            publisher.close(timeout=0.3)
        assert time.monotonic() - began < 1.5
        assert [t for t in senders() if t not in before] == []
        assert all(isinstance(f.exception(0), RequestTimeout) for f in futures)
        assert publisher.failed == 3
        time.sleep(0.3)
        assert len(proxy.requests) == 1  # nothing sent after close returned


async def test_async_close_out_of_time_stops_the_sender(
    server: ServerProcess, proxy: FaultProxy
) -> None:
    topic = fresh_topic(server)
    async with AsyncClient(proxy.url, timeout=None) as client:
        publisher = client.publisher(max_batch_messages=1)
        futures = [await publisher.send(topic, f"m{i}") for i in range(3)]
        await asyncio.sleep(0.2)
        assert len(proxy.requests) == 1
        began = time.monotonic()
        with pytest.raises(TimeoutError):
            await publisher.close(timeout=0.3)
        assert time.monotonic() - began < 1.5
        running = [t for t in asyncio.all_tasks() if t.get_name() == "tidings-publisher"]
        assert running == []
        assert all(isinstance(f.exception(), RequestTimeout) for f in futures)
        assert publisher.failed == 3
        await asyncio.sleep(0.3)
        assert len(proxy.requests) == 1


def test_a_cancelled_request_is_not_sent(server: ServerProcess, proxy: FaultProxy) -> None:
    topic = fresh_topic(server)
    cancel = Cancellation()
    cancel.cancel()
    request = Request(
        "POST",
        f"{proxy.url}/v1/namespaces/default/topics/{topic}/publish",
        b'{"messages": ["YQ=="]}',
        "application/json",
        5.0,
        cancel=cancel,
    )
    transport = SocketTransport()
    with pytest.raises(TidingsConnectionError):
        transport.send(request)
    transport.close()

    async def send_async() -> None:
        transport = AsyncioTransport()
        with pytest.raises(TidingsConnectionError):
            await transport.send(request)
        await transport.aclose()

    asyncio.run(send_async())
    assert proxy.requests == []
