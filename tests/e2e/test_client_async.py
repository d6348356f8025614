"""tidings.AsyncClient against a real ``tidings serve``."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from tests.e2e.serverproc import ServerProcess
from tidings import (
    AVRO_EXT,
    AsyncClient,
    Record,
    TopicAlreadyExists,
    TopicNotFound,
    TransactionConflict,
)
from tidings.structs import Transaction

pytestmark = pytest.mark.e2e


@pytest.fixture
async def client(server: ServerProcess) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(server.url, timeout=10) as c:
        yield c


async def test_admin_publish_consume(client: AsyncClient, topic: str) -> None:
    assert (await client.create_topic(topic, ttl=60)).ttl == 60
    with pytest.raises(TopicAlreadyExists):
        await client.create_topic(topic)
    assert topic in await client.list_topics()
    await client.publish(topic, [b"a", "b", Record(b"c", key=b"k")])
    got = [m async for m in client.consume(topic, follow=False)]
    assert [m.payload for m in got] == [b"a", b"b", b"c"] and got[2].key == b"k"
    assert (await client.stats(topic)).message_count == 3
    await client.delete_topic(topic)
    with pytest.raises(TopicNotFound):
        await client.get_topic(topic)


async def test_concurrent_publishes_keep_one_order(server: ServerProcess, topic: str) -> None:
    async with AsyncClient(server.url, media=AVRO_EXT) as client:
        await client.create_topic(topic)
        await asyncio.gather(*(client.publish(topic, f"m{i}") for i in range(50)))
        first = [m.id async for m in client.consume(topic, follow=False, batch_size=7)]
        second = [m.id async for m in client.consume(topic, follow=False, batch_size=50)]
        assert len(first) == 50 and first == second == sorted(first)


async def test_long_poll_consumer_sees_new_messages(client: AsyncClient, topic: str) -> None:
    await client.create_topic(topic)
    consumer = client.consume(topic, transactional=False, wait=10)

    async def later() -> None:
        await asyncio.sleep(0.2)
        await client.publish(topic, b"late")

    task = asyncio.create_task(later())
    message = await asyncio.wait_for(anext(consumer), 10)
    await task
    assert message.payload == b"late" and consumer.position == message.id


async def test_transactions_and_read_committed(client: AsyncClient, topic: str) -> None:
    await client.create_topic(topic)
    async with client.transaction(payload_threshold=0) as tx:
        await tx.publish(topic, [b"p1", b"p2"])  # payload path: stored at once
        assert await client.poll(topic) == []
    assert [m.payload async for m in client.consume(topic, follow=False)] == [b"p1", b"p2"]

    with pytest.raises(RuntimeError):
        async with client.transaction() as tx:
            await tx.publish(topic, b"never")
            raise RuntimeError("abort")
    open_tx = await client.begin()
    await client.publish(topic, b"open", write_pointer=open_tx.write_pointer)
    await client.publish(topic, b"after")
    # Read-committed stops at the open transaction's entry; uncommitted sees all.
    committed = [m.payload async for m in client.consume(topic, follow=False)]
    assert committed == [b"p1", b"p2"]
    uncommitted = [
        m.payload async for m in client.consume(topic, transactional=False, follow=False)
    ]
    assert uncommitted == [b"p1", b"p2", b"open", b"after"]
    await client.commit(open_tx)
    committed = [m.payload async for m in client.consume(topic, follow=False)]
    assert committed == [b"p1", b"p2", b"open", b"after"]


class Table:
    """A fake participant: a dict whose writes count only on commit."""

    name = "table"

    def __init__(self, key: bytes, fail_commit: bool = False) -> None:
        self.key = key
        self.fail_commit = fail_commit
        self.steps: list[str] = []

    async def start(self, transaction: Transaction) -> None:
        self.steps.append("start")

    async def changes(self) -> list[bytes]:
        return [self.key]

    async def commit(self) -> bool:
        self.steps.append("commit")
        return not self.fail_commit

    async def post_commit(self) -> None:
        self.steps.append("post_commit")

    async def rollback(self) -> None:
        self.steps.append("rollback")


async def test_async_context_conflict(client: AsyncClient, topic: str) -> None:
    await client.create_topic(topic)
    first, second = Table(b"row"), Table(b"row")
    ctx1 = client.transaction(first)
    ctx2 = client.transaction(second)
    await ctx1.start()
    await ctx2.start()
    await ctx1.publish(topic, b"one")
    await ctx2.publish(topic, b"two")
    await ctx1.finish()
    with pytest.raises(TransactionConflict):
        await ctx2.finish()
    assert second.steps == ["start", "commit", "rollback"]
    assert [m.payload async for m in client.consume(topic, follow=False)] == [b"one"]
    # Neither left open (others' transactions on the shared server may be).
    in_progress = (await client.transactions()).in_progress
    assert ctx1.write_pointer not in in_progress and ctx2.write_pointer not in in_progress
