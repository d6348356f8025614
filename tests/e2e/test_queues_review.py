"""Queue behaviour at the edges, through the real server and the real clients: rollbacks
that come after the commit, messages past their expiry, handles of deleted topics,
dead-letter topics and permissions."""

from __future__ import annotations

import base64
import hashlib
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from tests.e2e.serverproc import ServerProcess
from tidings import AsyncClient, Client
from tidings.errors import Forbidden, TopicNotFound
from tidings.structs import MessageId, Record

pytestmark = pytest.mark.e2e


def b64(ids: list[MessageId]) -> list[str]:
    return [base64.b64encode(i.to_bytes()).decode() for i in ids]


def test_a_rollback_after_the_commit_leaves_the_acks_acked(
    server: ServerProcess, topic: str
) -> None:
    # A rollback that comes after the commit (sent by hand, or by a client that does
    # not ask first whether its commit got through) must not give back acks that the
    # commit made count.
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
        # One that did not commit gives its acks back, and says how many.
        client.publish(topic, [b"next"])
        got = q.pop(1)
        wp = httpx.post(f"{base}/transactions", json={}).json()["writePointer"]
        body = {"consumerId": q.consumer_id, "ids": b64([got[0].id]), "transactionWritePointer": wp}
        assert httpx.post(f"{queue}/ack", json=body).status_code == 200
        assert httpx.post(f"{base}/transactions/{wp}/invalidate").status_code == 200
        answer = httpx.post(f"{queue}/rollback", json={"transactionWritePointer": wp})
        assert answer.json() == {"returned": 1}
        again = q.pop(1)
        assert [(m.payload, m.delivery_count) for m in again] == [(b"next", 2)]


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


def test_naming_a_dead_letter_topic_takes_publish_on_it(
    start_server: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    # Dead letters are published to that topic (created if need be): a principal that
    # may only consume the queue's topic must not publish, through its nacks, into a
    # topic it may not publish to, nor create one.
    tokens = {"admin": "admin-token-0123456789", "worker": "worker-token-0123456789"}

    def principal(name: str, extra: str) -> str:
        digest = hashlib.sha256(tokens[name].encode()).hexdigest()
        return f'[[principal]]\nname = "{name}"\ntoken_sha256 = "{digest}"\n{extra}\n'

    auth = tmp_path / "auth.toml"
    auth.write_text(
        principal("admin", "admin = true")
        + principal("worker", 'consume = ["jobs"]\npublish = ["jobs-failed"]')
    )
    srv = start_server("--auth-file", str(auth))
    with Client(srv.url, token=tokens["admin"]) as admin:
        admin.create_topic("jobs")
        admin.create_topic("payments")
        admin.publish("jobs", [b"job"])
    with Client(srv.url, token=tokens["worker"]) as worker:
        for target in ("payments", "brand-new"):
            q = worker.queue("jobs", "work", max_deliveries=1, dead_letter_topic=target)
            with pytest.raises(Forbidden, match=target):
                q.pop(1)
        q = worker.queue("jobs", "work", max_deliveries=1, dead_letter_topic="jobs-failed")
        q.nack(q.pop(1))
        assert q.pop(1) == []  # dead-lettered where it may publish
    with Client(srv.url, token=tokens["admin"]) as admin:
        assert admin.poll("payments") == []
        assert "brand-new" not in admin.list_topics()
        assert [m.payload for m in admin.poll("jobs-failed")] == [b"job"]
