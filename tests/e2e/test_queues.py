"""Queues through the real server and the real clients (issue: queues)."""

from __future__ import annotations

import base64
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

from tests.e2e.serverproc import ServerProcess
from tidings import AsyncClient, Client
from tidings.codec.media import AVRO, AVRO_EXT, JSON, Media
from tidings.errors import (
    AckConflict,
    InvalidName,
    NotDelivered,
    QueueNotFound,
    TransactionNotInProgress,
)
from tidings.structs import MessageId, Record

pytestmark = pytest.mark.e2e


def fill(client: Client, topic: str, n: int) -> list[bytes]:
    client.create_topic(topic)
    payloads = [f"job-{i}".encode() for i in range(n)]
    if payloads:
        client.publish(topic, payloads)
    return payloads


def test_pop_leases_oldest_first_and_ack_is_for_good(
    store_server: ServerProcess, topic: str
) -> None:
    with Client(store_server.url) as client:
        payloads = fill(client, topic, 10)
        q = client.queue(topic, "work")
        first = q.pop(max_messages=4)
        assert [m.payload for m in first] == payloads[:4]
        assert [m.delivery_count for m in first] == [1] * 4
        other = client.queue(topic, "work")
        second = other.pop(max_messages=100)
        assert [m.payload for m in second] == payloads[4:]  # leased ones are invisible
        assert other.pop(max_messages=5) == []
        q.ack(first)
        other.ack(second)
        assert client.queue(topic, "work").pop(max_messages=10) == []
        stats = client.describe_queue(topic, "work")
        assert (stats.pending, stats.waiting, stats.ack_state) == (0, 0, 0)
        assert stats.acked == 10 and stats.popped == 10
        assert stats.cursor == second[-1].id == stats.read


@pytest.mark.parametrize("media", [AVRO_EXT, AVRO, JSON], ids=lambda m: m.name)
def test_pop_answers_in_every_medium_first_and_again(
    server: ServerProcess, topic: str, media: Media
) -> None:
    records = [
        Record(b"plain"),
        Record(b"keyed", b"k1"),
        Record(b"with headers", b"k2", {"h": b"1", "g": b""}),
        Record(b"x" * 300, None, {"big": b"y" * 200}),
    ]
    with Client(server.url) as publisher:
        publisher.create_topic(topic)
        publisher.publish(topic, records)
        with publisher.transaction() as tx:
            tx.publish(topic, [Record(b"in a transaction", b"k3")])
    extended = media is not AVRO  # the CDAP schema carries payloads only

    def expected(r: Record) -> tuple[bytes, bytes | None, dict[str, bytes]]:
        return (r.payload, r.key, dict(r.headers)) if extended else (r.payload, None, {})

    wanted = [expected(r) for r in [*records, Record(b"in a transaction", b"k3")]]
    with Client(server.url, media=media) as client:
        q = client.queue(topic, "work")
        first = q.pop(10)
        assert [(m.payload, m.key, dict(m.headers)) for m in first] == wanted
        assert [m.delivery_count for m in first] == [1] * 5
        q.nack(first[1:3])
        again = q.pop(10)
        assert [m.id for m in again] == [m.id for m in first[1:3]]
        assert [(m.payload, m.key, dict(m.headers)) for m in again] == wanted[1:3]
        assert [m.delivery_count for m in again] == [2, 2]
        q.ack(first[:1] + again + first[3:])
        assert client.describe_queue(topic, "work").acked == 5


def test_every_group_gets_every_message(server: ServerProcess, topic: str) -> None:
    with Client(server.url) as client:
        payloads = fill(client, topic, 5)
        a = client.queue(topic, "a").pop(10)
        b = client.queue(topic, "b").pop(10)
        assert [m.payload for m in a] == [m.payload for m in b] == payloads
        assert client.queues(topic) == [(topic, "a"), (topic, "b")]
        assert (topic, "a") in client.queues()


