"""Queues through the real server and the real clients: what a refused transaction
leaves of its acks, give-backs of messages that moved on, and bad input."""

from __future__ import annotations

import base64
import time
from collections.abc import Callable

import httpx
import pytest

from tests.e2e.serverproc import ServerProcess
from tests.e2e.test_queues import fill
from tidings import AsyncClient, Client
from tidings.errors import AckConflict, TopicNotFound, TransactionTimedOut
from tidings.structs import MessageId

pytestmark = pytest.mark.e2e


def b64(ids: list[MessageId]) -> list[str]:
    return [base64.b64encode(i.to_bytes()).decode() for i in ids]


def one_request(server: ServerProcess) -> str:
    return f"{server.url}/v1/namespaces/default/transactions/publish"


def test_acks_of_a_refused_transaction_stay_with_their_worker(
    server: ServerProcess, topic: str
) -> None:
    # The server refuses the transaction after it took the acks (an unknown output
    # topic): the worker keeps its lease, so no other worker gets the messages early,
    # and it may ack them again.
    with Client(server.url) as client:
        fill(client, topic, 3)
        q = client.queue(topic, "work", ack_timeout=60)
        batch = q.pop(2)
        with pytest.raises(TopicNotFound), client.transaction() as tx:
            tx.publish(topic + "-nowhere", [m.payload for m in batch])
            q.ack(batch, transaction=tx)
        other = client.queue(topic, "work")
        assert [m.payload for m in other.pop(10)] == [b"job-2"]
        stats = client.describe_queue(topic, "work")
        assert stats.consumers == {q.consumer_id: 2, other.consumer_id: 1}
        q.ack(batch)
        assert client.describe_queue(topic, "work").acked == 2


def test_acks_taken_before_a_conflicting_one_stay_with_their_worker(
    server: ServerProcess, topic: str
) -> None:
    with Client(server.url) as client:
        fill(client, topic, 3)
        client.create_topic(topic + "-out")
        mine = client.queue(topic, "work", ack_timeout=60)
        theirs = client.queue(topic, "work", ack_timeout=60)
        a, b = mine.pop(2), theirs.pop(1)
        body = {
            "topics": [{"topic": topic + "-out", "messages": ["eA=="]}],
            "acks": [
                {"topic": topic, "queue": "work", "consumerId": mine.consumer_id,
                 "ids": b64([m.id for m in a])},
                {"topic": topic, "queue": "work", "consumerId": mine.consumer_id,
                 "ids": b64([b[0].id])},
            ],
        }  # fmt: skip
        answer = httpx.post(one_request(server), json=body)
        assert answer.status_code == 409, answer.text
        assert answer.json()["type"] in ("NotDelivered", "AckConflict")
        assert client.queue(topic, "work").pop(10) == []  # nothing handed out again
        stats = client.describe_queue(topic, "work")
        assert stats.consumers == {mine.consumer_id: 2, theirs.consumer_id: 1}
        assert [m.delivery_count for m in a] == [1, 1]
        mine.ack(a)
        theirs.ack(b)
        assert client.poll(topic + "-out") == []


def test_acks_of_a_refused_transaction_whose_lease_ran_out_go_back_to_the_queue(
    server: ServerProcess, topic: str
) -> None:
    with Client(server.url) as client:
        fill(client, topic, 1)
        q = client.queue(topic, "work", ack_timeout=0.3)
        got = q.pop(1)
        time.sleep(0.4)  # ran out; still the worker's to ack while nobody took it
        body = {
            "topics": [{"topic": topic + "-nowhere", "messages": ["eA=="]}],
            "acks": [{"topic": topic, "queue": "work", "consumerId": q.consumer_id,
                      "ids": b64([got[0].id])}],
        }  # fmt: skip
        assert httpx.post(one_request(server), json=body).status_code == 404
        again = client.queue(topic, "work").pop(1)
        assert [(m.id, m.delivery_count) for m in again] == [(got[0].id, 2)]
        with pytest.raises(AckConflict):
            q.ack(got)
        assert client.describe_queue(topic, "work").expired == 1  # its lease ran out once


