"""A group commit or a queue ack under a transaction that ended or never existed is
refused with an error that says what was tried, through the real server."""

from __future__ import annotations

import base64

import httpx
import pytest

from tests.e2e.serverproc import ServerProcess
from tidings import Client
from tidings.structs import MessageId

pytestmark = pytest.mark.e2e


def _b64(message_id: MessageId) -> str:
    return base64.b64encode(message_id.to_bytes()).decode()


def _aborted(base: str) -> int:
    wp: int = httpx.post(f"{base}/transactions", json={}).json()["writePointer"]
    assert httpx.post(f"{base}/transactions/{wp}/abort", json={}).status_code == 200
    return wp


def test_a_group_commit_under_an_ended_transaction_says_it_commits_positions(
    server: ServerProcess, topic: str
) -> None:
    base = f"{server.url}/v1"
    with Client(server.url) as client:
        client.create_topic(topic)
        client.publish(topic, [b"a", b"b"])
        member = client.consume(topic, group="g", follow=False, partitions=1)
        got = member.poll()
        assert len(got) == 2 and member.assignment is not None
        group = f"{base}/namespaces/default/topics/{topic}/groups/g"
        body = {
            "memberId": member.assignment.member_id,
            "positions": [{"partition": 0, "id": _b64(got[-1].id)}],
        }
        wp = _aborted(base)
        answer = httpx.post(f"{group}/commit", json={**body, "transactionWritePointer": wp})
        assert answer.status_code == 410
        assert answer.json() == {
            "error": f"cannot commit group positions under transaction {wp}: it was aborted",
            "type": "TransactionAborted",
        }
        missing = wp + 1_000_000
        answer = httpx.post(f"{group}/commit", json={**body, "transactionWritePointer": missing})
        assert answer.status_code == 404
        assert answer.json()["type"] == "TransactionNotFound"
        assert answer.json()["error"].startswith(
            f"cannot commit group positions under transaction {missing}: "
        )
        assert client.describe_group(topic, "g").lag == 2  # nothing was committed
        member.close()


def test_a_queue_ack_under_an_ended_transaction_says_it_acks(
    server: ServerProcess, topic: str
) -> None:
    base = f"{server.url}/v1"
    with Client(server.url) as client:
        client.create_topic(topic)
        client.publish(topic, [b"job"])
        q = client.queue(topic, "work")
        got = q.pop(1)
        queue = f"{base}/namespaces/default/topics/{topic}/queues/work"
        body = {"consumerId": q.consumer_id, "ids": [_b64(got[0].id)]}
        wp = _aborted(base)
        answer = httpx.post(f"{queue}/ack", json={**body, "transactionWritePointer": wp})
        assert answer.status_code == 410
        assert answer.json() == {
            "error": f"cannot ack under transaction {wp}: it was aborted",
            "type": "TransactionAborted",
        }
        missing = wp + 1_000_000
        answer = httpx.post(f"{queue}/ack", json={**body, "transactionWritePointer": missing})
        assert answer.status_code == 404
        assert answer.json()["type"] == "TransactionNotFound"
        assert answer.json()["error"].startswith(f"cannot ack under transaction {missing}: ")
        # Nothing was acked: the message is still the worker's, to ack for good.
        stats = client.describe_queue(topic, "work")
        assert (stats.acked, stats.pending) == (0, 1)
        q.ack(got)
        assert client.describe_queue(topic, "work").acked == 1
