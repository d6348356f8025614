"""Retention while consumer groups and queues are behind or mid-flight, black box.

A queue's depth leaves out returned messages retention deleted, an ack of a leased
message retention deleted is answered as done while its lease holds and with a 409
that says why once the queue forgot it, and a group whose committed positions lie
below the oldest kept message resumes there, its lag counting only kept messages.
"""

from __future__ import annotations

import re
import time

import httpx
import pytest

from tests.e2e.serverproc import ServerProcess
from tidings import Client, MessageId, Record
from tidings.client import GroupConsumer
from tidings.errors import NotDelivered

pytestmark = pytest.mark.e2e

NS = "default"
PARTITIONS = 4
KEYS = [b"k%d" % i for i in range(6)]


def metric(text: str, name: str, topic: str, **labels: str) -> float | None:
    """The value of ``name``'s series of ``topic`` (and ``labels``) in ``text``."""
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        wanted = {"namespace": NS, "topic": topic, **labels}
        found = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}")[0]))
        if all(found.get(k) == v for k, v in wanted.items()):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_queue_depth_leaves_out_returned_messages_past_retention(
    server: ServerProcess, topic: str
) -> None:
    # The leases ran out after retention deleted their messages: no pop hands them out
    # again, so the queue's depth must not count them (it did, until the next pop).
    with Client(server.url) as client, httpx.Client(base_url=server.url) as http:
        client.create_topic(topic, ttl=1)
        client.publish(topic, [b"old-0", b"old-1", b"old-2"])
        slow = client.queue(topic, "work", ack_timeout=0.2)
        assert len(slow.pop(3)) == 3
        time.sleep(1.3)
        client.publish(topic, [b"new-0", b"new-1"])
        stats = client.describe_queue(topic, "work")
        assert (stats.pending, stats.waiting, stats.waiting_exact) == (0, 2, True)
        text = http.get("/metrics").text
        assert metric(text, "tidings_queue_waiting", topic, queue="work") == 2
        again = client.queue(topic, "work").pop(10)
        assert [m.payload for m in again] == [b"new-0", b"new-1"]
        stats = client.describe_queue(topic, "work")
        assert (stats.pending, stats.waiting, stats.popped, stats.redelivered) == (2, 0, 5, 0)


def test_an_ack_of_a_message_retention_deleted(server: ServerProcess, topic: str) -> None:
    with Client(server.url) as client:
        client.create_topic(topic, ttl=3600)
        client.publish(topic, [Record(b"held", ttl=1), Record(b"lapsed", ttl=1)])
        holder = client.queue(topic, "work", ack_timeout=60)
        held = holder.pop(1)
        lapsing = client.queue(topic, "work", ack_timeout=0.2)
        lapsed = lapsing.pop(1)
        assert [m.payload for m in held + lapsed] == [b"held", b"lapsed"]
        time.sleep(1.3)
        # Deleted while its lease holds: the worker still holds it, and its ack is
        # answered as done.
        holder.ack(held)
        # Deleted after its lease ran out: the next pop forgets it (never delivered
        # again), and then its ack is refused with a reason that names retention.
        assert client.queue(topic, "work").pop(5) == []
        with pytest.raises(NotDelivered, match="past its retention") as refused:
            lapsing.ack(lapsed)
        assert refused.value.status == 409
        assert lapsed[0].id.hex in str(refused.value)
        assert lapsing.nack(lapsed) == [lapsed[0].id]
        assert client.queue(topic, "work").pop(5) == []
        stats = client.describe_queue(topic, "work")
        assert (stats.pending, stats.waiting, stats.acked, stats.popped) == (0, 0, 1, 2)


def test_a_group_behind_retention_resumes_at_the_oldest_kept_message(
    server: ServerProcess, topic: str
) -> None:
    # Kafka's auto.offset.reset applies to an offset retention deleted; here there is
    # no such case: a position is a place in the one order, and reading after it
    # starts at the oldest message kept (docs/api.md, "Consumer groups").
    with Client(server.url) as client, httpx.Client(base_url=server.url) as http:
        client.create_topic(topic, ttl=1)
        client.publish(topic, [Record(b"old-%d" % i, key=k) for i, k in enumerate(KEYS)])
        first = client.consume(
            topic, group="g", partitions=PARTITIONS, follow=False, wait=0, batch_size=2
        )
        assert isinstance(first, GroupConsumer)
        assert len(first.poll()) == 2
        first.commit()
        first.close()
        assert client.describe_group(topic, "g").lag == len(KEYS) - 2
        time.sleep(1.3)
        client.publish(topic, [Record(b"new-%d" % i, key=k) for i, k in enumerate(KEYS[:3])])
        info = client.describe_group(topic, "g")
        assert info.lag == 3 and all(p.lag_exact for p in info.partitions)
        assert client.stats(topic).group_lags == {"g": 3}
        assert metric(http.get("/metrics").text, "tidings_group_lag", topic, group="g") == 3
        again = client.consume(topic, group="g", follow=False, wait=0)
        got = [m.payload for m in again]
        again.close()
        assert sorted(got) == [b"new-0", b"new-1", b"new-2"]
        # A reset to a time before every kept message, or to a message retention
        # deleted, counts the kept ones.
        client.reset_group(topic, "g", 0)
        assert client.describe_group(topic, "g").lag == 3
        client.reset_group(topic, "g", MessageId(1, 0, 0, 0))
        assert client.describe_group(topic, "g").lag == 3