def test_nack_returns_messages_ahead_of_newer_ones(store_server: ServerProcess, topic: str) -> None:
    with Client(store_server.url) as client:
        payloads = fill(client, topic, 6)
        q = client.queue(topic, "work")
        got = q.pop(3)
        q.nack(got[1:])
        again = client.queue(topic, "work").pop(4)
        assert [m.payload for m in again] == [payloads[1], payloads[2], payloads[3], payloads[4]]
        assert [m.delivery_count for m in again] == [2, 2, 1, 1]
        assert client.describe_queue(topic, "work").nacked == 2


def test_lease_expiry_redelivers_to_others(store_server: ServerProcess, topic: str) -> None:
    with Client(store_server.url) as client:
        fill(client, topic, 3)
        slow = client.queue(topic, "work", ack_timeout=0.3)
        got = slow.pop(3)
        fast = client.queue(topic, "work")
        assert fast.pop(3) == []
        began = time.monotonic()
        again = fast.pop(3, wait=5.0)  # the long-poll wakes when the lease runs out
        waited = time.monotonic() - began
        assert [m.id for m in again] == [m.id for m in got]
        assert [m.delivery_count for m in again] == [2, 2, 2]
        assert waited < 2.0
        with pytest.raises(AckConflict, match="passed to another worker"):
            slow.ack(got)
        fast.ack(again)
        assert client.describe_queue(topic, "work").expired == 3


def test_ack_conflict_when_another_worker_acked(server: ServerProcess, topic: str) -> None:
    with Client(server.url) as client:
        fill(client, topic, 1)
        slow = client.queue(topic, "work", ack_timeout=0.2)
        got = slow.pop(1)
        time.sleep(0.3)
        fast = client.queue(topic, "work")
        again = fast.pop(1)
        fast.ack(again)
        with pytest.raises(AckConflict, match="another worker acked it"):
            slow.ack(got)
        fast.ack(again)  # a retried ack is answered as done


def test_close_gives_leases_back_at_once(server: ServerProcess, topic: str) -> None:
    with Client(server.url) as client:
        fill(client, topic, 4)
        with client.queue(topic, "work") as q:
            held = q.pop(4)
        assert len(held) == 4
        assert [m.id for m in client.queue(topic, "work").pop(4)] == [m.id for m in held]


def test_ack_in_a_transaction_counts_only_if_it_commits(
    store_server: ServerProcess, topic: str
) -> None:
    with Client(store_server.url) as client:
        fill(client, topic, 4)
        client.create_topic(topic + "-out")
        q = client.queue(topic, "work")
        batch = q.pop(2)
        with pytest.raises(RuntimeError), client.transaction() as tx:
            tx.publish(topic + "-out", [m.payload.upper() for m in batch])
            q.ack(batch, transaction=tx)
            raise RuntimeError("the job failed")
        again = q.pop(2)  # the abort gave them back, ahead of the others
        assert [m.id for m in again] == [m.id for m in batch]
        assert [m.delivery_count for m in again] == [2, 2]
        with client.transaction() as tx:
            tx.publish(topic + "-out", [m.payload.upper() for m in again])
            q.ack(again, transaction=tx)
        rest = q.pop(10)
        assert [m.payload for m in rest] == [b"job-2", b"job-3"]
        q.ack(rest)
        assert [m.payload for m in client.poll(topic + "-out")] == [b"JOB-0", b"JOB-1"]
        stats = client.describe_queue(topic, "work")
        assert (stats.pending, stats.waiting, stats.acked) == (0, 0, 4)


def test_transactional_ack_of_a_lost_lease_fails_the_transaction(
    server: ServerProcess, topic: str
) -> None:
    with Client(server.url) as client:
        fill(client, topic, 1)
        client.create_topic(topic + "-out")
        slow = client.queue(topic, "work", ack_timeout=0.2)
        got = slow.pop(1)
        time.sleep(0.3)
        fast = client.queue(topic, "work")
        assert fast.pop(1)
        with pytest.raises((AckConflict, TransactionNotInProgress)), client.transaction() as tx:
            tx.publish(topic + "-out", [b"slow output"])
            slow.ack(got, transaction=tx)
        assert client.poll(topic + "-out") == []  # the slow worker's output never joins


