"""A queue handle that fetches its next pop ahead (``client.queue(..., prefetch=True)``):
the same deliveries as pops one after another, leases given back on close and before
they run out (issue: queues)."""

from __future__ import annotations

import time

import pytest

from tests.e2e.serverproc import ServerProcess
from tests.e2e.test_queues import fill
from tidings import AsyncClient, Client

pytestmark = pytest.mark.e2e


def test_a_full_pop_fetches_the_next_batch_for_this_handle_only(
    server: ServerProcess, topic: str
) -> None:
    with Client(server.url) as client:
        payloads = fill(client, topic, 25)
        q = client.queue(topic, "work", prefetch=True)
        first = q.pop(10)
        assert [m.payload for m in first] == payloads[:10]
        assert q._ahead is not None  # full: the next pop is on its way
        deadline = time.monotonic() + 5
        while client.describe_queue(topic, "work").popped < 20:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        # The batch fetched ahead is leased to this handle: another worker skips it.
        other = client.queue(topic, "work")
        assert [m.payload for m in other.pop(100)] == payloads[20:]
        assert [m.payload for m in q.pop(10)] == payloads[10:20]
        assert q._ahead is not None
        assert q.pop(10) == []  # the pop fetched ahead found nothing
        assert q._ahead is None
        q.ack(first)
        stats = client.describe_queue(topic, "work")
        assert (stats.popped, stats.acked, stats.pending) == (25, 10, 15)
        q.close()
        other.close()


def test_a_short_pop_fetches_nothing_ahead_and_a_smaller_pop_takes_what_was_fetched(
    server: ServerProcess, topic: str
) -> None:
    with Client(server.url) as client:
        payloads = fill(client, topic, 23)
        q = client.queue(topic, "work", prefetch=True)
        assert len(q.pop(10)) == 10
        # Smaller than the batch fetched ahead: the rest of it waits for the next pops.
        assert [m.payload for m in q.pop(4)] == payloads[10:14]
        assert q._ahead is None
        assert [m.payload for m in q.pop(100)] == payloads[14:20]
        assert q._ahead is None  # 6 of 100: short, nothing fetched ahead
        assert [m.payload for m in q.pop(100)] == payloads[20:]
        assert [m.delivery_count for m in q.pop(100)] == []
        q.close()


def test_close_gives_back_the_batch_fetched_ahead(server: ServerProcess, topic: str) -> None:
    with Client(server.url) as client:
        payloads = fill(client, topic, 20)
        q = client.queue(topic, "work", prefetch=True, ack_timeout=60)
        first = q.pop(10)
        q.ack(first)
        q.close()
        # Given back at once, not after the minute of the lease.
        again = client.queue(topic, "work").pop(100)
        assert [m.payload for m in again] == payloads[10:]
        assert [m.delivery_count for m in again] == [2] * 10  # fetched once before


def test_a_batch_fetched_ahead_too_long_ago_is_given_back_first(
    server: ServerProcess, topic: str
) -> None:
    with Client(server.url) as client:
        payloads = fill(client, topic, 20)
        q = client.queue(topic, "work", prefetch=True, ack_timeout=0.6)
        q.ack(q.pop(10))
        time.sleep(0.4)  # past half the lease: too near its end to hand out
        late = q.pop(10)
        assert [m.payload for m in late] == payloads[10:]
        assert [m.delivery_count for m in late] == [2] * 10  # given back, popped again
        q.ack(late)  # leased afresh: the ack holds
        stats = client.describe_queue(topic, "work")
        assert (stats.acked, stats.pending, stats.nacked) == (20, 0, 10)
        q.close()


def test_every_message_once_with_prefetching_workers(server: ServerProcess, topic: str) -> None:
    with Client(server.url) as client:
        payloads = fill(client, topic, 500)
        workers = [client.queue(topic, "work", prefetch=True) for _ in range(3)]
        seen: list[bytes] = []
        idle = 0
        while idle < len(workers):
            idle = 0
            for w in workers:
                batch = w.pop(7)
                idle += not batch
                seen += [m.payload for m in batch]
                w.ack(batch)
        assert sorted(seen) == sorted(payloads)
        for w in workers:
            w.close()


async def test_async_prefetch(server: ServerProcess, topic: str) -> None:
    async with AsyncClient(server.url) as client:
        await client.create_topic(topic)
        payloads = [b"%d" % i for i in range(30)]
        await client.publish(topic, payloads)
        q = client.queue(topic, "work", prefetch=True)
        got: list[bytes] = []
        while batch := await q.pop(10):
            got += [m.payload for m in batch]
            async with client.transaction() as tx:
                await q.ack(batch, transaction=tx)
        assert got == payloads
        assert (await client.describe_queue(topic, "work")).acked == 30
        await q.close()


def test_a_batch_fetched_ahead_whose_lease_ran_out_is_not_handed_out(
    server: ServerProcess, topic: str
) -> None:
    with Client(server.url) as client:
        payloads = fill(client, topic, 20)
        q = client.queue(topic, "work", prefetch=True, ack_timeout=0.3)
        q.ack(q.pop(10))
        time.sleep(0.5)  # the lease of the batch fetched ahead has run out
        late = q.pop(10)
        assert [m.payload for m in late] == payloads[10:]
        assert all(m.delivery_count == 2 for m in late)
        q.ack(late)
        assert client.describe_queue(topic, "work").acked == 20
        q.close()


def test_a_batch_fetched_ahead_and_taken_by_another_worker_is_not_handed_out(
    server: ServerProcess, topic: str
) -> None:
    with Client(server.url) as client:
        payloads = fill(client, topic, 20)
        q = client.queue(topic, "work", prefetch=True, ack_timeout=0.3)
        q.ack(q.pop(10))
        time.sleep(0.5)  # the lease of the batch fetched ahead has run out
        other = client.queue(topic, "work", ack_timeout=30)
        taken = other.pop(100)
        assert [m.payload for m in taken] == payloads[10:]
        assert q.pop(10) == []  # its nack skips them (another worker holds them): no error
        other.ack(taken)
        assert client.describe_queue(topic, "work").acked == 20
        q.close()
        other.close()


async def test_a_pop_carrying_acks_takes_the_batch_fetched_ahead(
    server: ServerProcess, topic: str
) -> None:
    with Client(server.url) as publisher:
        payloads = fill(publisher, topic, 25)
    async with AsyncClient(server.url) as client:
        q = client.queue(topic, "work", prefetch=True)
        seen: list[bytes] = []
        batch = await q.pop(10)
        while batch:
            seen += [m.payload for m in batch]
            # A batch fetched ahead is there: the acks go in a request of their own.
            batch = await q.pop(10, ack=batch)
        assert seen == payloads
        stats = await client.describe_queue(topic, "work")
        assert (stats.popped, stats.acked, stats.pending) == (25, 25, 0)
        await q.close()
