"""Consumers reading ahead (docs/api.md poll headers): the poll for page N+1 goes out
before page N is decoded, and the messages, their order and read-committed visibility
are exactly those of one poll after another."""

from __future__ import annotations

import gc
import threading

import pytest

from tests.e2e.serverproc import ServerProcess
from tidings import AsyncClient, Client
from tidings.client import AsyncConsumer, Consumer
from tidings.client.transports import Urllib3Transport
from tidings.codec.wire import AVRO_EXT, JSON, Media
from tidings.structs import Message

pytestmark = pytest.mark.e2e


class UserAbort(Exception):
    pass


def _count_read_ahead(consumer: Consumer | AsyncConsumer) -> list[int]:
    """Count the polls a consumer sends ahead (wrapping its own method)."""
    sent = [0]
    original = consumer._send_ahead

    def spy(key):  # type: ignore[no-untyped-def]
        sent[0] += 1
        return original(key)

    consumer._send_ahead = spy  # type: ignore[method-assign]
    return sent


def _payloads(messages: list[Message]) -> list[bytes]:
    return [m.payload for m in messages]


def test_poll_headers_give_count_and_last_id(server: ServerProcess, topic: str) -> None:
    with Client(server.url) as client:
        client.create_topic(topic)
        client.publish(topic, [b"%d" % i for i in range(30)])
        everything = client.poll(topic, None, limit=100)
        api = client._api
        page = client._send(
            api.poll_page(topic, None, inclusive=True, limit=10, transaction=None, wait=0)
        )
        assert page.count == 10 and page.last_id == everything[9].id
        assert page.messages() == everything[:10]
        page = client._send(
            api.poll_page(
                topic, everything[-1].id, inclusive=False, limit=10, transaction=None, wait=0
            )
        )
        assert page.count == 0 and page.last_id is None and page.messages() == []


def _read_ahead_threads() -> int:
    return sum(t.name.startswith("tidings-read-ahead") for t in threading.enumerate())


@pytest.mark.parametrize("threaded", [False, True], ids=["socket", "urllib3"])
@pytest.mark.parametrize("total", [1000, 1037])
def test_sync_read_ahead_keeps_order_and_count(
    server: ServerProcess, topic: str, total: int, threaded: bool
) -> None:
    # The default transport sends the poll ahead and the consumer reads its answer
    # itself after decoding; a transport without that reads it in a worker thread.
    threads_before = _read_ahead_threads()
    transport = Urllib3Transport() if threaded else None
    with Client(server.url, transport=transport) as client:
        client.create_topic(topic)
        for i in range(0, total, 250):
            client.publish(topic, [b"%d" % j for j in range(i, min(total, i + 250))])
        for transactional in (False, True):
            consumer = client.consume(
                topic, transactional=transactional, batch_size=100, follow=False
            )
            ahead = _count_read_ahead(consumer)
            got = list(consumer)
            assert _payloads(got) == [b"%d" % j for j in range(total)]
            assert len({m.id for m in got}) == total
            assert ahead[0] == total // 100  # every full page, the last one too
            assert consumer._ahead is None  # nothing left in flight at the end
            assert (_read_ahead_threads() > threads_before) is threaded
            consumer.close()


def test_a_consumer_dropped_mid_page_gives_its_connection_back(
    server: ServerProcess, topic: str
) -> None:
    # One connection in all: a poll sent ahead and never read must not keep it.
    with Client(server.url, max_connections=1, timeout=5) as client:
        client.create_topic(topic)
        client.publish(topic, [b"%d" % j for j in range(500)])
        for _ in range(3):
            consumer = client.consume(topic, batch_size=100, follow=False)
            assert next(consumer).payload == b"0"
            assert consumer._ahead is not None  # the next page is on its way
            del consumer
            gc.collect()
            assert len(client.poll(topic, None, limit=1000)) == 500
        consumer = client.consume(topic, batch_size=100, follow=False)
        next(consumer)
        consumer.close()  # closed: the same
        assert len(client.poll(topic, None, limit=1000)) == 500


