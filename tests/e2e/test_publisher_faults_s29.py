"""Publishing through a network that loses requests, answers and time: plain
publishes, the background publisher and transactions, against the real server
through :class:`~tests.e2e.faultproxy.FaultProxy`. Whatever was acknowledged is in
its topic once and in order; what was reported failed is never there twice."""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
import uuid
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.e2e.faultproxy import Fault, FaultProxy
from tests.e2e.serverproc import ServerProcess
from tidings import AsyncClient, Client, RetryPolicy
from tidings.errors import RequestTimeout, TidingsError
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
def target(request: pytest.FixtureRequest) -> ServerProcess:
    """The session's server; TIDINGS_FAULT_STORE=postgres runs these tests on the
    PostgreSQL one instead."""
    if os.environ.get("TIDINGS_FAULT_STORE") == "postgres":
        proc: ServerProcess = request.getfixturevalue("pg_server")
    else:
        proc = request.getfixturevalue("server")
    return proc


@pytest.fixture(scope="module")
def proxy(target: ServerProcess) -> Iterator[FaultProxy]:
    port = urlsplit(target.url).port
    assert port is not None
    # Only writes are faulted: the checks read the server directly anyway.
    with FaultProxy(port, delay=DELAY, matches=lambda line: line.startswith(b"POST ")) as p:
        yield p


def fresh_topic(target: ServerProcess) -> str:
    name = "pf-" + uuid.uuid4().hex[:12]
    with Client(target.url) as client:
        client.create_topic(name)
    return name


def contents(target: ServerProcess, proxy: FaultProxy, topic: str) -> list[bytes]:
    proxy.wait_idle()
    with Client(target.url) as client:
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


@SETTINGS
@given(schedule=faults, sizes=st.lists(st.integers(1, 4), min_size=1, max_size=5))
def test_acknowledged_publishes_are_there_once_and_in_order(
    target: ServerProcess, proxy: FaultProxy, schedule: list[Fault], sizes: list[int]
) -> None:
    topic = fresh_topic(target)
    proxy.load(schedule)
    acked: list[bytes] = []
    failed: list[bytes] = []
    with Client(proxy.url, timeout=TIMEOUT, retry=RETRY) as client:
        for i, n in enumerate(sizes):
            records = keyed(str(i), n)
            payloads = [r.payload for r in records]
            try:
                client.publish(topic, records)
            except TidingsError:
                failed += payloads
            else:
                acked += payloads
    got = contents(target, proxy, topic)
    check(got, acked, failed)
    # One publish is written whole or not at all.
    for i, n in enumerate(sizes):
        there = [p for p in got if p.startswith(f"{i}-".encode())]
        assert len(there) in (0, n), (proxy.applied, got)


@SETTINGS
@given(
    schedule=faults,
    sends=st.lists(st.tuples(st.integers(0, 2), st.booleans()), min_size=1, max_size=30),
    max_batch=st.integers(1, 4),
)
def test_the_publisher_under_faults_keeps_its_word(
    target: ServerProcess,
    proxy: FaultProxy,
    schedule: list[Fault],
    sends: list[tuple[int, bool]],
    max_batch: int,
) -> None:
    topics = [fresh_topic(target) for _ in range(3)]
    proxy.load(schedule)
    reported: dict[str, list[bytes]] = {t: [] for t in topics}
    lock = threading.Lock()

    def on_error(topic: str, records: object, error: BaseException) -> None:
        assert isinstance(records, list)
        with lock:
            reported[topic] += [r if isinstance(r, bytes) else r.payload for r in records]

    futures: list[tuple[str, bytes, object]] = []
    with Client(proxy.url, timeout=TIMEOUT, retry=RETRY) as client:
        publisher = client.publisher(max_batch_messages=max_batch, retry=RETRY, on_error=on_error)
        for i, (which, flush) in enumerate(sends):
            topic = topics[which]
            record = Record(f"{i}".encode(), key=f"k{i % 2}".encode())
            futures.append((topic, record.payload, publisher.send(topic, record)))
            if flush:
                began = time.monotonic()
                with contextlib.suppress(TimeoutError):
                    publisher.flush(timeout=5)
                assert time.monotonic() - began < 5 + 1
        began = time.monotonic()
        with contextlib.suppress(TimeoutError):
            publisher.close(timeout=10)
        assert time.monotonic() - began < 10 + 2
    for topic in topics:
        acked: list[bytes] = []
        failed: list[bytes] = []
        for t, payload, future in futures:
            if t != topic:
                continue
            assert future.done()  # type: ignore[attr-defined]
            if future.exception() is None:  # type: ignore[attr-defined]
                acked.append(payload)
            else:
                failed.append(payload)
        # Failures are reported through on_error, each once.
        assert sorted(reported[topic]) == sorted(failed)
        check(contents(target, proxy, topic), acked, failed)
    assert publisher.sent + publisher.failed == len(sends)


