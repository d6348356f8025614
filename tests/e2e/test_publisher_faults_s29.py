"""Publishing through a network that loses requests, answers and time: plain
publishes, the background publisher and transactions, against the real server
through :class:`~tests.e2e.faultproxy.FaultProxy`. Whatever was acknowledged is in
its topic once and in order; what was reported failed is never there twice."""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from tests.e2e.faultproxy import Fault, FaultProxy
from tests.e2e.serverproc import ServerProcess
from tidings import AsyncClient, Client, RetryPolicy
from tidings.errors import RequestTimeout
from tidings.structs import Record

pytestmark = pytest.mark.e2e

#: Hunting bugs locally: TIDINGS_FAULT_EXAMPLES=500 runs far more schedules.
EXAMPLES = int(os.environ.get("TIDINGS_FAULT_EXAMPLES", "10"))
#: Longer than the clients' timeout below: a delayed request is given up on, and
#: reaches the server after its retry may have.
DELAY = 0.3
TIMEOUT = 0.2
RETRY = RetryPolicy(attempts=4, initial_backoff=0.01, max_backoff=0.02)
SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

faults = st.lists(st.sampled_from(list(Fault)), max_size=6)


@pytest.fixture(scope="module")
def proxy(server: ServerProcess) -> Iterator[FaultProxy]:
    port = urlsplit(server.url).port
    assert port is not None
    # Only writes are faulted: the checks read the server directly anyway.
    with FaultProxy(port, delay=DELAY, matches=lambda line: line.startswith(b"POST ")) as p:
        yield p


def fresh_topic(server: ServerProcess) -> str:
    name = "pf-" + uuid.uuid4().hex[:12]
    with Client(server.url) as client:
        client.create_topic(name)
    return name


def contents(server: ServerProcess, proxy: FaultProxy, topic: str) -> list[bytes]:
    proxy.wait_idle()
    with Client(server.url) as client:
        return [m.payload for m in client.consume(topic, follow=False, batch_size=1000)]


def check(got: list[bytes], acked: list[bytes], failed: list[bytes]) -> None:
    assert len(got) == len(set(got)), f"a message is there twice: {got}"
    known = set(acked) | set(failed)
    assert set(got) <= known, f"messages nobody sent: {set(got) - known}"
    assert set(acked) <= set(got), f"acknowledged, and lost: {set(acked) - set(got)}"
    # Acknowledged messages are there in the order they were given.
    acked_set = set(acked)
    assert [p for p in got if p in acked_set] == acked


def keyed(label: str, n: int) -> list[Record]:
    return [Record(f"{label}-{j}".encode(), key=f"k{j % 3}".encode()) for j in range(n)]


# ---- regressions


@pytest.fixture
def slow_proxy(server: ServerProcess) -> Iterator[FaultProxy]:
    """Publishes held 1 s each way: a batch is in flight well past a short close."""
    port = urlsplit(server.url).port
    assert port is not None
    with FaultProxy(port, delay=1.0, matches=lambda line: line.startswith(b"POST ")) as p:
        yield p


def test_close_that_runs_out_of_time_leaves_no_future_pending(
    server: ServerProcess, slow_proxy: FaultProxy
) -> None:
    # close(timeout) said "no message is left pending behind a closed publisher", yet
    # the batch in flight kept its futures pending until its request ended: up to the
    # client's timeout (30 s by default), or for ever without one.
    topic = fresh_topic(server)
    slow_proxy.load([Fault.DELAY])
    reported: list[tuple[str, list[bytes]]] = []

    def on_error(topic: str, records: object, error: BaseException) -> None:
        assert isinstance(records, list)
        reported.append((topic, [r.payload for r in records]))

    with Client(slow_proxy.url, timeout=10) as client:
        publisher = client.publisher(on_error=on_error)
        future = publisher.send(topic, b"in flight")
        time.sleep(0.2)  # taken by the sender, its request on its way
        began = time.monotonic()
        with pytest.raises(TimeoutError):
            publisher.close(timeout=0.3)
        assert time.monotonic() - began < 1.0
        assert future.done()
        assert isinstance(future.exception(), RequestTimeout)
        assert reported == [(topic, [b"in flight"])]
        assert (publisher.sent, publisher.failed) == (0, 1)
        # The request ends later: it changes nothing the publisher said.
        slow_proxy.wait_idle()
        time.sleep(0.1)
        assert (publisher.sent, publisher.failed) == (0, 1)
        assert reported == [(topic, [b"in flight"])]
    assert contents(server, slow_proxy, topic) in ([], [b"in flight"])


def test_async_close_that_runs_out_of_time_leaves_no_future_pending(
    server: ServerProcess, slow_proxy: FaultProxy
) -> None:
    topic = fresh_topic(server)
    slow_proxy.load([Fault.DELAY])
    reported: list[tuple[str, list[bytes]]] = []

    def on_error(topic: str, records: object, error: BaseException) -> None:
        assert isinstance(records, list)
        reported.append((topic, [r.payload for r in records]))

    async def main() -> None:
        async with AsyncClient(slow_proxy.url, timeout=10) as client:
            publisher = client.publisher(on_error=on_error)
            future = await publisher.send(topic, b"in flight")
            await asyncio.sleep(0.2)
            began = time.monotonic()
            with pytest.raises(TimeoutError):
                await publisher.close(timeout=0.3)
            assert time.monotonic() - began < 1.0
            assert future.done()
            assert isinstance(future.exception(), RequestTimeout)
            assert reported == [(topic, [b"in flight"])]
            assert (publisher.sent, publisher.failed) == (0, 1)
            await asyncio.sleep(2.2)  # the request ends meanwhile
            assert (publisher.sent, publisher.failed) == (0, 1)
            assert reported == [(topic, [b"in flight"])]

    asyncio.run(main())
    assert contents(server, slow_proxy, topic) in ([], [b"in flight"])
