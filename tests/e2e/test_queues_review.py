"""Queue behaviour at the edges, through the real server and the real clients: acks in
transactions that ended, rollbacks that come late, bad input."""

from __future__ import annotations

import base64
import time

import httpx
import pytest

from tests.e2e.serverproc import ServerProcess
from tidings import AsyncClient, Client
from tidings.errors import TopicNotFound
from tidings.structs import MessageId, Record

pytestmark = pytest.mark.e2e


def b64(ids: list[MessageId]) -> list[str]:
    return [base64.b64encode(i.to_bytes()).decode() for i in ids]


def test_a_rollback_after_the_commit_leaves_the_acks_acked(
    server: ServerProcess, topic: str
) -> None:
    # A client that loses a commit's answer rolls its participants back: the queue's
    # rollback must not give back acks that the commit made count.
    with Client(server.url) as client:
        client.create_topic(topic)
        client.publish(topic, [b"job"])
        q = client.queue(topic, "work")
        got = q.pop(1)
        base = f"{server.url}/v1"
        queue = f"{base}/namespaces/default/topics/{topic}/queues/work"
        wp = httpx.post(f"{base}/transactions", json={}).json()["writePointer"]
        body = {"consumerId": q.consumer_id, "ids": b64([got[0].id]), "transactionWritePointer": wp}
        assert httpx.post(f"{queue}/ack", json=body).status_code == 200
        assert httpx.post(f"{base}/transactions/{wp}/commit", json={}).status_code == 200
        answer = httpx.post(f"{queue}/rollback", json={"transactionWritePointer": wp})
        assert answer.status_code == 200 and answer.json() == {"returned": 0}
        assert client.queue(topic, "work").pop(5) == []
        stats = client.describe_queue(topic, "work")
        assert (stats.acked, stats.pending, stats.waiting) == (1, 0, 0)


def test_a_message_past_its_expiry_is_not_delivered_again(
    server: ServerProcess, topic: str
) -> None:
    # A poll no longer sees it, and a restarted server forgets it: a pop must not hand
    # it out again from memory either.
    with Client(server.url) as client:
        client.create_topic(topic)
        client.publish(topic, [Record(b"short", ttl=1), Record(b"long")])
        q = client.queue(topic, "work")
        got = q.pop(2)
        assert [m.payload for m in got] == [b"short", b"long"]
        time.sleep(1.2)
        assert [m.payload for m in client.poll(topic)] == [b"long"]
        q.nack(got)
        again = q.pop(5)
        assert [(m.payload, m.delivery_count) for m in again] == [(b"long", 2)]
        q.ack(again)
        stats = client.describe_queue(topic, "work")
        assert (stats.pending, stats.waiting, stats.ack_state) == (0, 0, 0)


def test_messages_of_every_kind_come_back_after_a_nack(server: ServerProcess, topic: str) -> None:
    # Plain, keyed, with headers, and transactional ones stored apart from their entry
    # (payloads above the threshold): each is still the topic's, so each comes back.
    with Client(server.url) as client:
        client.create_topic(topic)
        client.publish(topic, [Record(b"plain"), Record(b"keyed", b"k", {"h": b"1"})])
        with client.transaction(payload_threshold=0) as tx:
            tx.publish(topic, [b"stored-1", b"stored-2"])
        q = client.queue(topic, "work")
        got = q.pop(10)
        assert len(got) == 4
        q.nack(got)
        again = q.pop(10)
        assert [m.id for m in again] == [m.id for m in got]
        assert [m.delivery_count for m in again] == [2] * 4
        q.ack(again)


def test_closing_a_handle_of_a_deleted_topic_is_quiet(server: ServerProcess, topic: str) -> None:
    # Deleting the topic deletes its queues, as deleting the queue does: close() (and
    # so a `with` block's exit) has nothing to give back and must not raise over the
    # block's own error.
    with Client(server.url) as client:
        client.create_topic(topic)
        client.publish(topic, [b"job"])
        q = client.queue(topic, "work")
        assert q.pop(1)
        client.delete_topic(topic)
        q.close()
        with pytest.raises(RuntimeError, match="the block's own"), client.queue(topic, "w"):
            raise RuntimeError("the block's own error")


async def test_closing_an_async_handle_of_a_missing_topic_is_quiet(
    server: ServerProcess, topic: str
) -> None:
    async with AsyncClient(server.url) as client:
        with pytest.raises(RuntimeError, match="no such topic"):
            async with client.queue(topic, "work") as q:
                with pytest.raises(TopicNotFound):
                    await q.pop(1)
                raise RuntimeError("no such topic")
