"""``poll?isolation=read_committed``: the server takes the snapshot, fresh at each fetch.

A read-committed long-poll wakes when a transaction ends (commit, abort, invalidation,
timeout), not only on a publish; it never returns data of an open, aborted or invalid
transaction and never skips committed data behind an open one (invariant 3).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator

import httpx
import pytest

from tests.e2e.serverproc import ServerProcess
from tidings import AsyncClient, Client
from tidings.errors import BadRequest, ServiceUnavailable
from tidings.structs import Message

pytestmark = pytest.mark.e2e

NS = "isolation"
RC = "read_committed"


@pytest.fixture
def client(server: ServerProcess, topic: str) -> Iterator[Client]:
    with Client(server.url, NS) as c:
        c.create_topic(topic)
        yield c


def payloads(messages: list[Message]) -> list[bytes]:
    return [m.payload for m in messages]


def background_poll(
    client: Client, topic: str, wait: float
) -> Callable[[], tuple[list[Message], float]]:
    """A read-committed long-poll in a thread; the returned function joins it."""
    out: dict[str, object] = {}

    def run() -> None:
        start = time.monotonic()
        out["messages"] = client.poll(topic, isolation=RC, wait=wait)
        out["seconds"] = time.monotonic() - start

    thread = threading.Thread(target=run)
    thread.start()

    def join() -> tuple[list[Message], float]:
        thread.join(wait + 10)
        assert not thread.is_alive()
        return out["messages"], out["seconds"]  # type: ignore[return-value]

    return join


def test_long_poll_returns_at_once_when_the_transaction_commits(client: Client, topic: str) -> None:
    tx = client.begin()
    client.publish(topic, [b"t1", b"t2"], write_pointer=tx.write_pointer)
    join = background_poll(client, topic, wait=10)
    time.sleep(0.3)  # the poll is parked: the entries are in progress
    committed_at = time.monotonic()
    client.commit(tx)
    messages, seconds = join()
    assert payloads(messages) == [b"t1", b"t2"]
    assert seconds < 5 and time.monotonic() - committed_at < 2


def test_never_returns_uncommitted_or_aborted_data(client: Client, topic: str) -> None:
    open_tx = client.begin()
    client.publish(topic, b"open", write_pointer=open_tx.write_pointer)
    assert client.poll(topic, isolation=RC) == []
    aborted = client.begin()
    client.rollback(topic, client.publish(topic, b"aborted", write_pointer=aborted.write_pointer))
    client.abort(aborted)
    invalid = client.begin()
    client.publish(topic, b"invalid", write_pointer=invalid.write_pointer)
    client.invalidate(invalid)  # no rollback: its entry stays, and is skipped
    client.publish(topic, b"plain")
    assert client.poll(topic, isolation=RC) == []  # still blocked by "open"
    client.commit(open_tx)
    assert payloads(client.poll(topic, isolation=RC)) == [b"open", b"plain"]
    # Read-uncommitted sees everything that was written.
    assert payloads(client.poll(topic)) == [b"open", b"aborted", b"invalid", b"plain"]


def test_stops_at_an_open_transaction_instead_of_skipping(client: Client, topic: str) -> None:
    client.publish(topic, b"before")
    tx = client.begin()
    client.publish(topic, b"in-tx", write_pointer=tx.write_pointer)
    client.publish(topic, b"after")
    first = client.poll(topic, isolation=RC)
    assert payloads(first) == [b"before"]
    assert client.poll(topic, first[-1].id, inclusive=False, isolation=RC) == []
    join = background_poll_after(client, topic, first[-1], wait=10)
    time.sleep(0.3)
    client.commit(tx)
    messages, seconds = join()
    assert payloads(messages) == [b"in-tx", b"after"] and seconds < 5


def background_poll_after(
    client: Client, topic: str, last: Message, wait: float
) -> Callable[[], tuple[list[Message], float]]:
    out: dict[str, object] = {}

    def run() -> None:
        start = time.monotonic()
        out["messages"] = client.poll(topic, last.id, inclusive=False, isolation=RC, wait=wait)
        out["seconds"] = time.monotonic() - start

    thread = threading.Thread(target=run)
    thread.start()

    def join() -> tuple[list[Message], float]:
        thread.join(wait + 10)
        return out["messages"], out["seconds"]  # type: ignore[return-value]

    return join


def test_long_poll_wakes_when_the_blocking_transaction_is_invalidated(
    client: Client, topic: str
) -> None:
    tx = client.begin()
    client.publish(topic, b"never", write_pointer=tx.write_pointer)
    client.publish(topic, b"behind")
    join = background_poll(client, topic, wait=10)
    time.sleep(0.3)
    client.invalidate(tx)
    messages, seconds = join()
    assert payloads(messages) == [b"behind"] and seconds < 5


def test_long_poll_wakes_when_the_blocking_transaction_times_out(
    start_server: Callable[..., ServerProcess], topic: str
) -> None:
    srv = start_server(TIDINGS_TX_SWEEP_INTERVAL="0.1")
    with Client(srv.url, NS) as client:
        client.create_topic(topic)
        tx = client.begin(timeout=0.5)
        client.publish(topic, b"late", write_pointer=tx.write_pointer)
        client.publish(topic, b"behind")
        start = time.monotonic()
        messages = client.poll(topic, isolation=RC, wait=20)
        assert payloads(messages) == [b"behind"]
        assert time.monotonic() - start < 5  # the sweeper's timeout woke it
        assert tx.write_pointer in client.transactions().invalid


def test_a_transaction_in_the_body_wins(client: Client, topic: str) -> None:
    client.publish(topic, b"old")
    snapshot = client.snapshot()
    client.publish(topic, b"new")  # after the snapshot: still visible (not transactional)
    tx = client.begin()
    client.publish(topic, b"tx", write_pointer=tx.write_pointer)
    client.commit(tx)
    # The old snapshot does not see the transaction that committed after it.
    got = client.poll(topic, transaction=snapshot, isolation=RC)
    assert payloads(got) == [b"old", b"new"]
    assert payloads(client.poll(topic, isolation=RC)) == [b"old", b"new", b"tx"]


def test_bad_isolation_is_400(server: ServerProcess, client: Client, topic: str) -> None:
    url = f"{server.url}/v1/namespaces/{NS}/topics/{topic}/poll"
    for value in ("serializable", "READ_COMMITTED", ""):
        r = httpx.post(url, params={"isolation": value}, json={})
        assert r.status_code == 400, value
        assert r.json()["type"] == "BadRequest"
    assert httpx.post(url, params={"isolation": "read_uncommitted"}, json={}).status_code == 200
    with pytest.raises(BadRequest):
        client.poll(topic, isolation="snapshot")


def test_messaging_only_server_answers_503_and_consumers_fall_back(
    start_server: Callable[..., ServerProcess], topic: str
) -> None:
    messaging = start_server("--role", "messaging")
    transactions = start_server("--role", "transactions")
    url = f"{messaging.url}/v1/namespaces/{NS}/topics/{topic}/poll"
    with Client(messaging.url, NS, transactions_url=transactions.url) as client:
        client.create_topic(topic)
        r = httpx.post(url, params={"isolation": RC}, json={})
        assert (r.status_code, r.json()["type"]) == (503, "RoleUnavailable")
        with pytest.raises(ServiceUnavailable):
            client.poll(topic, isolation=RC)
        # A separate transactions_url: the consumer takes its snapshots itself ...
        assert client.server_snapshots is False
        tx = client.begin()
        client.publish(topic, b"a", write_pointer=tx.write_pointer)
        client.commit(tx)
        assert payloads(list(client.consume(topic, follow=False))) == [b"a"]
        # ... and one told to try the server's first falls back on its 503.
        client.server_snapshots = True
        consumer = client.consume(topic, follow=False)
        assert payloads(list(consumer)) == [b"a"]
        open_tx = client.begin()
        client.publish(topic, b"open", write_pointer=open_tx.write_pointer)
        client.publish(topic, b"behind")
        assert payloads(list(client.consume(topic, follow=False))) == [b"a"]
        client.commit(open_tx)
        assert payloads(list(client.consume(topic, follow=False))) == [b"a", b"open", b"behind"]


def test_consumer_follows_commits_with_the_server_snapshots(client: Client, topic: str) -> None:
    assert client.server_snapshots is True
    consumer = client.consume(topic, wait=10)
    got: list[bytes] = []

    def read() -> None:
        for message in consumer:
            got.append(message.payload)
            if len(got) == 3:
                return

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    time.sleep(0.3)
    started = time.monotonic()
    with client.transaction() as tx:
        tx.publish(topic, [b"x1", b"x2"])
    client.publish(topic, b"x3")
    thread.join(10)
    assert got == [b"x1", b"x2", b"x3"]
    assert time.monotonic() - started < 5  # no waiting for a client-side re-snapshot


def test_async_consumer_follows_commits_and_falls_back(
    server: ServerProcess, start_server: Callable[..., ServerProcess], topic: str
) -> None:
    async def follow(url: str, transactions_url: str | None, force: bool, bound: float) -> float:
        async with AsyncClient(url, NS, transactions_url=transactions_url) as client:
            await client.create_topic(topic)
            client.server_snapshots = client.server_snapshots or force
            consumer = client.consume(topic, wait=10, committed_wait=bound)

            async def commit_later() -> float:
                await asyncio.sleep(0.3)
                tx = await client.begin()
                await client.publish(topic, b"tx", write_pointer=tx.write_pointer)
                await client.commit(tx)
                return time.monotonic()

            task = asyncio.create_task(commit_later())
            message = await asyncio.wait_for(anext(consumer), 15)
            assert message.payload == b"tx"
            return time.monotonic() - await task

    # Server snapshots: the commit wakes the parked poll at once.
    assert asyncio.run(follow(server.url, None, False, 5)) < 2
    # A messaging-only server: 503, then client-side snapshots (committed_wait bound).
    messaging = start_server("--role", "messaging")
    transactions = start_server("--role", "transactions")
    assert asyncio.run(follow(messaging.url, transactions.url, True, 0.5)) < 3
