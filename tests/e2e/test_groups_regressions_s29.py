"""Consumer-group bugs the model-based test (test_groups_model_s29.py) found, each as a
plain run through the real server and the real client."""

from __future__ import annotations

import base64
from collections.abc import Callable

import httpx
import pytest

from tests.e2e.serverproc import ServerProcess
from tidings import Client
from tidings.client._sync.concurrency import Pending
from tidings.client._sync.group_consumer import GroupConsumer
from tidings.codec.groups import partition_of
from tidings.errors import PartitionFenced, TidingsError
from tidings.structs import Message, MessageId, Record

pytestmark = pytest.mark.e2e


def _key_of(partition: int, partitions: int) -> bytes:
    """A key whose messages go to ``partition`` of ``partitions``."""
    for i in range(1000):
        key = b"k%d" % i
        if partition_of(Message(None, b"", key), partitions) == partition:  # type: ignore[arg-type]
            return key
    raise AssertionError("no key found")


def settle_read_ahead(consumer: GroupConsumer) -> None:
    """Wait for the poll a member sent ahead (if any) to be answered, keeping its answer
    for the member's next poll: the machine's next step then comes after it on the server
    rather than racing it, so each run is repeatable."""
    ahead = consumer._ahead
    if ahead is None:
        return
    epoch, member_id, pending = ahead
    try:
        value = pending.result()
    except TidingsError as exc:
        error = exc

        def fail() -> object:
            raise error

        consumer._ahead = (epoch, member_id, Pending(fail, lambda: None))  # type: ignore[arg-type]
    else:
        consumer._ahead = (epoch, member_id, Pending(lambda: value, lambda: None))


def test_a_member_sees_messages_published_after_another_group_read_the_topic(
    server: ServerProcess, topic: str
) -> None:
    # Another group's member read the topic from its start while it held two messages:
    # the server keeps that page for the members coming after. A member starting from
    # the topic's start later must not take that page for the whole topic: the message
    # published since is its partition's, and its first poll must bring it (before, the
    # poll answered nothing and a member with follow=False stopped, caught up).
    with Client(server.url) as client:
        client.create_topic(topic)
        k0, k1 = _key_of(0, 2), _key_of(1, 2)
        client.publish(topic, [Record(b"a", k0), Record(b"b", k0)])
        early = client.consume(topic, group="early", follow=False)
        assert [m.payload for m in early.poll()] == [b"a", b"b"]
        client.publish(topic, [Record(b"c", k1)])
        x = client.consume(topic, group="g", follow=False, partitions=2)
        y = client.consume(topic, group="g", follow=False, partitions=2)
        x.heartbeat()
        y.heartbeat()
        x.heartbeat()
        assert x.assignment is not None
        second = x if 1 in x.assignment.partitions else y
        assert [m.payload for m in second] == [b"c"]
        for c in (early, x, y):
            c.close()


def test_a_member_not_following_polls_again_rather_than_answer_an_empty_read_ahead(
    server: ServerProcess, topic: str
) -> None:
    # A full page sends the next poll ahead; it found nothing then. A message published
    # before the member's next poll() must come with it, not an empty answer from before
    # the message existed (iterating, the member would stop there, caught up).
    with Client(server.url) as client:
        client.create_topic(topic)
        client.publish(topic, [Record(b"a", b"k"), Record(b"b", b"k")])
        member = client.consume(topic, group="g", follow=False, partitions=1, batch_size=2)
        assert [m.payload for m in member.poll()] == [b"a", b"b"]
        settle_read_ahead(member)  # answered (empty) before the publish
        client.publish(topic, [Record(b"c", b"k")])
        assert [m.payload for m in member.poll()] == [b"c"]
        member.close()


@pytest.mark.parametrize("defer_begin", [True, False])
def test_an_aborted_batch_comes_again_in_a_group_starting_at_latest(
    server: ServerProcess, topic: str, defer_begin: bool
) -> None:
    # With no committed position the member started at the end as it was when it
    # joined; the abort rewinds it there, not to the end as it is at the abort (which
    # would skip the batch the aborted transaction was working on).
    with Client(server.url) as client:
        client.create_topic(topic)
        client.create_topic(topic + "-out")
        client.publish(topic, [b"before"])
        member = client.consume(topic, "latest", group="g", follow=False, partitions=1)
        member.heartbeat()
        client.publish(topic, [b"a", b"b"])
        batch = member.poll()
        assert [m.payload for m in batch] == [b"a", b"b"]
        with pytest.raises(KeyError), client.transaction(defer_begin=defer_begin) as tx:
            tx.publish(topic + "-out", [b"out"])
            member.commit(transaction=tx)
            raise KeyError("the transform failed")
        assert [m.payload for m in member.poll()] == [b"a", b"b"]
        info = client.describe_group(topic, "g")
        assert info.partitions[0].position is None
        member.close()


