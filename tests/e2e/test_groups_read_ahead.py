"""A group member reads ahead (the next poll in flight while the application works on a
page): commits, rollbacks and rebalances must not see the page read ahead. Through the
real server and the real clients (issue: consumer groups)."""

from __future__ import annotations

from collections import Counter

import pytest

from tests.e2e.serverproc import ServerProcess
from tests.e2e.test_groups import drain, fill
from tidings import AsyncClient, Client
from tidings.client.socket_transport import Exchange, SocketTransport
from tidings.client.transports import Request, Response
from tidings.errors import (
    PartitionFenced,
    TidingsConnectionError,
    TopicNotFound,
    TransactionNotInProgress,
)

pytestmark = pytest.mark.e2e


def test_a_commit_covers_what_was_returned_not_what_was_read_ahead(
    server: ServerProcess, topic: str
) -> None:
    with Client(server.url) as client:
        fill(client, topic, 50, keys=1)
        consumer = client.consume(topic, group="g", follow=False, partitions=1, batch_size=10)
        page = consumer.poll()
        assert len(page) == 10
        assert consumer._ahead is not None  # the next page is on its way
        consumer.commit()
        info = client.describe_group(topic, "g")
        assert info.partitions[0].position == page[-1].id
        assert info.partitions[0].lag == 40
        # The page read ahead is the next one, in order, and nothing is lost or repeated.
        rest = drain(consumer)
        assert [m.id for m in page + rest] == [m.id for m in client.poll(topic, limit=100)]
        consumer.close()


@pytest.mark.parametrize("defer_begin", [True, False])
def test_a_rolled_back_page_comes_again_not_the_one_read_ahead(
    server: ServerProcess, topic: str, defer_begin: bool
) -> None:
    with Client(server.url) as client:
        fill(client, topic, 40, keys=1)
        client.create_topic(topic + "-out")
        consumer = client.consume(topic, group="g", follow=False, partitions=1, batch_size=10)
        page = consumer.poll()
        assert consumer._ahead is not None
        with pytest.raises(KeyError), client.transaction(defer_begin=defer_begin) as tx:
            tx.publish(topic + "-out", [m.payload for m in page])
            consumer.commit(transaction=tx)
            raise KeyError("abort")
        assert [m.id for m in consumer.poll()] == [m.id for m in page]
        # The server refuses a transaction: the page comes again as well.
        again = page
        with pytest.raises(TopicNotFound), client.transaction(defer_begin=defer_begin) as tx:
            tx.publish(topic + "-missing", [m.payload for m in again])
            consumer.commit(transaction=tx)
        assert [m.id for m in consumer.poll()] == [m.id for m in page]
        with client.transaction(defer_begin=defer_begin) as tx:
            tx.publish(topic + "-out", [m.payload for m in page])
            consumer.commit(transaction=tx)
        rest = drain(consumer)
        assert [m.id for m in page + rest] == [m.id for m in client.poll(topic, limit=100)]
        assert client.describe_group(topic, "g").partitions[0].position == page[-1].id
        consumer.close()


async def test_async_rollback_with_a_poll_in_flight(server: ServerProcess, topic: str) -> None:
    with Client(server.url) as sync_client:
        fill(sync_client, topic, 30, keys=1)
        sync_client.create_topic(topic + "-out")
    async with AsyncClient(server.url) as client:
        consumer = client.consume(topic, group="g", follow=False, partitions=1, batch_size=10)
        page = await consumer.poll()
        assert consumer._ahead is not None
        with pytest.raises(KeyError):
            async with client.transaction() as tx:
                await consumer.commit(transaction=tx)
                raise KeyError("abort")
        assert [m.id for m in await consumer.poll()] == [m.id for m in page]
        got = list(page)
        while more := await consumer.poll():
            got.extend(more)
        assert len(got) == 30 and len({m.id for m in got}) == 30
        await consumer.close()