def test_max_deliveries_moves_to_the_dead_letter_topic(
    store_server: ServerProcess, topic: str
) -> None:
    with Client(store_server.url) as client:
        client.create_topic(topic)
        client.publish(topic, [Record(b"poison", b"k", {"h": b"1"}), Record(b"fine", b"k2")])
        q = client.queue(topic, "work", max_deliveries=2)
        for attempt in (1, 2):
            got = q.pop(1)
            assert got[0].payload == b"poison" and got[0].delivery_count == attempt
            q.nack(got)
        nxt = q.pop(1)
        assert [m.payload for m in nxt] == [b"fine"]
        dead = client.poll(topic + "-dlq")
        assert [m.payload for m in dead] == [b"poison"]
        assert dead[0].key == b"k" and dead[0].headers["h"] == b"1"
        assert dead[0].headers["tidings-delivery-count"] == b"2"
        assert dead[0].headers["tidings-dead-letter-topic"] == topic.encode()
        stats = client.describe_queue(topic, "work")
        assert stats.dead_lettered == 1 and stats.max_deliveries == 2
        assert stats.dead_letter_topic == topic + "-dlq"


def test_a_pop_carries_the_acks_of_the_batch_before(server: ServerProcess, topic: str) -> None:
    with Client(server.url) as client:
        payloads = fill(client, topic, 10)
        q = client.queue(topic, "work")
        first = q.pop(4)
        second = q.pop(4, ack=first)
        assert [m.payload for m in second] == payloads[4:8]
        stats = client.describe_queue(topic, "work")
        assert (stats.acked, stats.pending, stats.consumers) == (4, 4, {q.consumer_id: 4})
        q.nack(second)  # the acked ones do not come back; the nacked ones do, first
        other = client.queue(topic, "work")
        again = other.pop(10)
        assert [m.payload for m in again] == payloads[4:]
        # A long-poll that finds nothing acks too, and answers once its wait is over.
        began = time.monotonic()
        assert other.pop(5, wait=0.3, ack=again) == []
        assert time.monotonic() - began >= 0.25
        stats = client.describe_queue(topic, "work")
        assert (stats.acked, stats.pending, stats.waiting) == (10, 0, 0)


def test_a_pop_whose_acks_fail_acks_and_pops_nothing(server: ServerProcess, topic: str) -> None:
    with Client(server.url) as client:
        fill(client, topic, 6)
        q = client.queue(topic, "work")
        mine = q.pop(2)
        theirs = client.queue(topic, "work").pop(2)
        with pytest.raises(NotDelivered, match=theirs[0].id.hex):
            q.pop(2, ack=[mine[0], theirs[0]])
        with pytest.raises(TypeError):
            q.pop(2, ack=[b"not an id"])  # type: ignore[list-item]
        base = f"{server.url}/v1/namespaces/default/topics/{topic}/queues/work/pop"
        good = base64.b64encode(mine[0].id.to_bytes()).decode()
        for body, status, needle in (
            ({"consumerId": q.consumer_id, "ackIds": [good, "bm90IGFuIGlk"]}, 400, "bm90IGFuIGlk"),
            ({"consumerId": q.consumer_id, "ackIds": good}, 400, "ackIds"),
            ({"consumerId": q.consumer_id, "ackIds": [good], "maxMessages": 0}, 400, "maxMessages"),
            ({"consumerId": q.consumer_id, "ackIds": [good], "maxDeliveries": 0}, 400, "maxDel"),
            ({"consumerId": "someone", "ackIds": [good]}, 409, mine[0].id.hex),
        ):
            answer = httpx.post(base, json=body)
            assert answer.status_code == status, (body, answer.text)
            assert needle in answer.json()["error"]
        stats = client.describe_queue(topic, "work")
        assert (stats.acked, stats.pending, stats.waiting) == (0, 4, 2)
        rest = q.pop(5, ack=mine)  # unchanged by all of the above
        assert len(rest) == 2 and client.describe_queue(topic, "work").acked == 2


