"""Consumer groups through the real server and the real clients (issue: consumer groups)."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from tests.e2e.serverproc import ServerProcess
from tidings import AsyncClient, Client
from tidings.codec.groups import partition_of
from tidings.codec.media import AVRO, AVRO_EXT, COLUMNS, JSON, response_media_for
from tidings.codec.wire import decode_messages
from tidings.errors import (
    BadRequest,
    Conflict,
    GroupNotFound,
    InvalidName,
    PartitionFenced,
    TransactionNotInProgress,
)
from tidings.structs import Message, Record

pytestmark = pytest.mark.e2e


def fill(client: Client, topic: str, n: int, keys: int = 10) -> list[Record]:
    client.create_topic(topic)
    records = [Record(f"v{i}".encode(), f"k{i % keys}".encode()) for i in range(n)]
    client.publish(topic, records)
    return records


def drain(consumer: object, rounds: int = 50) -> list[Message]:
    out: list[Message] = []
    for _ in range(rounds):
        page = consumer.poll()  # type: ignore[attr-defined]
        if not page:
            break
        out.extend(page)
    return out


def fill_40(client: Client, topic: str, keyless: bool) -> list[Message]:
    """40 messages, with 4 keys or none; all of them as a poll reads them."""
    if keyless:
        client.create_topic(topic)
        client.publish(topic, [b"v%d" % i for i in range(40)])
    else:
        fill(client, topic, 40, keys=4)
    return client.poll(topic, limit=100)


def committed(client: Client, topic: str, group: str) -> dict[int, object]:
    """The group's committed position of each partition that has one."""
    info = client.describe_group(topic, group)
    return {p.partition: p.position for p in info.partitions if p.position}


def test_two_members_split_keys_in_order_and_see_everything(
    store_server: ServerProcess, topic: str
) -> None:
    with Client(store_server.url) as client:
        fill(client, topic, 300)
        a = client.consume(topic, group="g", follow=False, partitions=8, batch_size=50)
        b = client.consume(topic, group="g", follow=False, batch_size=50)
        a.heartbeat()
        b.heartbeat()
        a.heartbeat()  # both joined: the assignment is settled
        got_a, got_b = drain(a), drain(b)
        assert a.assignment is not None and b.assignment is not None
        assert set(a.assignment.partitions).isdisjoint(b.assignment.partitions)
        assert sorted(a.assignment.partitions + b.assignment.partitions) == list(range(8))
        ids = sorted(m.id for m in got_a + got_b)
        assert ids == [m.id for m in client.poll(topic, limit=1000)]
        for got in (got_a, got_b):
            by_key: dict[bytes | None, list[Message]] = defaultdict(list)
            for m in got:
                by_key[m.key].append(m)
            for ms in by_key.values():
                assert ms == sorted(ms, key=lambda m: m.id)  # per key, the topic's order
        assert {m.key for m in got_a}.isdisjoint({m.key for m in got_b})
        a.close()
        b.close()


def test_commit_in_a_transaction_moves_the_position_only_if_it_commits(
    store_server: ServerProcess, topic: str
) -> None:
    with Client(store_server.url) as client:
        fill(client, topic, 20, keys=1)
        client.create_topic(topic + "-out")
        c = client.consume(topic, group="g", follow=False, partitions=1, batch_size=5)
        batch = c.poll()
        with pytest.raises(RuntimeError), client.transaction() as tx:
            tx.publish(topic + "-out", [m.payload for m in batch])
            c.commit(transaction=tx)
            raise RuntimeError("the transform failed")
        info = client.describe_group(topic, "g")
        assert info.partitions[0].position is None  # aborted: unchanged
        assert client.poll(topic + "-out", transaction=client.snapshot()) == []
        again = c.poll()  # the same member gets the batch again
        assert [m.id for m in again] == [m.id for m in batch]
        with client.transaction() as tx:
            tx.publish(topic + "-out", [m.payload for m in again])
            c.commit(transaction=tx)
        info = client.describe_group(topic, "g")
        assert info.partitions[0].position == batch[-1].id
        assert info.lag == 15
        out = client.poll(topic + "-out", transaction=client.snapshot())
        assert [m.payload for m in out] == [m.payload for m in batch]
        c.close()
        # A new member resumes after the committed position.
        d = client.consume(topic, group="g", follow=False, batch_size=100)
        assert [m.id for m in drain(d)] == [m.id for m in client.poll(topic, limit=100)][5:]
        d.close()