def test_a_page_read_ahead_before_a_rebalance_the_member_heard_of_is_not_taken_back(
    server: ServerProcess, topic: str
) -> None:
    # The member read the next page ahead, then learned (heartbeat) that a join took
    # one of its partitions. Its next poll must not hand it that partition's messages
    # (they are the new owner's now) nor report the older assignment again.
    with Client(server.url) as client:
        client.create_topic(topic)
        k0, k1 = _key_of(0, 2), _key_of(1, 2)
        client.publish(
            topic, [Record(b"a", k0), Record(b"b", k1), Record(b"c", k0), Record(b"d", k1)]
        )
        first = client.consume(topic, group="g", follow=False, partitions=2, batch_size=2)
        assert [m.payload for m in first.poll()] == [b"a", b"b"]
        settle_read_ahead(first)  # the next page, read before the join
        second = client.consume(topic, group="g", follow=False)
        second.heartbeat()
        learned = first.heartbeat()
        assert len(learned.partitions) == 1
        kept = learned.partitions[0]
        rest = [m.payload for m in first.poll()]
        assert rest == ([b"c"] if kept == 0 else [b"d"])
        assert first.assignment == learned
        theirs = [m.payload for m in second]
        assert theirs == ([b"b", b"d"] if kept == 0 else [b"a", b"c"])
        first.close()
        second.close()


def test_partitions_gained_after_a_page_read_ahead_start_at_their_committed_positions(
    server: ServerProcess, topic: str
) -> None:
    # The member read a page of its partition ahead; the other member then left, and
    # this one gained its partition, which starts at its committed position (none: the
    # topic's start), before the ids of the page read ahead. Those messages must come:
    # the page of the older assignment does not count as delivered in the new one.
    with Client(server.url) as client:
        client.create_topic(topic)
        first = client.consume(topic, group="g", follow=False, partitions=2, batch_size=2)
        other = client.consume(topic, group="g", follow=False)
        first.heartbeat()
        other.heartbeat()
        mine = first.heartbeat().partitions
        assert len(mine) == 1
        ka, kb = _key_of(mine[0], 2), _key_of(1 - mine[0], 2)
        payloads = [b"a0", b"b0", b"a1", b"b1", b"a2", b"b2", b"a3", b"b3"]
        client.publish(topic, [Record(p, ka if p[:1] == b"a" else kb) for p in payloads])
        assert [m.payload for m in first.poll()] == [b"a0", b"a1"]
        settle_read_ahead(first)  # a2, a3: read ahead before the other member leaves
        other.close()
        assert len(first.heartbeat().partitions) == 2
        got = [m.payload for m in first]
        assert sorted(got) == [b"a2", b"a3", b"b0", b"b1", b"b2", b"b3"]
        first.close()


def test_a_page_read_ahead_before_a_partition_moved_away_and_back_is_not_delivered_twice(
    server: ServerProcess, topic: str
) -> None:
    # The member read a page ahead, then heard of a join taking one of its partitions
    # and of the leave giving it back: that partition starts again at its committed
    # position, so the page's messages of it come from there, once, not from the page.
    with Client(server.url) as client:
        client.create_topic(topic)
        k0, k1 = _key_of(0, 2), _key_of(1, 2)
        payloads = [b"a0", b"b0", b"a1", b"b1", b"a2", b"b2"]
        client.publish(topic, [Record(p, k0 if p[:1] == b"a" else k1) for p in payloads])
        first = client.consume(topic, group="g", follow=False, partitions=2, batch_size=2)
        assert [m.payload for m in first.poll()] == [b"a0", b"b0"]
        settle_read_ahead(first)  # a1, b1: read ahead before the join
        other = client.consume(topic, group="g", follow=False)
        other.heartbeat()
        assert len(first.heartbeat().partitions) == 1
        other.close()
        assert len(first.heartbeat().partitions) == 2
        got = [m.payload for m in first]
        assert len(got) == len(set(got)), got
        assert set(got) | {b"a0", b"b0"} == set(payloads)
        first.close()


