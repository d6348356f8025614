"""Transactions, read-committed visibility and the last stable position through the
real server and client."""

from __future__ import annotations

import httpx
import pytest

from tests.e2e.serverproc import ServerProcess
from tidings import Client
from tidings.client import Consumer

pytestmark = pytest.mark.e2e


def test_an_aborted_transaction_leaves_the_last_stable_position(
    server: ServerProcess, topic: str
) -> None:
    # An aborted transaction counted as open until some later transaction committed:
    # the topic's stats, end and read-committed polls named its first (rolled back)
    # entry as the last stable position, and a reader starting at "latest" started
    # there, returning messages published before it started.
    with Client(server.url) as client:
        client.create_topic(topic)
        tx = client.begin()
        client.rollback(topic, client.publish(topic, b"aborted", write_pointer=tx.write_pointer))
        client.abort(tx)
        client.publish(topic, b"before")
        assert client.stats(topic).last_stable_id is None
        assert client.end(topic).last_stable_id is None
        answer = httpx.post(
            f"{server.url}/v1/namespaces/default/topics/{topic}/poll",
            params={"isolation": "read_committed"},
            json={},
        )
        assert "Tidings-Last-Stable-Id" not in answer.headers
        latest = client.consume(topic, "latest", wait=0.0)
        assert isinstance(latest, Consumer)
        assert latest.poll() == []
        client.publish(topic, b"after")
        assert [m.payload for m in latest.poll()] == [b"after"]
        latest.close()
