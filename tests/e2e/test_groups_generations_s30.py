"""Group positions in a transaction are fenced by the generation each is of, whatever
the body that carries them: one request in JSON, in Avro or in the payloads medium, or
commits sent under the write pointer of a transaction that began after all
(docs/api.md, "A transaction in one request"; docs/design.md, "Generations")."""

from __future__ import annotations

import httpx
import pytest

from tests.e2e.serverproc import ServerProcess
from tests.e2e.test_groups_regressions_s29 import _key_of, _moved_away_and_back
from tidings import AsyncClient, Client
from tidings.client._async.group_consumer import AsyncGroupConsumer
from tidings.client._sync.group_consumer import GroupConsumer
from tidings.codec import admin, avro
from tidings.codec.media import AVRO_EXT, JSON
from tidings.codec.wire import encode_publish_request
from tidings.errors import PartitionFenced
from tidings.structs import GroupAssignment, Record

pytestmark = pytest.mark.e2e

#: How the transaction's one request goes: its medium, and whether its output has
#: headers (which the payloads medium cannot carry: then plain Avro).
BODIES = {
    "json": (JSON, False),
    "avro": (AVRO_EXT, True),
    "payloads": (AVRO_EXT, False),
}


def _output(headers: bool) -> Record:
    return Record(b"out", None, {"h": b"1"} if headers else {})


def _member(client: Client, topic: str, member_id: str) -> GroupConsumer:
    """A member of group ``g`` (3 partitions) joined under ``member_id``: the sticky
    assignment orders members by id, so the test knows who gets what."""
    consumer = client.consume(topic, group="g", follow=False, partitions=3, session_timeout=300.0)
    consumer._assignment = GroupAssignment(member_id, 0, (), 3, ())
    consumer._join()  # (joins under the id it holds)
    assert consumer.member_id == member_id
    return consumer


def _owned(consumer: GroupConsumer) -> tuple[int, ...]:
    assert consumer.assignment is not None
    return consumer.assignment.partitions


@pytest.mark.parametrize("body", list(BODIES))
@pytest.mark.parametrize("begin", ["one request", "deferred begin"])
def test_positions_taken_across_a_rebalance_are_each_fenced_by_their_own_generation(
    server: ServerProcess, topic: str, body: str, begin: str
) -> None:
    # A member hands a transaction positions of partition 1 (generation 1), hears of a
    # rebalance that leaves it 0 and 1, and hands it positions of partition 0
    # (generation 2). Partition 1 then moves to another member, which consumes and
    # commits past it, and comes back; the server tells the member (an answer the
    # application has not seen yet, as one to a poll from another thread). The
    # transaction's positions of partition 1 are of the earlier ownership: it must not
    # commit (before, the merged positions named no generation, the server went by the
    # newest it told the member, and partition 1's position went back).
    media, headers = BODIES[body]
    with Client(server.url, media=media) as client:
        client.create_topic(topic)
        client.create_topic(topic + "-out")
        k0, k1 = _key_of(0, 3), _key_of(1, 3)
        a = _member(client, topic, "a")
        client.publish(topic, [Record(b"m1", k1)])
        with pytest.raises(PartitionFenced), client.transaction() as tx:
            assert [m.payload for m in a.poll()] == [b"m1"]
            a.commit(transaction=tx)
            b = _member(client, topic, "b")
            assert a.heartbeat().partitions == (0, 1) and _owned(b) == (2,)
            client.publish(topic, [Record(b"m2", k0)])
            assert [m.payload for m in a.poll()] == [b"m2"]
            a.commit(transaction=tx)  # (partition 1's position stays as handed over)
            client.publish(topic, [Record(b"m3", k1)])
            x = _member(client, topic, "x")
            assert _owned(x) == (1,)
            assert [m.payload for m in x] == [b"m1", b"m3"]
            x.commit()
            x.close()
            assert a.member_id is not None
            told = client._send(client._api.group_heartbeat(topic, "g", a.member_id))
            assert told.partitions == (0, 1) and told.owned_since[1] == told.generation
            before = client.describe_group(topic, "g").partitions
            tx.publish(topic + "-out", [_output(headers)])
            if begin == "deferred begin":
                tx.start()
        assert client.describe_group(topic, "g").partitions == before
        assert client.poll(topic + "-out", transaction=client.snapshot()) == []
        a.close()
        b.close()


