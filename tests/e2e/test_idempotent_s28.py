"""Idempotent producers and the background publisher, end to end: retries through the
real server and clients, outages, kill -9 and restart."""

from __future__ import annotations

import asyncio
import shutil
import threading
import time
from collections.abc import Callable

import httpx
import pytest

from tests.e2e.serverproc import ServerProcess, free_port
from tidings import (
    AsyncClient,
    Client,
    Publisher,
    RetryPolicy,
    TidingsConnectionError,
    TopicNotFound,
)
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


class CrashesAfterTheFirstPublish(SocketTransport):
    """The first publish reaches the server and is written; then the server is killed
    (SIGKILL) before its answer is read, and started again on the same data."""

    def __init__(self, server: ServerProcess) -> None:
        super().__init__()
        self.server = server
        self.crashed = False

    def send(self, request: Request) -> Response:
        response = super().send(request)
        if request.url.endswith("/publish") and not self.crashed:
            self.crashed = True
            self.server.kill()
            self.server.start()
            raise TidingsConnectionError("connection reset while reading the answer")
        return response


class AsyncCrashesAfterTheFirstPublish(AsyncioTransport):
    def __init__(self, server: ServerProcess) -> None:
        super().__init__()
        self.server = server
        self.crashed = False

    async def send(self, request: Request) -> Response:
        response = await super().send(request)
        if request.url.endswith("/publish") and not self.crashed:
            self.crashed = True
            self.server.kill()
            self.server.start()
            raise TidingsConnectionError("connection reset while reading the answer")
        return response


def test_a_publish_whose_answer_a_crash_lost_is_written_once(
    start_server: Callable[..., ServerProcess], topic: str
) -> None:
    server = start_server()
    transport = CrashesAfterTheFirstPublish(server)
    with Client(server.url, transport=transport, retry=QUICK) as client:
        client.create_topic(topic)
        client.publish(topic, [b"one", b"two"])
        client.publish(topic, b"three")
        assert transport.crashed
        assert [m.payload for m in client.poll(topic)] == [b"one", b"two", b"three"]


def test_an_async_publish_whose_answer_a_crash_lost_is_written_once(
    start_server: Callable[..., ServerProcess], topic: str
) -> None:
    server = start_server()
    transport = AsyncCrashesAfterTheFirstPublish(server)

    async def main() -> list[bytes]:
        async with AsyncClient(server.url, transport=transport, retry=QUICK) as client:
            await client.create_topic(topic)
            await client.publish(topic, [b"one", b"two"])
            await client.publish(topic, b"three")
            return [m.payload for m in await client.poll(topic)]

    assert asyncio.run(main()) == [b"one", b"two", b"three"]
    assert transport.crashed


def test_the_publisher_keeps_order_and_one_copy_across_a_crash(
    start_server: Callable[..., ServerProcess], topic: str
) -> None:
    server = start_server()
    transport = CrashesAfterTheFirstPublish(server)
    with Client(server.url, transport=transport) as client:
        client.create_topic(topic)
        with client.publisher(retry=QUICK, max_batch_messages=3) as publisher:
            futures = [publisher.send(topic, f"m{i}") for i in range(10)]
        assert all(f.result(timeout=0) is None for f in futures)
        assert transport.crashed and publisher.sent == 10
        got = [m.payload for m in client.poll(topic)]
        assert got == [f"m{i}".encode() for i in range(10)]


def test_a_producer_goes_on_after_expiry_a_restart_and_a_topic_recreated(
    start_server: Callable[..., ServerProcess], topic: str
) -> None:
    # Whatever the server forgot of a producer (expired, or its topic deleted and made
    # again), the client's next publish under it is written: nothing is stuck.
    server = start_server(TIDINGS_PRODUCER_EXPIRY="1", TIDINGS_CLEANUP_INTERVAL="0.2")
    with Client(server.url, retry=QUICK) as client:
        client.create_topic(topic)
        client.create_topic(topic + "-b")
        client.publish(topic, b"1")
        client.publish(topic + "-b", b"b1")  # several topics under one producer
        with pytest.raises(TopicNotFound):
            client.publish("missing-" + topic, b"x")
        client.publish(topic, b"2")
        server.kill()
        server.start()
        time.sleep(2)  # past the expiry, across the restart
        client.publish(topic, b"3")
        client.delete_topic(topic + "-b")
        client.create_topic(topic + "-b")
        client.publish(topic + "-b", b"b2")
        assert [m.payload for m in client.poll(topic)] == [b"1", b"2", b"3"]
        assert [m.payload for m in client.poll(topic + "-b")] == [b"b2"]


