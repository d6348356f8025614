"""A transaction in one request: ``POST /v1/namespaces/{ns}/transactions/publish`` and the
client's deferred-begin transactions that use it (all or nothing, invariant 4)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator

import httpx
import pytest

from tests.e2e.serverproc import ServerProcess
from tidings import AsyncClient, Client
from tidings.errors import BadRequest, ServiceUnavailable, TopicNotFound
from tidings.structs import Record

pytestmark = pytest.mark.e2e

NS = "one-request"


@pytest.fixture
def client(server: ServerProcess) -> Iterator[Client]:
    with Client(server.url, NS) as c:
        yield c


@pytest.fixture
def topics(client: Client, topic: str) -> tuple[str, str]:
    client.create_topic(topic + "-a")
    client.create_topic(topic + "-b")
    return topic + "-a", topic + "-b"


def committed(client: Client, topic: str) -> list[bytes]:
    return [m.payload for m in client.consume(topic, follow=False)]


def test_publish_transaction_is_all_of_it(client: Client, topics: tuple[str, str]) -> None:
    a, b = topics
    before = set(client.transactions().in_progress)
    tx = client.publish_transaction(
        {a: [b"a1", b"a2"], b: [Record(b"b1", key=b"k", headers={"h": b"v"})]}
    )
    assert committed(client, a) == [b"a1", b"a2"]
    [message] = client.consume(b, follow=False)
    assert (message.payload, message.key, dict(message.headers)) == (b"b1", b"k", {"h": b"v"})
    state = client.transactions()
    assert tx.write_pointer <= state.read_pointer
    assert set(state.in_progress) <= before


def test_a_failing_topic_leaves_nothing_visible(client: Client, topics: tuple[str, str]) -> None:
    a, _ = topics
    before = set(client.transactions().in_progress)
    with pytest.raises(TopicNotFound):
        client.publish_transaction({a: [b"never"], "missing-" + a: [b"x"]})
    assert committed(client, a) == []
    assert set(client.transactions().in_progress) <= before
    # The batches are one store write: the failing one took the others with it, so
    # not even a rolled-back entry was written.
    assert client.poll(a) == []


def test_bad_bodies_are_400(server: ServerProcess, topics: tuple[str, str]) -> None:
    a, b = topics
    url = f"{server.url}/v1/namespaces/{NS}/transactions/publish"
    bodies: list[object] = [
        {},
        {"topics": "a"},
        {"topics": [{"messages": ["eA=="]}]},
        {"topics": [{"topic": "bad name", "messages": ["eA=="]}]},
        {"topics": [{"topic": a, "messages": ["eA=="]}, {"topic": a, "messages": ["eA=="]}]},
        {"topics": [{"topic": a, "messages": []}]},
        {"topics": [{"topic": a, "messages": ["not base64!"]}]},
        {"topics": [{"topic": a, "messages": ["eA=="], "transactionWritePointer": 5}]},
        {"topics": [{"topic": b, "messages": ["eA=="]}], "timeout": "soon"},
    ]
    for body in bodies:
        r = httpx.post(url, json=body)
        assert r.status_code == 400, body
        assert r.json()["type"] in ("BadRequest", "EmptyPublish", "InvalidName"), body
    ok = httpx.post(url, json={"topics": [{"topic": b, "messages": ["eA=="]}]})
    assert ok.status_code == 200 and ok.json()["writePointer"] > 0


def test_needs_both_services(start_server: Callable[..., ServerProcess], topic: str) -> None:
    messaging = start_server("--role", "messaging")
    r = httpx.post(
        f"{messaging.url}/v1/namespaces/{NS}/transactions/publish",
        json={"topics": [{"topic": topic, "messages": ["eA=="]}]},
    )
    assert (r.status_code, r.json()["type"]) == (503, "RoleUnavailable")
    with Client(messaging.url, NS) as c, pytest.raises(ServiceUnavailable):
        c.publish_transaction({topic: [b"x"]})


def test_context_commits_in_one_request(client: Client, topics: tuple[str, str]) -> None:
    a, b = topics
    with client.transaction() as tx:
        tx.publish(a, [b"a1", b"a2"])
        tx.publish(b, b"b1")
        assert client.poll(a) == []  # nothing sent yet
    assert tx.state == "committed" and tx.write_pointer > 0
    assert committed(client, a) == [b"a1", b"a2"] and committed(client, b) == [b"b1"]
    last = client.transactions().last_write_pointer
    with pytest.raises(ZeroDivisionError), client.transaction() as tx:
        tx.publish(a, b"never")
        _ = 1 / 0
    assert client.transactions().last_write_pointer == last  # no begin was even sent
    assert committed(client, a) == [b"a1", b"a2"]
    with pytest.raises(TopicNotFound), client.transaction() as tx:
        tx.publish(a, b"never")
        tx.publish("missing-" + a, b"x")
    assert tx.state == "aborted" and committed(client, a) == [b"a1", b"a2"]


def test_context_past_the_threshold_streams(client: Client, topics: tuple[str, str]) -> None:
    a, b = topics
    with client.transaction(payload_threshold=10) as tx:
        tx.publish(a, b"small")
        tx.publish(b, b"x" * 20)  # past the threshold: begins, stores, publishes the pointer
    assert tx.state == "committed"
    assert committed(client, a) == [b"small"] and committed(client, b) == [b"x" * 20]


def test_async_context_commits_in_one_request(
    server: ServerProcess, topics: tuple[str, str]
) -> None:
    a, b = topics

    async def run() -> int:
        async with AsyncClient(server.url, NS) as client:
            async with client.transaction() as tx:
                await tx.publish(a, b"a1")
                await tx.publish(b, b"b1")
                with pytest.raises(RuntimeError):
                    _ = tx.transaction  # begins at commit
            with pytest.raises(BadRequest):
                await client.publish_transaction({a: []})
            return tx.write_pointer

    assert asyncio.run(run()) > 0
    with Client(server.url, NS) as client:
        assert committed(client, a) == [b"a1"] and committed(client, b) == [b"b1"]