def test_a_give_back_skips_the_messages_that_moved_on_and_gives_back_the_rest(
    server: ServerProcess, topic: str
) -> None:
    with Client(server.url) as client:
        fill(client, topic, 2)
        q = client.queue(topic, "work", ack_timeout=0.3)
        stale = q.pop(1)
        q.ack_timeout = 60
        held = q.pop(1)
        time.sleep(0.4)  # the first lease ran out: another worker takes it
        other = client.queue(topic, "work")
        assert [m.id for m in other.pop(5)] == [stale[0].id]
        assert q.nack([stale[0], held[0]]) == [stale[0].id]
        again = client.queue(topic, "work").pop(5)
        assert [(m.id, m.delivery_count) for m in again] == [(held[0].id, 2)]
        assert client.describe_queue(topic, "work").nacked == 1
        other.ack([stale[0]])  # still the other worker's

        # Dead-lettered meanwhile, or never delivered at all: skipped as well, and
        # answered in the order given.
        fill(client, topic + "-b", 2)
        q = client.queue(topic + "-b", "work", ack_timeout=0.3, max_deliveries=1)
        stale = q.pop(1)
        q.ack_timeout = 60
        held = q.pop(1)
        time.sleep(0.4)
        assert client.queue(topic + "-b", "work", max_deliveries=1).pop(5) == []
        never = MessageId(1, 2, 3, 4)
        url = f"{server.url}/v1/namespaces/default/topics/{topic}-b/queues/work/nack"
        body = {"consumerId": q.consumer_id, "ids": b64([never, held[0].id, stale[0].id])}
        answer = httpx.post(url, json=body)
        assert answer.status_code == 200, answer.text
        assert answer.json() == {"skipped": b64([never, stale[0].id])}
        assert client.describe_queue(topic + "-b", "work").nacked == 1
        # Given back, it was delivered its one time: the next pop dead-letters it too.
        assert client.queue(topic + "-b", "work").pop(5) == []
        assert [m.payload for m in client.poll(topic + "-b-dlq")] == [b"job-0", b"job-1"]
        # Malformed ids are still refused as a whole.
        body = {"consumerId": q.consumer_id, "ids": ["bm90IGFuIGlk"]}
        assert httpx.post(url, json=body).status_code == 400


def test_a_pop_naming_settings_no_queue_may_have_is_refused_once_the_queue_exists(
    server: ServerProcess, topic: str
) -> None:
    # The first pop checks them as it creates the queue; later pops answered from
    # memory must refuse them too, not ignore them.
    with Client(server.url) as client:
        fill(client, topic, 2)
        q = client.queue(topic, "work")
        assert len(q.pop(1)) == 1
        url = f"{server.url}/v1/namespaces/default/topics/{topic}/queues/work/pop"
        for body, needle in (
            ({"consumerId": "x1", "start": "middle"}, "start"),
            ({"consumerId": "x1", "start": ""}, "start"),
            ({"consumerId": "x1", "maxDeliveries": 1001}, "maxDeliveries"),
            ({"consumerId": "x1", "deadLetterTopic": topic}, "dead-letter"),
        ):
            answer = httpx.post(url, json=body)
            assert answer.status_code == 400, (body, answer.text)
            assert needle in answer.json()["error"]
        stats = client.describe_queue(topic, "work")
        assert (stats.popped, stats.consumers, stats.max_deliveries) == (1, {q.consumer_id: 1}, 20)


def test_an_ack_sent_again_after_a_server_kill_is_answered_as_done(
    start_server: Callable[..., ServerProcess],
) -> None:
    # Its answer lost with the server, the worker sends the ack again: the message is
    # acked (durably), so the retry is answered as done, as it is before a restart.
    srv = start_server()
    with Client(srv.url) as client:
        fill(client, "jobs", 3)
        q = client.queue("jobs", "work", ack_timeout=60)
        got = q.pop(2)
        q.ack(got[:1])
        q.ack(got[:1])
    srv.kill()
    srv.start()
    base = f"{srv.url}/v1/namespaces/default/topics/jobs/queues/work"
    body = {"consumerId": q.consumer_id, "ids": b64([got[0].id])}
    answer = httpx.post(base + "/ack", json=body)
    assert answer.status_code == 200, answer.text
    # Never delivered, or in a transaction: refused as before.
    body["ids"] = b64([MessageId(1, 2, 3, 4)])
    assert httpx.post(base + "/ack", json=body).json()["type"] == "NotDelivered"
    wp = httpx.post(f"{srv.url}/v1/transactions", json={}).json()["writePointer"]
    body = {"consumerId": q.consumer_id, "ids": b64([got[0].id]), "transactionWritePointer": wp}
    assert httpx.post(base + "/ack", json=body).status_code == 409
    with Client(srv.url) as client:
        stats = client.describe_queue("jobs", "work")
        assert (stats.pending, stats.waiting, stats.consumers) == (1, 1, {q.consumer_id: 1})