@pytest.mark.parametrize("one_request", [True, False])
def test_a_zombie_member_cannot_commit(
    store_server: ServerProcess, topic: str, one_request: bool
) -> None:
    # In one request the positions go with the commit, after the partition moved: the
    # member is fenced there. Begun first, the transaction holds the positions when
    # the partition moves, and the rebalance invalidates it.
    expected = PartitionFenced if one_request else TransactionNotInProgress
    with Client(store_server.url) as client:
        fill(client, topic, 10, keys=1)
        client.create_topic(topic + "-out")
        zombie = client.consume(topic, group="g", follow=False, partitions=1, session_timeout=0.3)
        batch = zombie.poll()
        with pytest.raises(expected), client.transaction() as tx:
            if not one_request:
                assert tx.transaction.write_pointer > 0  # asked for: it begins now
            tx.publish(topic + "-out", [b"zombie output"])
            zombie.commit(transaction=tx)
            time.sleep(0.6)  # stalls past its session timeout...
            fresh = client.consume(topic, group="g", follow=False)
            fresh.heartbeat()  # ...and the partition moves: the zombie's tx is fenced
        assert client.poll(topic + "-out", transaction=client.snapshot()) == []
        assert [m.id for m in drain(fresh)] == [m.id for m in batch]
        zombie._returned[0] = batch[-1].id  # what it had returned before
        with pytest.raises(PartitionFenced):
            zombie.commit()
        fresh.close()


def test_positions_survive_kill_9(
    start_store_server: Callable[..., ServerProcess], tmp_path: Path, topic: str
) -> None:
    srv = start_store_server()
    client = Client(srv.url)
    fill(client, topic, 30, keys=3)
    c = client.consume(topic, group="g", follow=False, partitions=4, batch_size=10)
    first = c.poll()
    c.commit()
    expected = client.describe_group(topic, "g")
    srv.kill()
    srv.start()
    try:
        after = client.describe_group(topic, "g")
        assert [p.position for p in after.partitions] == [p.position for p in expected.partitions]
        assert after.members == expected.members  # membership is durable too
        # The member carries on after the restart from its committed positions.
        rest = drain(c)
        assert {m.id for m in rest}.isdisjoint({m.id for m in first})
        assert sorted(m.id for m in first + rest) == [m.id for m in client.poll(topic, limit=100)]
        c.close()
    finally:
        client.close()


def test_bad_input_changes_nothing(store_server: ServerProcess, topic: str) -> None:
    with Client(store_server.url) as client:
        fill(client, topic, 10, keys=5)
        with pytest.raises(GroupNotFound):
            client.describe_group(topic, "nope")
        with pytest.raises(GroupNotFound):
            client.reset_group(topic, "nope", "earliest")
        with pytest.raises(InvalidName):
            client.describe_group(topic, "bad name!")
        a = client.consume(topic, group="g", follow=False, partitions=2)
        b = client.consume(topic, group="g", follow=False)
        a.heartbeat(), b.heartbeat(), a.heartbeat()
        got = a.poll()
        assert got
        with pytest.raises(Conflict):  # members present
            client.reset_group(topic, "g", "earliest")
        before = client.describe_group(topic, "g")
        assert b.assignment is not None and a.assignment is not None
        theirs = b.assignment.partitions[0]
        a._returned = {theirs: got[0].id}
        with pytest.raises(PartitionFenced):
            a.commit()
        mine = a.assignment.partitions[0]
        a._returned = {mine: got[-1].id._replace(publish_ts=got[-1].id.publish_ts + 10**9)}
        with pytest.raises(BadRequest):  # beyond what was delivered
            a.commit()
        assert client.describe_group(topic, "g").partitions == before.partitions
        r = httpx.post(
            f"{store_server.url}/v1/namespaces/default/topics/{topic}/groups/g/commit",
            json={"memberId": "x", "positions": []},
        )
        assert r.status_code == 400 and set(r.json()) == {"error", "type"}
        a.close()
        b.close()