def test_sync_read_ahead_read_committed(server: ServerProcess, topic: str) -> None:
    with Client(server.url) as client:
        client.create_topic(topic)
        expected: list[bytes] = []
        for round_ in range(6):
            plain = [b"p%d-%d" % (round_, j) for j in range(70)]
            client.publish(topic, plain)
            expected += plain
            committed = [b"c%d-%d" % (round_, j) for j in range(40)]
            client.publish_transaction({topic: committed})
            expected += committed
            with pytest.raises(UserAbort), client.transaction(payload_threshold=0) as tx:
                tx.publish(topic, [b"aborted%d" % round_] * 30)
                raise UserAbort
        # A transaction still in progress: none of its messages is visible.
        open_ctx = client.transaction(payload_threshold=0)
        open_tx = open_ctx.__enter__()
        open_tx.publish(topic, [b"open"] * 20)
        client.publish(topic, [b"after-open"] * 10)
        try:
            consumer = client.consume(topic, batch_size=50, follow=False)
            ahead = _count_read_ahead(consumer)
            got = _payloads(list(consumer))
            assert [p for p in got if p != b"after-open"] == expected
            assert b"open" not in got and not any(p.startswith(b"aborted") for p in got)
            assert ahead[0] > 0
        finally:
            open_ctx.__exit__(None, None, None)
        consumer = client.consume(topic, batch_size=50, follow=False)
        got = _payloads(list(consumer))
        assert got.count(b"open") == 20 and got.count(b"after-open") == 10
        assert [p for p in got if p not in (b"open", b"after-open")] == expected


def test_sync_read_ahead_while_following(server: ServerProcess, topic: str) -> None:
    with Client(server.url) as client:
        client.create_topic(topic)
        client.publish(topic, [b"%d" % j for j in range(300)])
        consumer = client.consume(topic, transactional=False, batch_size=100, wait=0.2)
        got = [next(consumer) for _ in range(300)]
        client.publish(topic, [b"late"])
        assert next(consumer).payload == b"late"
        assert _payloads(got) == [b"%d" % j for j in range(300)]
        consumer.close()


@pytest.mark.parametrize("transactional", [False, True])
async def test_async_read_ahead_keeps_order_and_count(
    server: ServerProcess, topic: str, transactional: bool
) -> None:
    total = 1234
    async with AsyncClient(server.url) as client:
        await client.create_topic(topic)
        for i in range(0, total, 300):
            await client.publish(topic, [b"%d" % j for j in range(i, min(total, i + 300))])
        consumer = client.consume(topic, transactional=transactional, batch_size=100, follow=False)
        sent = _count_read_ahead(consumer)
        pages = []
        while page := await consumer.poll():
            pages.append(page)
        got = [m for page in pages for m in page]
        assert _payloads(got) == [b"%d" % j for j in range(total)]
        assert [len(p) for p in pages] == [100] * 12 + [34]
        assert sent[0] == 12
        assert consumer._ahead is None


@pytest.mark.parametrize("media", [AVRO_EXT, JSON], ids=["avro", "json"])
def test_sync_iteration_and_polls_take_turns_without_a_gap(
    server: ServerProcess, topic: str, media: Media
) -> None:
    # Iterating makes a page's messages one at a time (columns) or holds them decoded
    # (JSON); a poll between two next() calls returns the rest of that page first.
    with Client(server.url, media=media) as client:
        client.create_topic(topic)
        client.publish(topic, [b"%d" % j for j in range(250)])
        consumer = client.consume(topic, batch_size=100, follow=False)
        got = [next(consumer) for _ in range(30)]
        assert consumer.position == got[-1].id
        rest = consumer.poll()
        assert len(rest) == 70 and consumer.position == rest[-1].id
        got += rest
        got.append(next(consumer))
        got += consumer.poll()
        got += list(consumer)
        assert _payloads(got) == [b"%d" % j for j in range(250)]
        assert consumer.position == got[-1].id
        assert consumer.poll() == []


async def test_async_iteration_and_polls_take_turns_without_a_gap(
    server: ServerProcess, topic: str
) -> None:
    async with AsyncClient(server.url) as client:
        await client.create_topic(topic)
        await client.publish(topic, [b"%d" % j for j in range(250)])
        consumer = client.consume(topic, batch_size=100, follow=False)
        got = [await consumer.__anext__() for _ in range(30)]
        rest = await consumer.poll()
        assert len(rest) == 70 and consumer.position == rest[-1].id
        got += rest
        got += [m async for m in consumer]
        assert _payloads(got) == [b"%d" % j for j in range(250)]
        assert consumer.position == got[-1].id