SLOW = RetryPolicy(attempts=5, initial_backoff=0.5, max_backoff=0.5, jitter=0)


def test_close_with_a_timeout_drops_what_it_could_not_send(
    start_server: Callable[..., ServerProcess], topic: str
) -> None:
    # The server is down: close(timeout) gives up at the timeout, and every message
    # left is dropped and said so (its future fails, on_error, failed), not left
    # pending in a sender that goes on retrying after close returned.
    server = start_server()
    dropped: list[bytes] = []
    with Client(server.url) as client:
        client.create_topic(topic)
        server.kill()
        publisher = client.publisher(
            retry=SLOW,
            max_batch_messages=1,
            on_error=lambda t, recs, e: dropped.extend(r.payload for r in recs),
        )
        futures = [publisher.send(topic, f"m{i}") for i in range(6)]
        began = time.monotonic()
        with pytest.raises(TimeoutError):
            publisher.close(timeout=1.0)
        assert time.monotonic() - began < 1.8
        deadline = time.monotonic() + 5
        while publisher.failed < 6 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert publisher.failed == 6 and publisher.sent == 0
        assert all(f.done() and f.exception() is not None for f in futures)
        assert sorted(dropped) == sorted(f"m{i}".encode() for i in range(6))
        with pytest.raises(RuntimeError):
            publisher.send(topic, b"late")


def test_async_close_with_a_timeout_drops_what_it_could_not_send(
    start_server: Callable[..., ServerProcess], topic: str
) -> None:
    server = start_server()
    dropped: list[bytes] = []

    async def main() -> None:
        async with AsyncClient(server.url) as client:
            await client.create_topic(topic)
            server.kill()
            publisher = client.publisher(
                retry=SLOW,
                max_batch_messages=1,
                on_error=lambda t, recs, e: dropped.extend(r.payload for r in recs),
            )
            futures = [await publisher.send(topic, f"m{i}") for i in range(6)]
            began = time.monotonic()
            with pytest.raises(TimeoutError):
                await publisher.close(timeout=1.0)
            assert time.monotonic() - began < 1.8
            deadline = time.monotonic() + 5
            while publisher.failed < 6 and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert publisher.failed == 6 and publisher.sent == 0
            assert all(f.done() and f.exception() is not None for f in futures)

    asyncio.run(main())
    assert sorted(dropped) == sorted(f"m{i}".encode() for i in range(6))


class LosesTheFirstAnswer(SocketTransport):
    def __init__(self) -> None:
        super().__init__()
        self.lost = 0

    def send(self, request: Request) -> Response:
        response = super().send(request)
        if request.url.endswith("/publish") and not self.lost:
            self.lost += 1
            raise TidingsConnectionError("connection reset while reading the answer")
        return response


def test_a_retried_publish_is_counted_once(server: ServerProcess, topic: str) -> None:
    transport = LosesTheFirstAnswer()
    with Client(server.url, transport=transport, retry=QUICK) as client:
        client.create_topic(topic)
        client.publish(topic, [b"one", b"two"])
        assert transport.lost == 1
        stats = client.stats(topic)
        assert (stats.messages_published, stats.bytes_published) == (2, 6)
        assert stats.message_count == 2
    metrics = httpx.get(server.url + "/metrics").text
    line = f'tidings_messages_published_total{{namespace="default",topic="{topic}"}} 2.0'
    assert line in metrics.splitlines()