@SETTINGS
@given(
    schedule=faults,
    txs=st.lists(st.integers(1, 3), min_size=1, max_size=3),
    one_request=st.booleans(),
    streamed=st.booleans(),
)
def test_a_transaction_is_there_whole_once_or_not_at_all(
    target: ServerProcess,
    proxy: FaultProxy,
    schedule: list[Fault],
    txs: list[int],
    one_request: bool,
    streamed: bool,
) -> None:
    topics = [fresh_topic(target) for _ in range(2)]
    with Client(target.url) as direct:
        first = direct.transactions().last_write_pointer
    proxy.load(schedule)
    committed: list[int] = []
    with Client(proxy.url, timeout=TIMEOUT, retry=RETRY) as client:
        for i, n in enumerate(txs):
            try:
                # Streamed: the payloads are stored as they come, and the commit
                # publishes the write pointer.
                threshold = 1 if streamed else 1 << 20
                with client.transaction(defer_begin=one_request, payload_threshold=threshold) as tx:
                    for topic in topics:
                        tx.publish(topic, keyed(f"{i}", n))
            except TidingsError:
                pass
            else:
                committed.append(i)
    proxy.wait_idle()
    with Client(target.url) as direct:
        # A transaction whose commit and invalidation were both lost stays open until
        # it times out (docs/client.md), and holds back what later ones published:
        # end it now, as its timeout would.
        for wp in direct.transactions().in_progress:
            if wp > first:
                direct.invalidate(wp)
    got = {t: contents(target, proxy, t) for t in topics}
    for topic in topics:
        assert len(got[topic]) == len(set(got[topic])), (proxy.applied, got)
    for i, n in enumerate(txs):
        counts = [len([p for p in got[t] if p.startswith(f"{i}-".encode())]) for t in topics]
        assert counts in ([0, 0], [n, n]), (proxy.applied, i, counts)
        if i in committed:
            assert counts == [n, n], (proxy.applied, i, counts)


# ---- the asyncio client (its own transport and sender task)


@SETTINGS
@given(schedule=faults, sizes=st.lists(st.integers(1, 4), min_size=1, max_size=5))
def test_async_acknowledged_publishes_are_there_once_and_in_order(
    target: ServerProcess, proxy: FaultProxy, schedule: list[Fault], sizes: list[int]
) -> None:
    topic = fresh_topic(target)
    proxy.load(schedule)
    acked: list[bytes] = []
    failed: list[bytes] = []

    async def main() -> None:
        async with AsyncClient(proxy.url, timeout=TIMEOUT, retry=RETRY) as client:
            for i, n in enumerate(sizes):
                records = keyed(str(i), n)
                payloads = [r.payload for r in records]
                try:
                    await client.publish(topic, records)
                except TidingsError:
                    failed.extend(payloads)
                else:
                    acked.extend(payloads)

    asyncio.run(main())
    check(contents(target, proxy, topic), acked, failed)


@SETTINGS
@given(
    schedule=faults,
    sends=st.lists(st.tuples(st.integers(0, 2), st.booleans()), min_size=1, max_size=30),
    max_batch=st.integers(1, 4),
    close_timeout=st.sampled_from([None, 0.05, 10.0]),
)
def test_the_async_publisher_under_faults_keeps_its_word(
    target: ServerProcess,
    proxy: FaultProxy,
    schedule: list[Fault],
    sends: list[tuple[int, bool]],
    max_batch: int,
    close_timeout: float | None,
) -> None:
    topics = [fresh_topic(target) for _ in range(3)]
    proxy.load(schedule)
    reported: dict[str, list[bytes]] = {t: [] for t in topics}
    futures: list[tuple[str, bytes, asyncio.Future[None]]] = []

    def on_error(topic: str, records: object, error: BaseException) -> None:
        assert isinstance(records, list)
        reported[topic] += [r if isinstance(r, bytes) else r.payload for r in records]

    async def main() -> tuple[int, int]:
        async with AsyncClient(proxy.url, timeout=TIMEOUT, retry=RETRY) as client:
            publisher = client.publisher(
                max_batch_messages=max_batch, retry=RETRY, on_error=on_error
            )
            for i, (which, flush) in enumerate(sends):
                topic = topics[which]
                record = Record(f"{i}".encode(), key=f"k{i % 2}".encode())
                futures.append((topic, record.payload, await publisher.send(topic, record)))
                if flush:
                    began = time.monotonic()
                    with contextlib.suppress(TimeoutError):
                        await publisher.flush(timeout=5)
                    assert time.monotonic() - began < 5 + 1
            began = time.monotonic()
            with contextlib.suppress(TimeoutError):
                await publisher.close(timeout=close_timeout)
            if close_timeout is not None:
                assert time.monotonic() - began < close_timeout + 1
            # Even after a close that ran out of time, nothing is left pending.
            assert all(f.done() for _, _, f in futures)
            return publisher.sent, publisher.failed

    sent, failed_count = asyncio.run(main())
    for topic in topics:
        acked: list[bytes] = []
        failed: list[bytes] = []
        for t, payload, future in futures:
            if t != topic:
                continue
            if future.exception() is None:
                acked.append(payload)
            else:
                failed.append(payload)
        assert sorted(reported[topic]) == sorted(failed)
        check(contents(target, proxy, topic), acked, failed)
    assert sent + failed_count == len(sends)


# ---- regressions


@pytest.fixture
def slow_proxy(target: ServerProcess) -> Iterator[FaultProxy]:
    """Publishes held 1 s each way: a batch is in flight well past a short close."""
    port = urlsplit(target.url).port
    assert port is not None
    with FaultProxy(port, delay=1.0, matches=lambda line: line.startswith(b"POST ")) as p:
        yield p


def test_close_that_runs_out_of_time_leaves_no_future_pending(
    target: ServerProcess, slow_proxy: FaultProxy
) -> None:
    # close(timeout) said "no message is left pending behind a closed publisher", yet
    # the batch in flight kept its futures pending until its request ended: up to the
    # client's timeout (30 s by default), or for ever without one.
    topic = fresh_topic(target)
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
    assert contents(target, slow_proxy, topic) in ([], [b"in flight"])


def test_async_close_that_runs_out_of_time_leaves_no_future_pending(
    target: ServerProcess, slow_proxy: FaultProxy
) -> None:
    topic = fresh_topic(target)
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
    assert contents(target, slow_proxy, topic) in ([], [b"in flight"])