def test_a_copier_through_a_rebalance_copies_each_message_once(
    server: ServerProcess, topic: str
) -> None:
    # Two copiers, the second joining while the first has a page read ahead: the
    # partitions that move are fenced for the first, which gets its batch again.
    with Client(server.url) as client:
        records = fill(client, topic, 400, keys=40)
        client.create_topic(topic + "-out")
        a = client.consume(topic, group="copy", follow=False, partitions=8, batch_size=20)
        b = client.consume(topic, group="copy", follow=False, batch_size=20)
        members = [a]
        fenced = 0

        def copy_one(member: object) -> int:
            nonlocal fenced
            page = member.poll()  # type: ignore[attr-defined]
            if not page:
                return 0
            try:
                with client.transaction() as tx:
                    tx.publish(topic + "-out", [m.payload for m in page])
                    member.commit(transaction=tx)  # type: ignore[attr-defined]
            except (PartitionFenced, TransactionNotInProgress):
                fenced += 1
            return len(page)

        copy_one(a)
        assert a._ahead is not None
        b.heartbeat()  # joins: a rebalance while a's next page is in flight
        members.append(b)
        idle = 0
        while idle < 4:
            moved = sum(copy_one(m) for m in members)
            idle = idle + 1 if moved == 0 else 0
        out = Counter(m.payload for m in client.poll(topic + "-out", limit=1000))
        assert out == Counter(r.payload for r in records)
        info = client.describe_group(topic, "copy")
        assert sum(p.lag for p in info.partitions) == 0
        a.close()
        b.close()


class LosesAGroupPollAnswer(SocketTransport):
    """Sends every request; the answer of the group poll numbered ``which`` is "lost"
    on its way back (the server answered it: the member's cursors moved)."""

    def __init__(self, which: int) -> None:
        super().__init__()
        self.which = which
        self.polls = 0

    def _loses(self, request: Request) -> bool:
        if "/groups/" in request.url and request.url.split("?")[0].endswith("/poll"):
            self.polls += 1
            return self.polls == self.which
        return False

    def send(self, request: Request) -> Response:
        response = super().send(request)
        if self._loses(request):
            raise TidingsConnectionError("connection reset while reading the answer")
        return response

    def start(self, request: Request) -> Exchange:
        # A poll sent ahead: sent now, its answer read (and lost) later.
        exchange = super().start(request)
        return _Lost(exchange) if self._loses(request) else exchange


class _Lost:
    def __init__(self, exchange: Exchange) -> None:
        self.exchange = exchange

    def result(self) -> Response:
        self.exchange.result()
        raise TidingsConnectionError("connection reset while reading the answer")

    def cancel(self) -> None:
        self.exchange.cancel()


def test_a_lost_answer_to_a_read_ahead_repeats_nothing_to_an_iterating_member(
    server: ServerProcess, topic: str
) -> None:
    # As below, iterating: after the rewind the server sends the first page again, and
    # the member, which takes a page's messages one at a time, drops what it returned.
    transport = LosesAGroupPollAnswer(2)
    with Client(server.url) as admin, Client(server.url, transport=transport) as client:
        fill(admin, topic, 50, keys=1)
        consumer = client.consume(topic, group="g", follow=False, partitions=1, batch_size=10)
        first = [next(consumer) for _ in range(10)]
        assert consumer._ahead is not None
        rest = list(consumer)
        assert transport.polls >= 3
        assert [m.id for m in first + rest] == [m.id for m in admin.poll(topic, limit=100)]
        consumer.commit()
        assert client.describe_group(topic, "g").partitions[0].lag == 0
        consumer.close()


@pytest.mark.parametrize("commit_first", [True, False])
def test_a_lost_answer_to_a_poll_read_ahead_loses_no_message(
    server: ServerProcess, topic: str, commit_first: bool
) -> None:
    # The second poll is the one sent ahead when the first page came full. Its answer
    # never arrives, though the server moved the member past it: the member is rewound
    # to its committed positions, and what it had already delivered is not repeated.
    transport = LosesAGroupPollAnswer(2)
    with Client(server.url) as admin, Client(server.url, transport=transport) as client:
        fill(admin, topic, 50, keys=1)
        consumer = client.consume(topic, group="g", follow=False, partitions=1, batch_size=10)
        page = consumer.poll()
        assert len(page) == 10 and consumer._ahead is not None
        if commit_first:
            consumer.commit()
        rest = drain(consumer)
        assert transport.polls >= 3
        assert [m.id for m in page + rest] == [m.id for m in admin.poll(topic, limit=100)]
        consumer.commit()
        assert client.describe_group(topic, "g").partitions[0].lag == 0
        consumer.close()