def test_a_member_whose_partition_moved_away_and_back_cannot_commit_what_it_had_before(
    server: ServerProcess, topic: str
) -> None:
    # The member polls both partitions, then (without a call in between) another member
    # joins, takes a partition, consumes and commits it, and leaves: the partition comes
    # back. The first member's commit of what it had before the move would move the
    # position back (its output, in a transaction, would repeat the other's): Kafka
    # fences such a commit by its generation.
    with Client(server.url) as client:
        client.create_topic(topic)
        k0, k1 = _key_of(0, 2), _key_of(1, 2)
        client.publish(topic, [Record(b"a", k0), Record(b"b", k1), Record(b"c", k1)])
        first = client.consume(topic, group="g", follow=False, partitions=2)
        delivered = first.poll()
        assert [m.payload for m in delivered] == [b"a", b"b", b"c"]
        first_ids = {partition_of(m, 2): m.id for m in delivered}
        # ...and more of each partition, which the other member consumes past it.
        client.publish(topic, [Record(b"d", k0), Record(b"e", k1)])
        other = client.consume(topic, group="g", follow=False)
        got = [m.payload for m in other]
        other.commit()
        other.close()
        before = client.describe_group(topic, "g").partitions
        with pytest.raises(PartitionFenced):
            first.commit()
        assert client.describe_group(topic, "g").partitions == before
        assert got  # it took a partition and consumed it
        # Having learned it got the partition back, the member commits what it kept
        # (not its older position of that partition, which would be refused as past
        # what it was delivered since, at every later commit).
        first.commit()
        after = {p.partition: p.position for p in client.describe_group(topic, "g").partitions}
        assert after == {p.partition: p.position for p in before if p.position} | {
            p.partition: first_ids[p.partition] for p in before if p.position is None
        }
        # What it kept comes on; the other member committed all of what it took.
        assert len(list(first)) == 1
        first.close()


def _moved_away_and_back(client: Client, topic: str) -> tuple[GroupConsumer, dict[int, MessageId]]:
    """A member polls both partitions; another joins, takes one, consumes and commits
    it, and leaves: the first member heard of none of it. Answers it and, per
    partition, the last id it was delivered."""
    client.create_topic(topic)
    k0, k1 = _key_of(0, 2), _key_of(1, 2)
    client.publish(topic, [Record(b"a", k0), Record(b"b", k1), Record(b"c", k1), Record(b"d", k0)])
    first = client.consume(topic, group="g", follow=False, partitions=2)
    ids = {partition_of(m, 2): m.id for m in first.poll()}
    assert len(ids) == 2
    other = client.consume(topic, group="g", follow=False)
    assert list(other)
    other.commit()
    other.close()
    return first, ids


def test_after_a_fenced_commit_the_member_commits_what_it_still_owns(
    server: ServerProcess, topic: str
) -> None:
    # A join took one of the member's partitions: its commit is fenced. When that
    # partition comes back (the other member leaves), the member's next commit must not
    # carry what it had of it before (refused as past what it was delivered, a 400, at
    # every commit after): it commits the partition it kept.
    with Client(server.url) as client:
        client.create_topic(topic)
        k0, k1 = _key_of(0, 2), _key_of(1, 2)
        client.publish(topic, [Record(b"a", k0), Record(b"b", k1)])
        first = client.consume(topic, group="g", follow=False, partitions=2)
        got = {m.payload: m.id for m in first.poll()}
        other = client.consume(topic, group="g", follow=False)
        other.heartbeat()
        with pytest.raises(PartitionFenced):
            first.commit()
        assert other.assignment is not None
        (taken,) = other.assignment.partitions
        kept = 1 - taken
        other.close()
        first.commit()
        positions = {p.partition: p.position for p in client.describe_group(topic, "g").partitions}
        assert positions == {kept: got[b"a" if kept == 0 else b"b"], taken: None}
        first.close()