@pytest.mark.parametrize("body", list(BODIES))
def test_a_one_request_names_the_generation_its_positions_are_of_in_every_medium(
    server: ServerProcess, topic: str, body: str
) -> None:
    # The server told the member of the generation in which a partition came back (an
    # answer the application never saw); the member's positions of it are of the
    # earlier ownership. Its one request must be fenced in Avro as in JSON (the Avro
    # body carried no generation, and the server went by what it told the member).
    media, headers = BODIES[body]
    with Client(server.url, media=media) as client:
        client.create_topic(topic + "-out")
        first, _ = _moved_away_and_back(client, topic)
        assert first.member_id is not None
        client._send(client._api.group_heartbeat(topic, "g", first.member_id))
        before = client.describe_group(topic, "g").partitions
        with pytest.raises(PartitionFenced), client.transaction() as tx:
            tx.publish(topic + "-out", [_output(headers)])
            first.commit(transaction=tx)
        assert client.describe_group(topic, "g").partitions == before
        assert client.poll(topic + "-out", transaction=client.snapshot()) == []
        first.close()


def test_a_commit_fences_each_position_by_the_generation_it_names(
    server: ServerProcess, topic: str
) -> None:
    # A position may name its own generation (the commit's stands for the rest): the
    # server told the member of the newer one, and the position of the partition that
    # came back, named as of the older, is refused.
    with Client(server.url) as client:
        first, ids = _moved_away_and_back(client, topic)
        assert first.member_id is not None and first.assignment is not None
        told = client._send(client._api.group_heartbeat(topic, "g", first.member_id))
        before = client.describe_group(topic, "g").partitions
        (back,) = [p.partition for p in before if p.position is not None]
        old = first.assignment.generation
        call = client._api.group_commit(
            topic, "g", first.member_id, ids, None, told.generation, {back: old}
        )
        with pytest.raises(PartitionFenced):
            client._send(call)
        assert client.describe_group(topic, "g").partitions == before
        first.close()


def test_an_avro_body_without_generations_means_what_it_did(
    server: ServerProcess, topic: str
) -> None:
    # Written as before groupCommitGenerations was added: the server goes by the newest
    # generation it told the member, and the positions commit with the messages.
    with Client(server.url) as client:
        client.create_topic(topic)
        client.create_topic(topic + "-out")
        client.publish(topic, [Record(b"a", _key_of(0, 2))])
        member = client.consume(topic, group="g", follow=False, partitions=2)
        (got,) = member.poll()
        assert member.member_id is not None
        commit = admin.TransactionGroupCommit(topic, "g", member.member_id, {0: got.id})
        body = avro.write(
            {
                "timeout": None,
                "transactionalId": None,
                "epoch": None,
                "topics": [
                    {
                        "topic": topic + "-out",
                        "body": encode_publish_request(None, [b"x"], AVRO_EXT),
                    }
                ],
                "acks": [],
                "groupCommits": admin.transaction_group_commits_avro([commit]),
            },
            avro.TRANSACTION_PUBLISH_REQUEST_V1,
        )
        answer = httpx.post(
            f"{server.url}/v1/namespaces/default/transactions/publish",
            content=body,
            headers={"Content-Type": AVRO_EXT.value},
        )
        assert answer.status_code == 200, answer.text
        positions = {p.partition: p.position for p in client.describe_group(topic, "g").partitions}
        assert positions == {0: got.id, 1: None}
        assert [m.payload for m in client.poll(topic + "-out")] == [b"x"]
        member.close()