def test_reset_list_and_delete(store_server: ServerProcess, topic: str) -> None:
    with Client(store_server.url) as client:
        fill(client, topic, 10, keys=2)
        c = client.consume(topic, group="g", follow=False)
        drain(c)
        c.commit()
        c.close()
        assert client.groups(topic) == ["g"]
        assert client.describe_group(topic, "g").lag == 0
        client.reset_group(topic, "g", "earliest")
        assert client.describe_group(topic, "g").lag == 10
        client.reset_group(topic, "g", "latest")
        assert client.describe_group(topic, "g").lag == 0
        client.delete_group(topic, "g")
        assert client.groups(topic) == []
        # Deleting the topic deletes its groups; a re-created topic starts afresh.
        c = client.consume(topic, group="g2", follow=False)
        c.poll()
        c.close()
        client.delete_topic(topic)
        client.create_topic(topic)
        assert client.groups(topic) == []


@pytest.mark.parametrize("keyless", [False, True])
def test_a_member_iterated_part_way_commits_after_what_it_returned(
    server: ServerProcess, topic: str, keyless: bool
) -> None:
    # Iterating files each returned message under its partition (a keyless message's
    # is its id's), as poll() does for a page: a commit then moves each partition past
    # its last returned message.
    with Client(server.url) as client:
        everything = fill_40(client, topic, keyless)
        member = client.consume(topic, group="it", follow=False, partitions=4, batch_size=15)
        got = [next(member) for _ in range(7)]
        assert [m.id for m in got] == [m.id for m in everything[:7]]
        member.commit()
        assert committed(client, topic, "it") == {partition_of(m, 4): m.id for m in got}
        member.close()
        # A new member takes up after them, in every partition.
        again = client.consume(topic, group="it", follow=False, batch_size=100)
        assert [m.id for m in drain(again)] == [m.id for m in everything[7:]]
        again.close()


@pytest.mark.parametrize("keyless", [False, True])
def test_a_member_mixing_the_iterator_and_poll_commits_after_the_last_it_returned(
    server: ServerProcess, topic: str, keyless: bool
) -> None:
    # What the iterator returned and a poll's page after it are filed by partition (a
    # keyless message's is its id's), so a commit covers the last returned of each.
    with Client(server.url) as client:
        everything = fill_40(client, topic, keyless)
        member = client.consume(topic, group="mix", follow=False, partitions=4, batch_size=15)
        got = [next(member) for _ in range(3)]
        got += member.poll()  # the rest of the page
        assert [m.id for m in got] == [m.id for m in everything[:15]]
        member.commit()
        assert committed(client, topic, "mix") == {partition_of(m, 4): m.id for m in got}
        member.close()


def test_what_the_iterator_returned_before_a_rebalance_commits_in_owned_partitions_only(
    server: ServerProcess, topic: str
) -> None:
    with Client(server.url) as client:
        fill(client, topic, 40, keys=8)
        a = client.consume(topic, group="rb", follow=False, partitions=8, batch_size=40)
        got = [next(a) for _ in range(20)]  # every partition is a's so far
        b = client.consume(topic, group="rb", follow=False, batch_size=40)
        b.heartbeat()  # b joins: a rebalance
        a.heartbeat()  # a learns what it kept
        assert a.assignment is not None
        owned = set(a.assignment.partitions)
        assert 0 < len(owned) < 8
        a.commit()  # what it returned of the partitions it lost is not its to commit
        last = {partition_of(m, 8): m.id for m in got}
        assert committed(client, topic, "rb") == {p: i for p, i in last.items() if p in owned}
        a.close()
        b.close()


@pytest.mark.parametrize("iterate", [True, False], ids=["iterator", "poll"])
def test_auto_commit_commits_what_was_returned_before_each_fetch_and_at_close(
    server: ServerProcess, topic: str, iterate: bool
) -> None:
    with Client(server.url) as client:
        fill(client, topic, 30, keys=3)
        everything = client.poll(topic, limit=100)
        member = client.consume(
            topic, group="auto", follow=False, partitions=4, batch_size=10, auto_commit=True
        )

        first = [next(member) for _ in range(10)] if iterate else member.poll()
        assert [m.id for m in first] == [m.id for m in everything[:10]]
        assert committed(client, topic, "auto") == {}  # nothing before the next fetch
        if iterate:
            next(member)  # the next page's fetch commits the first page
        else:
            member.poll()
        assert committed(client, topic, "auto") == {partition_of(m, 4): m.id for m in first}
        member.close()  # and what was returned since, at close
        returned = everything[:11] if iterate else everything[:20]
        assert committed(client, topic, "auto") == {partition_of(m, 4): m.id for m in returned}


