"""Groups and queues on a PostgreSQL store with two instances, black box: what a client
sends to the instance standing by is forwarded to the leader and takes effect there,
and bad input is refused alike on LMDB, by the leader and through the standby."""

from __future__ import annotations

import base64
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import fresh_database
from tests.e2e.serverproc import ServerProcess, readiness
from tidings import Client, Record
from tidings.structs import MessageId

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def pair(postgres_url: str) -> Iterator[tuple[ServerProcess, ServerProcess]]:
    """A leader and a standby on one fresh database (the default lease: nothing here
    stops either, and a short one could pass on a busy machine)."""
    root = Path(tempfile.mkdtemp(prefix="tidings-pair-"))
    url = fresh_database(postgres_url)
    nodes: list[ServerProcess] = []
    try:
        for n in range(2):
            nodes.append(ServerProcess(root / f"node{n}", ["--store", url]).start())
        assert readiness(nodes[0]) == "ready" and readiness(nodes[1]) == "forwarding"
        yield nodes[0], nodes[1]
    finally:
        for node in nodes:
            node.kill()
        shutil.rmtree(root, ignore_errors=True)


def test_group_commits_sent_to_the_standby_take_effect(
    pair: tuple[ServerProcess, ServerProcess], topic: str
) -> None:
    leader, standby = pair
    with Client(standby.url) as via_standby, Client(leader.url) as direct:
        via_standby.create_topic(topic)
        via_standby.create_topic(topic + "-out")
        via_standby.publish(topic, [Record(b"v%d" % i, b"k%d" % (i % 3)) for i in range(12)])
        member = via_standby.consume(topic, group="g", follow=False, partitions=2, batch_size=4)
        first = member.poll()
        assert len(first) == 4
        member.commit()
        seen = direct.describe_group(topic, "g")
        assert list(seen.members) == [member.member_id]
        assert seen.lag == 8
        # In a transaction (begun, published and committed through the standby): the
        # positions count once it commits, and the output is there.
        second = member.poll()
        with via_standby.transaction() as tx:
            tx.publish(topic + "-out", [m.payload for m in second])
            member.commit(transaction=tx)
        assert direct.describe_group(topic, "g").lag == 8 - len(second)
        out = direct.poll(topic + "-out", transaction=direct.snapshot())
        assert [m.payload for m in out] == [m.payload for m in second]
        # A reset through the standby, once the member has left.
        member.close()
        via_standby.reset_group(topic, "g", "earliest")
        assert direct.describe_group(topic, "g").lag == 12


def test_queue_acks_sent_to_the_standby_take_effect(
    pair: tuple[ServerProcess, ServerProcess], topic: str
) -> None:
    leader, standby = pair
    with Client(standby.url) as via_standby, Client(leader.url) as direct:
        via_standby.create_topic(topic)
        via_standby.create_topic(topic + "-out")
        via_standby.publish(topic, [b"m%d" % i for i in range(6)])
        q = via_standby.queue(topic, "work")
        got = q.pop(2)
        q.ack(got)
        stats = direct.describe_queue(topic, "work")
        assert (stats.acked, stats.pending) == (2, 0)
        # Acked in a transaction through the standby: acked once it commits.
        held = q.pop(2)
        with via_standby.transaction() as tx:
            tx.publish(topic + "-out", [m.payload for m in held])
            q.ack(held, transaction=tx)
        assert direct.describe_queue(topic, "work").acked == 4
        nacked = q.pop(2)
        q.nack(nacked)
        rest = direct.queue(topic, "work").pop(10)
        assert [m.payload for m in rest] == [m.payload for m in nacked]
        assert [m.delivery_count for m in rest] == [2, 2]


