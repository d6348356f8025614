"""A kept-alive connection the server closes for idleness just as the client takes it
again: a request that is not idempotent (a transaction's abort here) must not fail
for it, since the server never saw the request. Against the real server through
:class:`~tests.e2e.faultproxy.FaultProxy`, whose ``keep_alive`` plays the server's
idle timeout."""

from __future__ import annotations

import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest
import uvicorn

from tests.e2e.faultproxy import FaultProxy
from tests.e2e.serverproc import ServerProcess
from tidings import AsyncClient, Client
from tidings.client import socket_transport
from tidings.client.asyncio_transport import AsyncioTransport
from tidings.client.http1 import MAX_IDLE
from tidings.client.socket_transport import SocketTransport

pytestmark = pytest.mark.e2e

#: The proxy's idle timeout, and the transports' margin under it.
KEEP_ALIVE = 0.3
MAX_IDLE_UNDER = 0.15


@pytest.fixture
def proxy(server: ServerProcess) -> Iterator[FaultProxy]:
    port = urlsplit(server.url).port
    assert port is not None
    with FaultProxy(port) as p:
        p.keep_alive = KEEP_ALIVE
        yield p


def test_the_default_margin_is_under_the_servers_idle_timeout() -> None:
    # The server runs uvicorn with its default keep-alive timeout.
    assert 0 < MAX_IDLE < uvicorn.Config(app=None).timeout_keep_alive


def test_sync_a_connection_idle_past_the_margin_is_not_taken(proxy: FaultProxy) -> None:
    proxy.close_on_arrival = True  # the server's timer fires as the request arrives
    transport = SocketTransport(max_idle=MAX_IDLE_UNDER)
    with Client(proxy.url, transport=transport, timeout=5) as client:
        tx = client.begin()
        time.sleep(KEEP_ALIVE + 0.05)
        assert client.abort(tx).outcome == "aborted"
    assert proxy.idle_closed == 0


async def test_async_a_connection_idle_past_the_margin_is_not_taken(proxy: FaultProxy) -> None:
    proxy.close_on_arrival = True
    transport = AsyncioTransport(max_idle=MAX_IDLE_UNDER)
    async with AsyncClient(proxy.url, transport=transport, timeout=5) as client:
        tx = await client.begin()
        time.sleep(KEEP_ALIVE + 0.05)
        assert (await client.abort(tx)).outcome == "aborted"
    assert proxy.idle_closed == 0


async def test_async_a_connection_closed_before_the_loop_noticed_is_not_taken(
    proxy: FaultProxy,
) -> None:
    # The proxy closes the idle connection while the event loop is blocked: nothing
    # has told the transport yet when the abort takes a connection.
    transport = AsyncioTransport(max_idle=None)
    async with AsyncClient(proxy.url, transport=transport, timeout=5) as client:
        tx = await client.begin()
        time.sleep(KEEP_ALIVE + 0.2)  # blocking on purpose: the loop does not run
        assert proxy.idle_closed == 1
        assert (await client.abort(tx)).outcome == "aborted"


def test_sync_a_request_refused_before_any_byte_left_goes_again(
    proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The reset arrives just after the pooled connection was checked (the check is
    # made to miss it): the first write fails, with no byte of the abort sent.
    proxy.reset = True
    monkeypatch.setattr(socket_transport._Connection, "stale", lambda self: False)
    transport = SocketTransport(max_idle=None)
    with Client(proxy.url, transport=transport, timeout=5) as client:
        tx = client.begin()
        time.sleep(KEEP_ALIVE + 0.2)
        assert proxy.idle_closed == 1
        assert client.abort(tx).outcome == "aborted"
