"""A server on PostgreSQL whose store reads are stalled still answers what needs no
store, black box: every read a request makes runs off the event loop there (over LMDB
some run on the loop, where they take microseconds).

The reads are stalled by holding an ``ACCESS EXCLUSIVE`` lock on the metadata table,
which every read of a topic waits for (a read-only ``SELECT`` takes ``ACCESS SHARE``).
While one request waits for it, ``/healthz`` and ``/openapi.json`` must answer at once;
once the lock goes, the waiting request answers as usual.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import fresh_database
from tests.e2e.serverproc import LeadingServerProcess, ServerProcess

psycopg = pytest.importorskip("psycopg")

pytestmark = pytest.mark.e2e

NS = "/v1/namespaces/default"
#: Longest a request that needs no store may take while a read is stalled (it takes
#: milliseconds; the margin is for a busy machine).
PROMPT = 2.0


@pytest.fixture(scope="module")
def pg(postgres_url: str) -> Iterator[tuple[ServerProcess, str]]:
    """A server on a database of its own, and that database's URL."""
    root = Path(tempfile.mkdtemp(prefix="tidings-pgloop-"))
    url = fresh_database(postgres_url)
    proc = LeadingServerProcess(root / "data", ["--store", url]).start()
    try:
        yield proc, url
    finally:
        proc.kill()
        shutil.rmtree(root, ignore_errors=True)