def _bad_requests(topic: str, consumer: str, member: str) -> list[tuple[str, str, Any]]:
    """(method, path under the topic, JSON body or raw bytes) of requests every server
    must refuse with the same answer, whatever its store."""
    never = base64.b64encode(MessageId(1, 2, 3, 4).to_bytes()).decode()
    return [
        ("GET", "/groups/nope", None),
        ("DELETE", "/groups/nope", None),
        ("POST", "/groups/g/join", {"partitions": 0}),
        ("POST", "/groups/g/join", {"partitions": "two"}),
        ("POST", "/groups/g/join", {"sessionTimeoutMs": 5}),
        ("POST", "/groups/g/join", {"start": "sideways"}),
        ("POST", "/groups/g/join", b"not json"),
        ("POST", "/groups/g/join", [1, 2]),
        ("POST", "/groups/g/heartbeat", {"memberId": "nobody1"}),
        ("POST", "/groups/g/heartbeat", {}),
        ("POST", "/groups/g/poll", {"memberId": "bad id!"}),
        ("POST", "/groups/g/commit", {"memberId": "x", "positions": []}),
        ("POST", "/groups/g/commit", {"memberId": member, "positions": [{"partition": 0}]}),
        ("POST", "/groups/g/commit", {"memberId": member, "positions": [{"partition": 99, "id": never}]}),  # noqa: E501
        ("POST", "/groups/g/commit", {"memberId": member, "positions": [], "transactionWritePointer": -1}),  # noqa: E501
        ("POST", "/groups/g/rollback", {}),
        ("POST", "/groups/g/reset", {"to": "sideways"}),
        ("POST", "/groups/g/reset", {"to": "earliest"}),  # a member is present
        ("POST", "/groups/nope/reset", {"to": "earliest"}),
        ("GET", "/queues/nope", None),
        ("POST", "/queues/nope/purge", None),
        ("POST", "/queues/work/pop", {"consumerId": "x1", "maxMessages": 0}),
        ("POST", "/queues/work/pop", {"consumerId": "x1", "ackTimeoutMs": -5}),
        ("POST", "/queues/work/pop", {"consumerId": "x1", "maxDeliveries": 0}),
        ("POST", "/queues/work/pop", {"consumerId": "x1", "deadLetterTopic": topic}),
        ("POST", "/queues/work/pop", {"consumerId": "x1", "start": "middle"}),
        ("POST", "/queues/work/pop", {"consumerId": "bad id!"}),
        ("POST", "/queues/work/pop", {"consumerId": consumer, "ackIds": [never]}),
        ("POST", "/queues/work/ack", {"consumerId": consumer, "ids": []}),
        ("POST", "/queues/work/ack", {"consumerId": consumer, "ids": ["bm90IGFuIGlk"]}),
        ("POST", "/queues/work/ack", {"consumerId": consumer, "ids": [never]}),
        ("POST", "/queues/work/ack", {"consumerId": consumer, "ids": [never], "transactionWritePointer": 1}),  # noqa: E501
        ("POST", "/queues/work/nack", {"consumerId": consumer, "ids": [never], "transactionWritePointer": 1}),  # noqa: E501
        ("POST", "/queues/work/nack", {"consumerId": consumer, "ids": [42]}),
        ("POST", "/queues/work/rollback", {"transactionWritePointer": "x"}),
        ("POST", "/queues/work/release", {}),
    ]  # fmt: skip


def _answers(url: str, topic: str) -> tuple[list[tuple[int, object]], dict[str, object]]:
    """Each bad request's status and JSON body on the server at ``url``, and what the
    group and queue look like afterwards (the parts that do not depend on time)."""
    with Client(url) as client:
        client.create_topic(topic)
        client.publish(topic, [b"a", b"b", b"c"])
        member = client.consume(topic, group="g", follow=False, partitions=2)
        member.heartbeat()
        q = client.queue(topic, "work")
        popped = q.pop(2)
        answers: list[tuple[int, object]] = []
        with httpx.Client(timeout=30) as http:
            base = f"{url}/v1/namespaces/default/topics/{topic}"
            for method, path, body in _bad_requests(topic, q.consumer_id, member.member_id):
                raw = body if isinstance(body, bytes) else None
                json = None if raw is not None or body is None else body
                answer = http.request(method, base + path, json=json, content=raw)
                assert 400 <= answer.status_code < 500, (method, path, body, answer.text)
                # The names of this run's member and consumer differ between servers.
                text = answer.text.replace(member.member_id, "M").replace(q.consumer_id, "C")
                answers.append((answer.status_code, text))
        group = client.describe_group(topic, "g")
        queue = client.describe_queue(topic, "work")
        after = {
            "members": len(group.members),
            "generation": group.generation,
            "positions": [p.position for p in group.partitions],
            "queue": (queue.pending, queue.acked, queue.nacked, list(queue.consumers.values())),
        }
        q.ack(popped)  # still leased to it: nothing above changed that
        member.close()
    return answers, after


def test_bad_input_is_refused_alike_on_both_stores_and_through_the_standby(
    server: ServerProcess, pair: tuple[ServerProcess, ServerProcess], topic: str
) -> None:
    leader, standby = pair
    on_lmdb = _answers(server.url, topic)
    on_leader = _answers(leader.url, topic)
    through_standby = _answers(standby.url, topic + "-s")
    assert on_leader == on_lmdb
    # The same requests on a topic of another name: the same answers, that name aside.
    answers, after = through_standby
    renamed = [(status, text.replace(topic + "-s", topic)) for status, text in answers]
    assert (renamed, after) == on_lmdb


def test_a_pop_with_a_bad_start_is_refused_when_its_queue_is_in_memory(
    store_server: ServerProcess, topic: str
) -> None:
    # A pop answered from the queue's memory never looked at its start: refused where
    # the queue was not loaded (after a restart, a takeover), taken where it was.
    with Client(store_server.url) as client:
        client.create_topic(topic)
        client.publish(topic, [b"a", b"b"])
        q = client.queue(topic, "work")
        q.ack(q.pop(1))  # the queue exists and is in the server's memory
        url = f"{store_server.url}/v1/namespaces/default/topics/{topic}/queues/work/pop"
        answer = httpx.post(url, json={"consumerId": "x1", "start": "middle"})
        assert answer.status_code == 400, answer.text
        assert answer.json()["type"] == "BadRequest" and "middle" in answer.json()["error"]
        stats = client.describe_queue(topic, "work")
        assert (stats.pending, stats.acked) == (0, 1)  # nothing was leased
        assert [m.payload for m in q.pop(5)] == [b"b"]