def test_an_ack_of_a_dead_lettered_message_is_a_conflict(server: ServerProcess, topic: str) -> None:
    with Client(server.url) as client:
        fill(client, topic, 1)
        slow = client.queue(topic, "work", ack_timeout=0.3, max_deliveries=1)
        got = slow.pop(1)
        time.sleep(0.4)
        assert client.queue(topic, "work").pop(1) == []  # dead-lettered
        with pytest.raises(AckConflict, match="dead-letter"):
            slow.ack(got)
        assert slow.nack(got) == [got[0].id]


async def test_an_endless_ack_timeout_is_refused_when_the_handle_is_made(
    server: ServerProcess, topic: str
) -> None:
    with Client(server.url) as client:
        for bad in (float("inf"), float("nan"), 0, -1):
            with pytest.raises(ValueError, match="ack_timeout"):
                client.queue(topic, "work", ack_timeout=bad)
    async with AsyncClient(server.url) as aclient:
        with pytest.raises(ValueError, match="ack_timeout"):
            aclient.queue(topic, "work", ack_timeout=float("inf"))


def test_a_worker_extends_its_lease_for_a_long_job(
    start_server: Callable[..., ServerProcess],
) -> None:
    srv = start_server()
    with Client(srv.url) as client:
        fill(client, "jobs", 4)
        q = client.queue("jobs", "work", ack_timeout=0.5)
        job = q.pop(2)
        assert q.extend(job, 60) == []
        time.sleep(0.7)  # past the pop's lease, not past the extension
        other = client.queue("jobs", "work")
        theirs = other.pop(10)
        assert [m.payload for m in theirs] == [b"job-2", b"job-3"]
        stats = client.describe_queue("jobs", "work")
        assert stats.consumers == {q.consumer_id: 2, other.consumer_id: 2}
        assert (stats.expired, stats.redelivered) == (0, 0)
        # Those it does not hold are skipped (given back, never popped, another
        # worker's), in the order given; the rest are extended.
        q.nack(job[1:])
        never = MessageId(1, 2, 3, 4)
        skipped = q.extend([never, *job, theirs[0]], 60)
        assert skipped == [never, job[1].id, theirs[0].id]
    srv.kill()
    srv.start()
    time.sleep(0.6)  # past the pop's 0.5 s, had the extension not been written
    with Client(srv.url) as client:
        after = client.queue("jobs", "work").pop(10)
        # The nacked one comes back; the extended one stays its worker's.
        assert [(m.id, m.delivery_count) for m in after] == [(job[1].id, 2)]
        base = f"{srv.url}/v1/namespaces/default/topics/jobs/queues/work"
        good = {"consumerId": q.consumer_id, "ids": b64([job[0].id])}
        for bad in (
            {**good, "ackTimeoutMs": 0},
            {**good, "ackTimeoutMs": 43_200_001},
            {**good, "ackTimeoutMs": "60"},
            {**good, "transactionWritePointer": 5},
            {**good, "ids": []},
            {"ids": good["ids"]},
        ):
            answer = httpx.post(base + "/extend", json=bad)
            assert answer.status_code == 400, (bad, answer.text)
        nowhere = base.replace("/work", "/nope") + "/extend"
        assert httpx.post(nowhere, json=good).status_code == 404
        assert httpx.post(base + "/ack", json=good).status_code == 200
        assert client.describe_queue("jobs", "work").acked == 1


def test_acks_of_a_transaction_refused_step_by_step_stay_with_their_worker(
    server: ServerProcess, topic: str
) -> None:
    # Begun before its commit (defer_begin=False; so also a transaction whose
    # messages are streamed): the server refuses the commit, the client rolls back,
    # and the worker keeps its messages as in the one-request case.
    with Client(server.url) as client:
        fill(client, topic, 3)
        client.create_topic(topic + "-out")
        q = client.queue(topic, "work", ack_timeout=60)
        batch = q.pop(2)
        with (
            pytest.raises(TransactionTimedOut),
            client.transaction(timeout=0.3, defer_begin=False) as tx,
        ):
            tx.publish(topic + "-out", [m.payload for m in batch])
            q.ack(batch, transaction=tx)
            time.sleep(0.5)
        assert tx.state == "aborted"
        assert [m.payload for m in client.queue(topic, "work").pop(10)] == [b"job-2"]
        q.ack(batch)
        assert client.poll(topic + "-out") == []
        # The application's own failure still gives them back to the queue at once.
        fill(client, topic + "-b", 1)
        q = client.queue(topic + "-b", "work", ack_timeout=60)
        got = q.pop(1)
        with pytest.raises(RuntimeError), client.transaction(defer_begin=False) as tx:
            q.ack(got, transaction=tx)
            raise RuntimeError("the job failed")
        assert [m.id for m in client.queue(topic + "-b", "work").pop(1)] == [got[0].id]
