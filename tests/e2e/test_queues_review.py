"""Queue behaviour at the edges, through the real server and the real clients: acks in
transactions that ended, rollbacks that come late, bad input."""

from __future__ import annotations

import base64

import httpx
import pytest

from tests.e2e.serverproc import ServerProcess
from tidings import Client
from tidings.structs import MessageId

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