def test_a_client_goes_on_when_the_server_lost_its_producer_state(
    start_server: Callable[..., ServerProcess], topic: str
) -> None:
    # The store goes back to a copy taken earlier (a backup restored, a database failed
    # over to a replica that missed the last commits): the server's last sequence for
    # the producer is older than the client's, and its next publish is a gap. Nothing
    # of it was written, so the client sends it again under a new producer id instead
    # of failing it (the client's publish, and the background publisher's).
    server = start_server()
    backup = server.data_dir.parent / "backup"
    other = topic + "-p"
    with Client(server.url, retry=QUICK) as client:
        client.create_topic(topic)
        client.create_topic(other)
        with client.publisher(retry=QUICK) as publisher:
            client.publish(topic, b"1")
            publisher.send(other, b"p1").result(timeout=10)
            server.stop()
            shutil.copytree(server.data_dir, backup)
            server.start()
            client.publish(topic, b"2")
            client.publish(topic, b"3")
            publisher.send(other, b"p2").result(timeout=10)
            server.stop()
            shutil.rmtree(server.data_dir)
            shutil.copytree(backup, server.data_dir)
            server.start()
            client.publish(topic, b"4")
            client.publish(topic, b"5")
            publisher.send(other, b"p3").result(timeout=10)
        assert [m.payload for m in client.poll(topic)] == [b"1", b"4", b"5"]
        assert [m.payload for m in client.poll(other)] == [b"p1", b"p3"]


def test_a_producer_id_is_exactly_32_hex_digits(server: ServerProcess, topic: str) -> None:
    url = f"{server.url}/v1/namespaces/default/topics/{topic}/publish"
    with Client(server.url) as client:
        client.create_topic(topic)
        for producer in ("ab " * 15 + "ab", "ab\tab" + "ab" * 14, "AB" * 17):
            headers = {"Tidings-Producer-Id": producer, "Tidings-Sequence": "0"}
            bad = httpx.post(url, json={"messages": ["eA=="]}, headers=headers)
            assert bad.status_code == 400, producer
            assert bad.json()["type"] == "BadRequest"
        assert client.poll(topic) == []


def test_flush_or_close_from_on_error_does_not_wait_for_itself() -> None:
    # on_error runs on the sender: a flush() there waited for the sender, that is for
    # itself, forever; close() there (giving up on publishing) did too.
    url = f"http://127.0.0.1:{free_port()}"
    seen: list[str] = []
    with Client(url) as client:
        holder: list[Publisher] = []

        def on_error(topic: str, records: object, error: BaseException) -> None:
            try:
                holder[0].flush()
            except RuntimeError as exc:
                seen.append(f"flush: {exc}")
            holder[0].close()
            seen.append("closed")

        publisher = client.publisher(retry=RetryPolicy(attempts=1), on_error=on_error)
        holder.append(publisher)
        future = publisher.send("events", b"x")
        done = threading.Event()

        def close() -> None:
            publisher.close()
            done.set()

        threading.Thread(target=close, daemon=True).start()
        assert done.wait(10), "close() never returned"
        assert future.done()
        assert seen[0].startswith("flush: ") and seen[1] == "closed"
        with pytest.raises(RuntimeError):
            publisher.send("events", b"late")


def test_a_send_waiting_for_room_when_close_gives_up_is_refused(
    start_server: Callable[..., ServerProcess], topic: str
) -> None:
    server = start_server()
    with Client(server.url) as client:
        client.create_topic(topic)
        server.kill()
        publisher = client.publisher(retry=SLOW, max_batch_messages=1, buffer_messages=1)
        publisher.send(topic, b"in flight")
        time.sleep(0.1)  # taken by the sender
        publisher.send(topic, b"buffered")
        outcome: list[object] = []

        def send_more() -> None:
            try:
                outcome.append(publisher.send(topic, b"waiting", timeout=10))
            except RuntimeError as exc:
                outcome.append(exc)

        sender = threading.Thread(target=send_more, daemon=True)
        sender.start()
        time.sleep(0.2)  # waiting for room
        with pytest.raises(TimeoutError):
            publisher.close(timeout=0.5)
        sender.join(10)
        assert len(outcome) == 1 and isinstance(outcome[0], RuntimeError), outcome


