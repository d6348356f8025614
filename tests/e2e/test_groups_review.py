"""Consumer groups at their edges, through the real server and clients: a member back
after its session ran out, a closed member, and the like."""

from __future__ import annotations

import base64
import threading
import time

import httpx
import pytest

from tests.e2e.serverproc import ServerProcess
from tidings import AsyncClient, Client
from tidings.structs import Record

pytestmark = pytest.mark.e2e


def _fill(client: Client, topic: str, n: int = 20, keys: int = 5) -> None:
    client.create_topic(topic)
    client.publish(topic, [Record(b"v%d" % i, b"k%d" % (i % keys)) for i in range(n)])


def test_a_member_rejoining_with_its_id_after_its_session_ran_out_owns_partitions_again(
    server: ServerProcess, topic: str
) -> None:
    with Client(server.url) as client:
        _fill(client, topic)
    url = f"{server.url}/v1/namespaces/default/topics/{topic}/groups/g"
    with httpx.Client(timeout=10) as http:
        first = http.post(url + "/join", json={"sessionTimeoutMs": 100, "partitions": 4}).json()
        member = first["memberId"]
        assert first["partitions"] == [0, 1, 2, 3]
        time.sleep(0.3)  # past its session; no call on the group dropped it yet
        again = http.post(url + "/join", json={"memberId": member, "sessionTimeoutMs": 10_000})
        assert again.status_code == 200
        # Coming back is a rebalance, and the member alone owns every partition.
        assert again.json()["partitions"] == [0, 1, 2, 3]
        assert again.json()["generation"] > first["generation"]
        described = http.get(url).json()
        assert [p["owner"] for p in described["partitions"]] == [member] * 4
        polled = http.post(url + "/poll", json={"memberId": member, "limit": 100})
        assert polled.status_code == 200 and polled.headers["Tidings-Count"] == "20"
        http.post(url + "/leave", json={"memberId": member})


def test_a_closed_member_does_not_join_again_on_a_heartbeat(
    server: ServerProcess, topic: str
) -> None:
    with Client(server.url) as client:
        _fill(client, topic)
        consumer = client.consume(topic, group="g", follow=False, partitions=4)
        assert consumer.poll()
        consumer.close()
        with pytest.raises(RuntimeError):
            consumer.heartbeat()
        assert client.describe_group(topic, "g").members == {}


async def test_a_closed_async_member_does_not_join_again_on_a_heartbeat(
    server: ServerProcess, topic: str
) -> None:
    with Client(server.url) as sync:
        _fill(sync, topic)
    async with AsyncClient(server.url) as client:
        consumer = client.consume(topic, group="g", follow=False, partitions=4)
        assert await consumer.poll()
        await consumer.close()
        with pytest.raises(RuntimeError):
            await consumer.heartbeat()
        assert (await client.describe_group(topic, "g")).members == {}


def test_a_commit_after_close_says_it_cannot_commit(server: ServerProcess, topic: str) -> None:
    with Client(server.url) as client:
        _fill(client, topic)
        consumer = client.consume(topic, group="g", follow=False)
        assert len(consumer.poll()) == 20
        consumer.close()
        with pytest.raises(RuntimeError):  # not a silent no-op: nothing was committed
            consumer.commit()
        assert client.describe_group(topic, "g").lag == 20


@pytest.mark.parametrize("deleted", ["group", "topic"])
def test_closing_a_member_whose_group_was_deleted_raises_nothing(
    server: ServerProcess, topic: str, deleted: str
) -> None:
    with Client(server.url) as client:
        _fill(client, topic)
        consumer = client.consume(topic, group="g", follow=False)
        assert consumer.poll()
        if deleted == "group":
            client.delete_group(topic, "g")
        else:
            client.delete_topic(topic)
        consumer.close()  # its group is gone, and the member with it
        with pytest.raises(RuntimeError):
            consumer.poll()


def test_a_member_waiting_in_a_long_poll_stays_in_the_group_with_a_short_session(
    server: ServerProcess, topic: str
) -> None:
    with Client(server.url) as client, Client(server.url) as other:
        client.create_topic(topic)
        waiter = client.consume(topic, group="g", session_timeout=0.3, wait=1.5)
        beater = other.consume(topic, group="g", session_timeout=0.3, wait=1.5)
        waiter.heartbeat(), beater.heartbeat()
        settled = waiter.heartbeat().generation
        generations: list[int] = []
        done = threading.Event()

        def beat() -> None:  # the other member's calls find anyone past their session
            for _ in range(40):
                generations.append(beater.heartbeat().generation)
                if done.wait(0.1):
                    break

        thread = threading.Thread(target=beat)
        thread.start()
        try:
            assert waiter.poll() == []  # a long poll on an empty topic, well past 0.3 s
        finally:
            done.set()
            thread.join()
        assert waiter.assignment is not None and waiter.assignment.generation == settled
        assert set(generations) == {settled}  # nobody was dropped: no rebalance
        waiter.close()
        beater.close()