@pytest.mark.parametrize("defer_begin", [True, False])
def test_a_transaction_holding_a_commit_of_a_partition_that_moved_away_and_back_fails(
    store_server: ServerProcess, topic: str, defer_begin: bool
) -> None:
    # Kafka's zombie fencing: the output of a transaction that commits positions of an
    # earlier ownership would repeat what the owner in between produced.
    with Client(store_server.url) as client:
        client.create_topic(topic + "-out")
        first, _ = _moved_away_and_back(client, topic)
        before = client.describe_group(topic, "g").partitions
        with pytest.raises(PartitionFenced), client.transaction(defer_begin=defer_begin) as tx:
            tx.publish(topic + "-out", [b"out"])
            first.commit(transaction=tx)
        assert client.describe_group(topic, "g").partitions == before
        assert client.poll(topic + "-out", transaction=client.snapshot()) == []
        first.close()


def test_a_commit_names_the_generation_its_positions_are_of(
    server: ServerProcess, topic: str
) -> None:
    # The server told the member of the newer generation (an answer the application
    # never saw, as a poll's answered ahead or one lost on the way): its commit of what
    # it had before is fenced all the same, by the generation it names.
    with Client(server.url) as client:
        first, _ = _moved_away_and_back(client, topic)
        assert first.member_id is not None
        client._send(client._api.group_heartbeat(topic, "g", first.member_id))
        before = client.describe_group(topic, "g").partitions
        with pytest.raises(PartitionFenced):
            first.commit()
        assert client.describe_group(topic, "g").partitions == before
        first.close()


def test_a_transaction_learns_of_a_move_from_a_poll_answered_ahead(
    server: ServerProcess, topic: str
) -> None:
    # A one request names no generation: the server goes by the newest it told the
    # member, here in a poll answered ahead after the move, which the application has
    # not seen. The client learns that answer first and refuses the positions of the
    # partition that moved away and back; the transaction does not commit.
    with Client(server.url) as client:
        client.create_topic(topic + "-out")
        first, ids = _moved_away_and_back(client, topic)
        assert first.member_id is not None
        first._ahead = (
            first._epoch,
            first.member_id,
            client._begin(first._worker, first._poll_call(first.member_id, 0)),
        )
        before = client.describe_group(topic, "g").partitions
        with pytest.raises(PartitionFenced), client.transaction(defer_begin=True) as tx:
            tx.publish(topic + "-out", [b"out"])
            first.commit(transaction=tx)
        assert client.describe_group(topic, "g").partitions == before
        assert client.poll(topic + "-out", transaction=client.snapshot()) == []
        # Rewound: the partition it kept comes again from its committed position (none).
        kept = [p.partition for p in before if p.position is None]
        assert len(kept) == 1
        again = [m for m in first if partition_of(m, 2) == kept[0]]
        assert again and again[-1].id == ids[kept[0]]
        first.close()


def test_whose_partition_came_back_is_kept_across_a_restart(
    start_store_server: Callable[..., ServerProcess], topic: str
) -> None:
    # Since when an owner holds each partition is durable with the assignment: after a
    # restart the member's commit of what it had before the move is still fenced (by the
    # generation it names). A commit naming none (as clients from before commits named
    # one send) from a member that made no call since the restart is fenced too: the
    # server no longer knows what it told the member.
    srv = start_store_server()
    with Client(srv.url) as client:
        first, ids = _moved_away_and_back(client, topic)
        assert first.member_id is not None
        srv.kill()
        srv.start()
        before = client.describe_group(topic, "g").partitions
        kept = next(p.partition for p in before if p.position is None)
        unnamed = client._api.group_commit(topic, "g", first.member_id, {kept: ids[kept]}, None)
        with pytest.raises(PartitionFenced):
            client._send(unnamed)
        assert client.describe_group(topic, "g").partitions == before
        with pytest.raises(PartitionFenced):
            first.commit()  # (it heartbeats then: it heard of the generation)
        assert client.describe_group(topic, "g").partitions == before
        first.close()