def test_a_gap_changes_nothing_and_the_producer_goes_on(server: ServerProcess, topic: str) -> None:
    url = f"{server.url}/v1/namespaces/default/topics/{topic}/publish"

    def publish(seq: int, payload: str) -> httpx.Response:
        headers = {"Tidings-Producer-Id": "5a" * 16, "Tidings-Sequence": str(seq)}
        return httpx.post(url, json={"messages": [payload]}, headers=headers)

    with Client(server.url) as client:
        client.create_topic(topic)
        assert publish(7, "YQ==").status_code == 200  # a new producer may start anywhere
        before = client.stats(topic)
        gap = publish(9, "Yg==")
        assert gap.status_code == 409
        assert gap.json() == {
            "error": f"producer {'5a' * 16} sent sequence 9 to this topic: "
            "the last one written was 7",
            "type": "OutOfOrderSequence",
        }
        after = client.stats(topic)
        assert (after.message_count, after.messages_published) == (
            before.message_count,
            before.messages_published,
        )
        assert publish(8, "Yw==").status_code == 200  # the last sequence is still 7
        assert publish(8, "Yw==").status_code == 200  # and now 8: a retry, no copy
        assert [m.payload for m in client.poll(topic)] == [b"a", b"c"]


class RecordsStoreHeaders(SocketTransport):
    """Keeps the headers of every store request sent."""

    def __init__(self) -> None:
        super().__init__()
        self.store_headers: list[tuple[tuple[str, str], ...]] = []

    def send(self, request: Request) -> Response:
        if request.url.endswith("/store"):
            self.store_headers.append(request.headers)
        return super().send(request)


class AsyncRecordsStoreHeaders(AsyncioTransport):
    def __init__(self) -> None:
        super().__init__()
        self.store_headers: list[tuple[tuple[str, str], ...]] = []

    async def send(self, request: Request) -> Response:
        if request.url.endswith("/store"):
            self.store_headers.append(request.headers)
        return await super().send(request)


def test_a_store_with_producer_headers_is_refused_and_stores_nothing(
    server: ServerProcess, topic: str
) -> None:
    # A store is transactional: it is not deduplicated by producer sequence, so the
    # headers would promise what the server does not do.
    base = f"{server.url}/v1/namespaces/default/topics/{topic}"
    producer = {"Tidings-Producer-Id": "7c" * 16, "Tidings-Sequence": "0"}
    with Client(server.url) as client:
        client.create_topic(topic)
        wp = httpx.post(f"{server.url}/v1/transactions", json={}).json()["writePointer"]
        body = {"messages": ["eA=="], "transactionWritePointer": wp}
        for headers in (producer, {"Tidings-Sequence": "0"}, {"Tidings-Producer-Id": "7c" * 16}):
            refused = httpx.post(f"{base}/store", json=body, headers=headers)
            assert refused.status_code == 400, headers
            assert refused.json()["type"] == "BadRequest"
            assert "error" in refused.json()
        stored = httpx.post(f"{base}/store", json={**body, "messages": ["eQ=="]})
        assert stored.status_code == 200
        published = httpx.post(
            f"{base}/publish", json={"messages": [], "transactionWritePointer": wp}
        )
        assert published.status_code == 200
        assert httpx.post(f"{server.url}/v1/transactions/{wp}/commit", json={}).status_code == 200
        # Only the store without the headers was written.
        assert [m.payload for m in client.poll(topic)] == [b"y"]


def test_the_clients_store_without_producer_headers(server: ServerProcess, topic: str) -> None:
    transport = RecordsStoreHeaders()
    with Client(server.url, transport=transport) as client:  # idempotent by default
        client.create_topic(topic)
        tx = client.begin()
        client.store(topic, [b"a"], write_pointer=tx.write_pointer)
        client.publish(topic, [], write_pointer=tx.write_pointer)
        client.commit(tx)
        assert [m.payload for m in client.poll(topic)] == [b"a"]
    assert transport.store_headers == [()]


async def test_the_async_clients_store_without_producer_headers(
    server: ServerProcess, topic: str
) -> None:
    transport = AsyncRecordsStoreHeaders()
    async with AsyncClient(server.url, transport=transport) as client:
        await client.create_topic(topic)
        tx = await client.begin()
        await client.store(topic, [b"a"], write_pointer=tx.write_pointer)
        await client.publish(topic, [], write_pointer=tx.write_pointer)
        await client.commit(tx)
        assert [m.payload for m in await client.poll(topic)] == [b"a"]
    assert transport.store_headers == [()]