@pytest.mark.parametrize("then", ["poll", "close"])
def test_an_auto_committing_member_outlives_a_rebalance_it_had_not_heard_of(
    server: ServerProcess, topic: str, then: str
) -> None:
    with Client(server.url) as client, Client(server.url) as other:
        _fill(client, topic, 40, keys=8)
        member = client.consume(topic, group="g", follow=False, partitions=4, auto_commit=True)
        assert len(member.poll()) == 40  # every partition's messages, not committed yet
        newcomer = other.consume(topic, group="g", follow=False)
        newcomer.heartbeat()  # takes half the partitions: member learns of it later
        if then == "poll":
            for _ in range(3):  # was PartitionFenced, at every poll
                assert member.poll() == []
            assert member.assignment is not None
            kept = set(member.assignment.partitions)
        else:
            kept = set(range(4)) - set(newcomer.heartbeat().partitions)
            member.close()  # was PartitionFenced
        info = client.describe_group(topic, "g")
        # What it still owned committed; the moved partitions' messages are the
        # newcomer's again (at least once).
        assert {p.partition for p in info.partitions if p.position is not None} == kept
        assert info.lag == 20
        assert len(newcomer.poll()) == 20  # the moved partitions' messages, only
        member.close()
        newcomer.close()


@pytest.mark.parametrize("timeout_ms", [0, 99, 300_001])
def test_a_join_with_a_session_timeout_out_of_range_is_refused(
    server: ServerProcess, topic: str, timeout_ms: int
) -> None:
    with Client(server.url) as client:
        _fill(client, topic)
    url = f"{server.url}/v1/namespaces/default/topics/{topic}/groups/g"
    with httpx.Client(timeout=10) as http:
        r = http.post(url + "/join", json={"sessionTimeoutMs": timeout_ms})
        assert r.status_code == 400 and "sessionTimeoutMs" in r.json()["error"]
        assert http.get(url).status_code == 404  # no group was made


def test_a_rollback_after_the_commit_leaves_the_positions_committed(
    server: ServerProcess, topic: str
) -> None:
    # A rollback that comes after the commit (sent by hand, or by a client that does
    # not ask first whether its commit got through) must not take back positions the
    # commit made the group's: the messages would be delivered again.
    with Client(server.url) as client:
        _fill(client, topic, n=6)
        member = client.consume(topic, group="g", follow=False, partitions=1)
        got = member.poll()
        assert len(got) == 6 and member.assignment is not None
        base = f"{server.url}/v1"
        group = f"{base}/namespaces/default/topics/{topic}/groups/g"
        body = {
            "memberId": member.assignment.member_id,
            "positions": [{"partition": 0, "id": base64.b64encode(got[-1].id.to_bytes()).decode()}],
        }

        def commit_under_a_transaction() -> int:
            wp: int = httpx.post(f"{base}/transactions", json={}).json()["writePointer"]
            answer = httpx.post(f"{group}/commit", json={**body, "transactionWritePointer": wp})
            assert answer.status_code == 200, answer.text
            return wp

        wp = commit_under_a_transaction()
        assert httpx.post(f"{base}/transactions/{wp}/commit", json={}).status_code == 200
        assert client.describe_group(topic, "g").lag == 0
        answer = httpx.post(f"{group}/rollback", json={"transactionWritePointer": wp})
        assert answer.status_code == 200
        assert client.describe_group(topic, "g").lag == 0
        # One that did not commit is rolled back as before: its positions never count,
        # and the member is delivered again from the committed ones (here, the end).
        wp = commit_under_a_transaction()
        assert httpx.post(f"{base}/transactions/{wp}/invalidate").status_code == 200
        answer = httpx.post(
            f"{group}/rollback",
            json={"transactionWritePointer": wp, "memberId": member.assignment.member_id},
        )
        assert answer.status_code == 200
        assert client.describe_group(topic, "g").lag == 0
        member.close()