@pytest.mark.parametrize("body", list(BODIES))
@pytest.mark.parametrize("begin", ["one request", "deferred begin"])
def test_a_partition_handed_over_again_after_it_moved_away_and_back_fails_the_transaction(
    server: ServerProcess, topic: str, body: str, begin: str
) -> None:
    # The member hands a transaction its position of partition 1, which then moves to
    # another member (which consumes and commits it) and comes back; the member hears
    # of it, polls what came since and hands the transaction its new position of
    # partition 1. The transaction's output still holds what came of the first batch,
    # which the other member consumed too: it must not commit, as a transaction begun
    # before the move (holding the first position) is invalidated by it. Before, the
    # later position replaced the earlier one with its generation, and it committed.
    media, headers = BODIES[body]
    with Client(server.url, media=media) as client:
        client.create_topic(topic)
        client.create_topic(topic + "-out")
        k1 = _key_of(1, 2)
        a = client.consume(topic, group="g", follow=False, partitions=2, session_timeout=300.0)
        client.publish(topic, [Record(b"m1", k1)])
        with pytest.raises(PartitionFenced), client.transaction() as tx:
            assert [m.payload for m in a.poll()] == [b"m1"]
            tx.publish(topic + "-out", [_output(headers)])
            a.commit(transaction=tx)
            other = client.consume(topic, group="g", follow=False)
            assert [m.payload for m in other] == [b"m1"]
            other.commit()
            other.close()
            assert a.heartbeat().partitions == (0, 1)
            client.publish(topic, [Record(b"m2", k1)])
            assert [m.payload for m in a.poll()] == [b"m2"]
            a.commit(transaction=tx)
            before = client.describe_group(topic, "g").partitions
            if begin == "deferred begin":
                tx.start()
        assert client.describe_group(topic, "g").partitions == before
        assert client.poll(topic + "-out", transaction=client.snapshot()) == []
        a.close()


async def test_the_async_client_names_each_held_positions_generation(
    server: ServerProcess, topic: str
) -> None:
    # As test_positions_taken_across_a_rebalance_are_each_fenced_by_their_own_generation,
    # through the asynchronous client (whose code the synchronous one is made from).
    async with AsyncClient(server.url) as client:
        await client.create_topic(topic)
        await client.create_topic(topic + "-out")
        k0, k1 = _key_of(0, 3), _key_of(1, 3)

        async def member(member_id: str) -> AsyncGroupConsumer:
            consumer = client.consume(
                topic, group="g", follow=False, partitions=3, session_timeout=300.0
            )
            assert isinstance(consumer, AsyncGroupConsumer)
            consumer._assignment = GroupAssignment(member_id, 0, (), 3, ())
            await consumer._join()
            return consumer

        a = await member("a")
        await client.publish(topic, [Record(b"m1", k1)])
        with pytest.raises(PartitionFenced):
            async with client.transaction() as tx:
                assert [m.payload for m in await a.poll()] == [b"m1"]
                await a.commit(transaction=tx)
                b = await member("b")
                assert (await a.heartbeat()).partitions == (0, 1)
                await client.publish(topic, [Record(b"m2", k0)])
                assert [m.payload for m in await a.poll()] == [b"m2"]
                await a.commit(transaction=tx)
                await client.publish(topic, [Record(b"m3", k1)])
                x = await member("x")
                assert [m.payload async for m in x] == [b"m1", b"m3"]
                await x.commit()
                await x.close()
                assert a.member_id is not None
                await client._send(client._api.group_heartbeat(topic, "g", a.member_id))
                before = (await client.describe_group(topic, "g")).partitions
                await tx.publish(topic + "-out", [b"out"])
        assert (await client.describe_group(topic, "g")).partitions == before
        snapshot = await client.snapshot()
        assert await client.poll(topic + "-out", transaction=snapshot) == []
        await a.close()
        await b.close()