def test_a_partition_a_rebalance_left_in_place_commits_under_the_older_generation(
    server: ServerProcess, topic: str
) -> None:
    # A join moved the member's other partition: the one it kept, it has held without a
    # break, and positions of it from before the join still commit.
    with Client(server.url) as client:
        client.create_topic(topic)
        client.publish(topic, [Record(b"a", _key_of(0, 2)), Record(b"b", _key_of(1, 2))])
        first = client.consume(topic, group="g", follow=False, partitions=2)
        ids = {partition_of(m, 2): m.id for m in first.poll()}
        assert first.assignment is not None and first.member_id is not None
        generation = first.assignment.generation
        other = client.consume(topic, group="g", follow=False)
        (taken,) = other.heartbeat().partitions
        kept = 1 - taken
        call = client._api.group_commit(
            topic, "g", first.member_id, {kept: ids[kept]}, None, generation
        )
        client._send(call)
        positions = {p.partition: p.position for p in client.describe_group(topic, "g").partitions}
        assert positions == {kept: ids[kept], taken: None}
        first.close()
        other.close()


@pytest.mark.parametrize(
    ("begin", "hear"),
    [("one request", "heartbeat"), ("one request", "poll"), ("deferred begin", "heartbeat")],
)
def test_a_transaction_holding_positions_of_a_partition_that_moved_away_and_back_since_fails(
    server: ServerProcess, topic: str, begin: str, hear: str
) -> None:
    # The positions went into the transaction before the move; the member then heard
    # of it (a heartbeat or a poll) before the transaction was sent. The server goes by what it
    # told the member, so the positions of the earlier ownership were accepted and the
    # transaction's output repeated what the owner in between produced.
    with Client(server.url) as client:
        client.create_topic(topic)
        client.create_topic(topic + "-out")
        k0, k1 = _key_of(0, 2), _key_of(1, 2)
        client.publish(topic, [Record(b"a", k0), Record(b"b", k1), Record(b"c", k0)])
        first = client.consume(topic, group="g", follow=False, partitions=2)
        assert len(first.poll()) == 3
        with pytest.raises(PartitionFenced), client.transaction(defer_begin=True) as tx:
            tx.publish(topic + "-out", [b"out"])
            first.commit(transaction=tx)
            other = client.consume(topic, group="g", follow=False)
            assert list(other)
            other.commit()
            other.close()
            before = client.describe_group(topic, "g").partitions
            if hear == "heartbeat":
                assert len(first.heartbeat().partitions) == 2
            else:
                assert first.poll() == []  # (nothing past what the other committed)
                assert first.assignment is not None
                assert len(first.assignment.partitions) == 2
            if begin == "deferred begin":
                tx.start()
        assert client.describe_group(topic, "g").partitions == before
        assert client.poll(topic + "-out", transaction=client.snapshot()) == []
        # Rewound: the partition it kept comes again from its committed position (none);
        # the other member committed all of the one it took.
        (kept,) = [p.partition for p in before if p.position is None]
        assert [m.payload for m in first] == ([b"a", b"c"] if kept == 0 else [b"b"])
        first.close()


def test_a_one_request_in_json_names_the_generation_its_positions_are_of(
    server: ServerProcess, topic: str
) -> None:
    # The server told the member of the newer generation (an answer the application
    # never saw): a JSON one request naming the generation its positions are of is
    # fenced by it, as a plain commit is; a bad one is a 400; neither changes anything.
    with Client(server.url) as client:
        client.create_topic(topic + "-out")
        first, ids = _moved_away_and_back(client, topic)
        assert first.member_id is not None and first.assignment is not None
        client._send(client._api.group_heartbeat(topic, "g", first.member_id))
        before = client.describe_group(topic, "g").partitions
        (back,) = [p.partition for p in before if p.position is not None]
        url = f"{server.url}/v1/namespaces/default/transactions/publish"
        for status, generation in [(403, first.assignment.generation), (400, "x"), (400, -1)]:
            item = {
                "topic": topic,
                "group": "g",
                "memberId": first.member_id,
                "positions": [
                    {"partition": back, "id": base64.b64encode(ids[back].to_bytes()).decode()}
                ],
                "generation": generation,
            }
            body = {"topics": [{"topic": topic + "-out", "messages": ["eA=="]}]}
            answer = httpx.post(url, json=body | {"groupCommits": [item]})
            assert answer.status_code == status, answer.text
            assert isinstance(answer.json()["error"], str)
            if status == 403:
                assert answer.json()["type"] == "PartitionFenced"
            assert client.describe_group(topic, "g").partitions == before
            assert client.poll(topic + "-out", transaction=client.snapshot()) == []
        first.close()