async def test_async_member(server: ServerProcess, topic: str) -> None:
    with Client(server.url) as sync:
        fill(sync, topic, 40, keys=4)
    async with AsyncClient(server.url) as client:
        consumer = client.consume(topic, group="ag", follow=False, partitions=4, batch_size=15)
        got = [m async for m in consumer]
        assert sorted(m.id for m in got) == [m.id for m in await client.poll(topic, limit=100)]
        await consumer.commit()
        info = await client.describe_group(topic, "ag")
        assert info.lag == 0
        for m in got:
            assert partition_of(m, 4) in info.members[consumer.member_id or ""]
        await consumer.close()


def test_lag_in_topic_stats_and_metrics(store_server: ServerProcess, topic: str) -> None:
    with Client(store_server.url) as client:
        fill(client, topic, 12, keys=3)
        c = client.consume(topic, group="lagging", follow=False, batch_size=5)
        c.poll()
        c.commit()
        c.close()
        assert client.stats(topic).group_lags == {"lagging": 7}
    metrics = httpx.get(store_server.url + "/metrics").text
    line = f'tidings_group_lag{{group="lagging",namespace="default",topic="{topic}"}} 7.0'
    assert line in metrics


def test_a_group_starting_at_latest_misses_no_open_transaction(
    server: ServerProcess, topic: str
) -> None:
    with Client(server.url) as client:
        fill(client, topic, 3, keys=1)
        tx = client.begin()
        client.publish(topic, [Record(b"open", b"k0")], write_pointer=tx.write_pointer)
        member = client.consume(topic, "latest", group="late", follow=False, partitions=1)
        assert member.poll() == []  # starts at the open transaction, which blocks
        client.commit(tx)
        client.publish(topic, [Record(b"after", b"k0")])
        assert [m.payload for m in member.poll()] == [b"open", b"after"]
        member.close()


@pytest.mark.parametrize(
    "accept",
    [None, JSON.value, AVRO.value, AVRO_EXT.value, f"{COLUMNS.value}, {AVRO_EXT.value}"],
    ids=["none", "json", "avro", "avro-ext", "columns"],
)
def test_a_group_poll_answers_in_the_medium_accept_names(
    server: ServerProcess, topic: str, accept: str | None
) -> None:
    # The same messages (headers and Payload Table rows included) in every medium; the
    # clients ask for columns first.
    with Client(server.url) as client:
        client.create_topic(topic)
        records = [
            Record(
                b"v%d" % i, None if i % 3 == 0 else b"k%d" % i, {"h": b"%d" % i} if i % 4 else {}
            )
            for i in range(30)
        ]
        client.publish(topic, records)
        with client.transaction(payload_threshold=0) as tx:
            tx.publish(topic, [Record(b"tx%d" % i, b"tk") for i in range(5)])
        expected = [
            (m.id, m.payload, m.key, dict(m.headers)) for m in client.poll(topic, limit=100)
        ]
        base = f"{server.url}/v1/namespaces/default/topics/{topic}/groups/g"
        join = httpx.post(base + "/join", json={"start": "earliest"})
        assert join.status_code == 200, join.text
        member = join.json()["memberId"]
        headers = {} if accept is None else {"Accept": accept}
        r = httpx.post(base + "/poll", json={"memberId": member, "limit": 100}, headers=headers)
        assert r.status_code == 200, r.text
        medium = response_media_for(r.headers["content-type"])
        wanted = JSON if accept is None else response_media_for(accept.split(",")[0])
        assert medium is wanted
        got = decode_messages(r.content, medium)
        if medium is AVRO:  # CDAP's schema: no keys, no headers
            expected = [(i, p, None, {}) for i, p, _, _ in expected]
        assert [(m.id, m.payload, m.key, dict(m.headers)) for m in got] == expected
        assert r.headers["tidings-count"] == str(len(expected))
        httpx.post(base + "/leave", json={"memberId": member})