def test_workers_in_threads_get_each_message_once(server: ServerProcess, topic: str) -> None:
    with Client(server.url) as client:
        payloads = fill(client, topic, 600)
    seen: list[bytes] = []
    lock = threading.Lock()

    def work() -> None:
        with Client(server.url) as mine:
            q = mine.queue(topic, "work")
            while True:
                got = q.pop(25)
                if not got:
                    return
                with lock:
                    seen.extend(m.payload for m in got)
                q.ack(got)

    threads = [threading.Thread(target=work) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert Counter(seen) == Counter(payloads)


async def test_async_queue(server: ServerProcess, topic: str) -> None:
    with Client(server.url) as client:
        fill(client, topic, 3)
    async with AsyncClient(server.url) as client:
        async with client.queue(topic, "work") as q:
            got = await q.pop(3)
            assert [m.delivery_count for m in got] == [1, 1, 1]
            await q.nack(got[2:])
            await q.ack(got[:2])
            assert [m.id for m in await q.pop(3)] == [got[2].id]
        assert (await client.describe_queue(topic, "work")).acked == 2


def test_bad_input_is_refused_and_changes_nothing(store_server: ServerProcess, topic: str) -> None:
    with Client(store_server.url) as client:
        fill(client, topic, 3)
        q = client.queue(topic, "work")
        got = q.pop(2)
        other_group = client.queue(topic, "other").pop(3)
        never = MessageId(1, 2, 3, 4)
        with pytest.raises(NotDelivered, match=never.hex):
            q.ack([got[0].id, never])
        with pytest.raises(NotDelivered):
            q.ack([other_group[2]])  # popped by another group, never by this one
        with pytest.raises(QueueNotFound):
            client.describe_queue(topic, "nope")
        with pytest.raises(InvalidName):
            client.queue(topic, "bad name").pop()
        with pytest.raises(ValueError):
            client.queue(topic, "work", ack_timeout=0)
        with pytest.raises(ValueError):
            q.pop(max_messages=0)
        base = f"{store_server.url}/v1/namespaces/default/topics/{topic}/queues/work"
        for path, body, needle in (
            ("/pop", {"consumerId": "x1", "maxMessages": 0}, "maxMessages"),
            ("/pop", {"consumerId": "x1", "ackTimeoutMs": 0}, "ackTimeoutMs"),
            ("/pop", {"consumerId": "x1", "ackTimeoutMs": -5}, "ackTimeoutMs"),
            ("/pop", {"maxMessages": 1}, "consumerId"),
            ("/ack", {"consumerId": q.consumer_id, "ids": ["bm90IGFuIGlk"]}, "bm90IGFuIGlk"),
            ("/ack", {"consumerId": q.consumer_id, "ids": []}, "ids"),
            ("/nack", {"consumerId": q.consumer_id, "ids": [42]}, "42"),
        ):
            answer = httpx.post(base + path, json=body)
            assert answer.status_code == 400, (path, body, answer.text)
            assert needle in answer.json()["error"]
        stats = client.describe_queue(topic, "work")
        assert (stats.pending, stats.acked, stats.consumers) == (2, 0, {q.consumer_id: 2})
        q.ack(got)  # still leased to it: nothing above changed that


def test_purge_and_delete(store_server: ServerProcess, topic: str) -> None:
    with Client(store_server.url) as client:
        fill(client, topic, 5)
        q = client.queue(topic, "work")
        q.pop(2)
        assert client.purge_queue(topic, "work") == 2
        assert client.queue(topic, "work").pop(10) == []
        client.publish(topic, [b"later"])
        assert [m.payload for m in client.queue(topic, "work").pop(10)] == [b"later"]
        client.delete_queue(topic, "work")
        with pytest.raises(QueueNotFound):
            client.describe_queue(topic, "work")


def test_queues_in_metrics(server: ServerProcess, topic: str) -> None:
    with Client(server.url) as client:
        fill(client, topic, 2)
        q = client.queue(topic, "metered")
        q.ack(q.pop(1))
        text = httpx.get(f"{server.url}/metrics").text
        label = f'namespace="default",queue="metered",topic="{topic}"'
        assert f"tidings_queue_acked_total{{{label}}} 1.0" in text
        assert f"tidings_queue_waiting{{{label}}} 1.0" in text


@pytest.mark.parametrize("defer_begin", [True, False])
def test_transactional_worker_in_one_request_or_step_by_step(
    server: ServerProcess, topic: str, defer_begin: bool
) -> None:
    with Client(server.url) as client:
        fill(client, topic, 6)
        client.create_topic(topic + "-out")
        q = client.queue(topic, "work")
        while batch := q.pop(2):
            with client.transaction(defer_begin=defer_begin) as tx:
                tx.publish(topic + "-out", [m.payload.upper() for m in batch])
                q.ack(batch, transaction=tx)
        assert [m.payload for m in client.poll(topic + "-out")] == [
            f"JOB-{i}".encode() for i in range(6)
        ]
        stats = client.describe_queue(topic, "work")
        assert (stats.acked, stats.pending, stats.waiting) == (6, 0, 0)


def _store_commits(url: str) -> int:
    text = httpx.get(url + "/metrics", timeout=5).text
    lines = [ln for ln in text.splitlines() if ln.startswith("tidings_store_commits")]
    assert lines, "the server reports its store commits"
    return int(float(lines[0].split()[-1]))


def test_a_transactional_workers_round_is_one_store_write(tmp_path: Path) -> None:
    """Pop, then one request that publishes, acks and commits: the acks' write lands
    with the messages and the commit (the store applies writes in order and groups
    those queued together), and the resolved acks are written with a later write
    instead of one of their own. Three store writes per round before."""
    own = ServerProcess(tmp_path / "data").start()
    try:
        with Client(own.url) as client:
            fill(client, "in", 50)
            client.create_topic("out")
            q = client.queue("in", "work")
            q.ack(q.pop(1))  # the queue exists and is in the server's memory
            rounds = 0
            before = _store_commits(own.url)
            while batch := q.pop(7):
                with client.transaction() as tx:
                    tx.publish("out", [m.payload.upper() for m in batch])
                    q.ack(batch, transaction=tx)
                rounds += 1
            written = _store_commits(own.url) - before
            # A write may now and then go alone (its group closed before the next
            # one was queued): a little slack, far from three per round.
            assert rounds == 7 and rounds <= written <= rounds + 2, written
            assert len(client.poll("out", limit=100)) == 49
            stats = client.describe_queue("in", "work")
            assert (stats.acked, stats.pending, stats.waiting) == (50, 0, 0)
    finally:
        own.stop()


def test_one_request_transaction_with_a_conflicting_ack_commits_nothing(
    server: ServerProcess, topic: str
) -> None:
    with Client(server.url) as client:
        fill(client, topic, 2)
        client.create_topic(topic + "-out")
        mine = client.queue(topic, "work")
        theirs = client.queue(topic, "work")
        a, b = mine.pop(1), theirs.pop(1)
        url = f"{server.url}/v1/namespaces/default/transactions/publish"
        body = {
            "topics": [{"topic": topic + "-out", "messages": ["eA=="]}],
            "acks": [
                {"topic": topic, "queue": "work", "consumerId": mine.consumer_id,
                 "ids": [base64.b64encode(m.id.to_bytes()).decode() for m in a + b]},
            ],
        }  # fmt: skip
        answer = httpx.post(url, json=body)
        assert answer.status_code == 409 and answer.json()["type"] == "NotDelivered"
        assert client.poll(topic + "-out") == []
        mine.ack(a)  # nothing of the refused request stuck: both still leased as before
        theirs.ack(b)
        body["acks"] = [{"topic": topic, "queue": "nope", "consumerId": "x", "ids": []}]
        assert httpx.post(url, json=body).status_code == 400