def _waiting(url: str) -> int:
    """Sessions waiting for a lock on the metadata table."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_locks WHERE NOT granted "
            "AND relation = 'tidings_metadata'::regclass"
        ).fetchone()
    assert row is not None
    return int(row[0])


def _stalled(
    proc: ServerProcess,
    url: str,
    send: Callable[[httpx.Client], httpx.Response],
    wake: Callable[[httpx.Client], object] | None = None,
) -> httpx.Response:
    """``send`` with the metadata table locked: checks that the server answers what
    needs no store while ``send``'s read waits, and returns ``send``'s answer once the
    lock is gone. With ``wake``, ``send`` (a long poll) is sent and parked before the
    lock, and ``wake`` wakes it once the lock is held: its re-fetch waits then."""
    out: dict[str, httpx.Response] = {}

    def run() -> None:
        with httpx.Client(base_url=proc.url, timeout=60) as own:
            out["answer"] = send(own)

    thread = threading.Thread(target=run)
    with httpx.Client(base_url=proc.url, timeout=60) as client:
        before = _waiting(url)
        if wake is not None:
            thread.start()
            time.sleep(0.5)  # parked, its first fetch done
        lock = psycopg.connect(url)
        try:
            lock.execute("SET lock_timeout = '10s'")
            lock.execute("LOCK TABLE tidings_metadata IN ACCESS EXCLUSIVE MODE")
            if wake is None:
                thread.start()
            else:
                wake(client)
            deadline = time.monotonic() + 10
            while _waiting(url) <= before:
                assert time.monotonic() < deadline, "the request never read the store"
                time.sleep(0.05)
            time.sleep(0.2)  # well inside the read now
            for path in ("/healthz", "/openapi.json"):
                began = time.monotonic()
                try:
                    answer = client.get(path, timeout=PROMPT * 2)
                except httpx.TimeoutException:
                    pytest.fail(f"{path} did not answer while a store read waited")
                took = time.monotonic() - began
                assert answer.status_code == 200, answer.text
                assert took < PROMPT, f"{path} took {took:.2f} s while a store read waited"
            assert thread.is_alive(), "the request did not wait for the lock"
        finally:
            lock.rollback()
            lock.close()
            thread.join(30)
        assert not thread.is_alive()
    return out["answer"]


def _topic(client: httpx.Client, topic: str, messages: int = 1) -> str:
    base = f"{NS}/topics/{topic}"
    assert client.put(base, json={}).status_code == 200
    if messages:
        body = {"messages": ["YQ=="] * messages}
        assert client.post(base + "/publish", json=body).status_code == 200
    return base


def test_a_poll(pg: tuple[ServerProcess, str], topic: str) -> None:
    proc, url = pg
    with httpx.Client(base_url=proc.url, timeout=30) as client:
        base = _topic(client, topic)
    answer = _stalled(proc, url, lambda c: c.post(base + "/poll", json={}))
    assert answer.status_code == 200 and len(answer.json()) == 1


def test_a_read_committed_long_poll_woken_by_a_transaction(
    pg: tuple[ServerProcess, str], topic: str
) -> None:
    # The re-fetch after a wake-up: the poll is parked before the lock, and the end of
    # a transaction (written to another table) wakes it while the lock is held.
    proc, url = pg
    with httpx.Client(base_url=proc.url, timeout=30) as client:
        base = _topic(client, topic, messages=0)

    def wake(client: httpx.Client) -> None:
        wp = client.post("/v1/transactions", json={}).json()["writePointer"]
        assert client.post(f"/v1/transactions/{wp}/abort", json={}).status_code == 200

    def poll(client: httpx.Client) -> httpx.Response:
        params = {"waitMs": "3000", "isolation": "read_committed"}
        return client.post(base + "/poll", params=params, json={})

    answer = _stalled(proc, url, poll, wake=wake)
    assert answer.status_code == 200 and answer.json() == []


def test_a_heartbeat(pg: tuple[ServerProcess, str], topic: str) -> None:
    proc, url = pg
    with httpx.Client(base_url=proc.url, timeout=30) as client:
        base = _topic(client, topic) + "/groups/g"
        member = client.post(base + "/join", json={"start": "earliest"}).json()["memberId"]
    answer = _stalled(proc, url, lambda c: c.post(base + "/heartbeat", json={"memberId": member}))
    assert answer.status_code == 200 and answer.json()["memberId"] == member


def test_a_pop_of_a_queue_in_memory(pg: tuple[ServerProcess, str], topic: str) -> None:
    proc, url = pg
    with httpx.Client(base_url=proc.url, timeout=30) as client:
        base = _topic(client, topic, messages=2) + "/queues/q"
        pop = {"consumerId": "w1", "maxMessages": 1}
        first = client.post(base + "/pop", json=pop)  # loads the queue into memory
        assert first.status_code == 200 and len(first.json()) == 1
    answer = _stalled(proc, url, lambda c: c.post(base + "/pop", json=pop))
    assert answer.status_code == 200 and len(answer.json()) == 1


def test_an_ack(pg: tuple[ServerProcess, str], topic: str) -> None:
    proc, url = pg
    with httpx.Client(base_url=proc.url, timeout=30) as client:
        base = _topic(client, topic) + "/queues/q"
        popped = client.post(base + "/pop", json={"consumerId": "w1", "maxMessages": 1})
        assert popped.status_code == 200 and len(popped.json()) == 1
    ack = {"consumerId": "w1", "ids": [popped.json()[0]["id"]]}
    answer = _stalled(proc, url, lambda c: c.post(base + "/ack", json=ack))
    assert answer.status_code == 200, answer.text


def test_a_publish_to_a_topic_the_server_does_not_know(
    pg: tuple[ServerProcess, str], topic: str
) -> None:
    # A topic this server has not seen is looked up in the store before the write.
    proc, url = pg
    body = {"messages": ["YQ=="]}
    answer = _stalled(proc, url, lambda c: c.post(f"{NS}/topics/{topic}/publish", json=body))
    assert answer.status_code == 404, answer.text


def test_a_transaction_in_one_request_with_an_ack(
    pg: tuple[ServerProcess, str], topic: str
) -> None:
    proc, url = pg
    with httpx.Client(base_url=proc.url, timeout=30) as client:
        _topic(client, topic)
        base = f"{NS}/topics/{topic}/queues/q"
        popped = client.post(base + "/pop", json={"consumerId": "w1", "maxMessages": 1})
        assert popped.status_code == 200 and len(popped.json()) == 1
    ack = {"topic": topic, "queue": "q", "consumerId": "w1", "ids": [popped.json()[0]["id"]]}
    body = {"topics": [], "acks": [ack]}
    answer = _stalled(proc, url, lambda c: c.post(f"{NS}/transactions/publish", json=body))
    assert answer.status_code == 200, answer.text


def test_a_transaction_in_one_request_with_a_group_commit(
    pg: tuple[ServerProcess, str], topic: str
) -> None:
    proc, url = pg
    with httpx.Client(base_url=proc.url, timeout=30) as client:
        base = _topic(client, topic) + "/groups/g"
        joined = client.post(base + "/join", json={"start": "earliest", "partitions": 1})
        member = joined.json()["memberId"]
        polled = client.post(base + "/poll", json={"memberId": member})
        assert polled.status_code == 200 and len(polled.json()) == 1
    position = {"partition": 0, "id": polled.json()[0]["id"]}
    commit = {"topic": topic, "group": "g", "memberId": member, "positions": [position]}
    body = {"topics": [], "groupCommits": [commit]}
    answer = _stalled(proc, url, lambda c: c.post(f"{NS}/transactions/publish", json=body))
    assert answer.status_code == 200, answer.text


def test_long_polls_of_a_group_and_a_queue_wait_and_keep_the_member(
    pg: tuple[ServerProcess, str], topic: str
) -> None:
    # Their waits between two scans (the member's session, the queue's next lease
    # deadline) are looked up on a worker thread here.
    proc, _ = pg
    with httpx.Client(base_url=proc.url, timeout=30) as client:
        base = _topic(client, topic, messages=0)
        join = {"start": "latest", "sessionTimeoutMs": 1000}
        member = client.post(base + "/groups/g/join", json=join).json()["memberId"]
        began = time.monotonic()
        polled = client.post(
            base + "/groups/g/poll", params={"waitMs": "2500"}, json={"memberId": member}
        )
        assert polled.status_code == 200 and polled.json() == []
        assert time.monotonic() - began >= 2.4
        # Waiting kept it in the group past its session timeout.
        beat = client.post(base + "/groups/g/heartbeat", json={"memberId": member})
        assert beat.status_code == 200, beat.text
        began = time.monotonic()
        pop = {"consumerId": "w1", "maxMessages": 1}
        popped = client.post(base + "/queues/q/pop", params={"waitMs": "1500"}, json=pop)
        assert popped.status_code == 200 and popped.json() == []
        assert time.monotonic() - began >= 1.4
