"""``beginning``/``end`` are accepted wherever ``earliest``/``latest`` are: consumer
groups, queues and group resets, through the client and through REST."""

from __future__ import annotations

import httpx
import pytest

from tests.e2e.serverproc import ServerProcess
from tidings import Client

pytestmark = pytest.mark.e2e


def test_groups_and_queues_start_at_beginning_or_end(server: ServerProcess, topic: str) -> None:
    with Client(server.url) as client:
        client.create_topic(topic)
        client.publish(topic, [b"old-1", b"old-2"])
        from_start = client.consume(topic, "beginning", group="g1", follow=False)
        from_end = client.consume(topic, "end", group="g2", follow=False)
        queue_start = client.queue(topic, "q1", start="beginning")
        queue_end = client.queue(topic, "q2", start="end")
        assert [m.payload for m in from_start.poll()] == [b"old-1", b"old-2"]
        assert from_end.poll() == []
        assert [m.payload for m in queue_start.pop(10)] == [b"old-1", b"old-2"]
        assert queue_end.pop(10) == []
        client.publish(topic, [b"new"])
        assert [m.payload for m in from_end.poll()] == [b"new"]
        assert [m.payload for m in queue_end.pop(10)] == [b"new"]
        for handle in (from_start, from_end):
            handle.close()
        for q in (queue_start, queue_end):
            q.close()
        with pytest.raises(ValueError, match="beginning"):
            client.queue(topic, "q3", start="middle")


def test_rest_reset_to_beginning(server: ServerProcess, topic: str) -> None:
    with Client(server.url) as client:
        client.create_topic(topic)
        client.publish(topic, [b"a", b"b"])
        # A group that starts at the end and committed nothing: a reset to the
        # beginning still means from the first message, as Kafka's does.
        member = client.consume(topic, "end", group="g", follow=False)
        assert member.poll() == []
        member.close()
    base = f"{server.url}/v1/namespaces/default/topics/{topic}/groups/g"
    with httpx.Client() as http:
        answer = http.post(base + "/reset", json={"to": "beginning"})
        assert answer.status_code == 200, answer.text
        assert http.post(base + "/reset", json={"to": "middle"}).status_code == 400
    with Client(server.url) as client:
        assert client.describe_group(topic, "g").lag == 2
        again = client.consume(topic, "end", group="g", follow=False)
        assert [m.payload for m in again.poll()] == [b"a", b"b"]
        again.close()
