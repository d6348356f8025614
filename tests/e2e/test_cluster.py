"""Several ``tidings serve`` instances on one PostgreSQL database: one leads (holds the
leader lease and writes, fenced by its epoch), the others forward every request to it
and take over when its lease passes.

Black box: real server processes, a real PostgreSQL, the real client.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import psycopg
import pytest

from tests.conftest import fresh_database
from tests.e2e.serverproc import ServerProcess, readiness, wait_leading
from tidings import Client, RetryPolicy
from tidings.errors import TidingsError

pytestmark = pytest.mark.e2e

LEASE = 2.0


@pytest.fixture
def instances(tmp_path: Path) -> Iterator[Callable[..., ServerProcess]]:
    """Instances on one database (each with its own data dir); all killed afterwards."""
    made: list[ServerProcess] = []

    def make(url: str) -> ServerProcess:
        proc = ServerProcess(
            tmp_path / f"node{len(made)}", ["--store", url, "--lease-seconds", str(LEASE)]
        )
        made.append(proc)
        return proc.start()

    yield make
    for proc in made:
        if proc.proc is not None and proc.proc.poll() is None:
            proc.proc.send_signal(signal.SIGCONT)  # a stopped one cannot die otherwise
        proc.kill()


def test_producers_through_both_instances_see_one_order(
    instances: Callable[..., ServerProcess], postgres_url: str
) -> None:
    url = fresh_database(postgres_url)
    a = instances(url)
    b = instances(url)
    assert readiness(a) == "ready" and readiness(b) == "forwarding"
    with Client(a.url) as ca, Client(b.url) as cb:
        cb.create_topic("t")  # admin through the standby too
        acked: dict[str, list[bytes]] = {"a": [], "b": []}

        def produce(name: str, client: Client) -> None:
            for n in range(30):
                batch = [b"%s-%03d-%d" % (name.encode(), n, i) for i in range(5)]
                client.publish("t", batch)
                acked[name].extend(batch)

        threads = [
            threading.Thread(target=produce, args=("a", ca)),
            threading.Thread(target=produce, args=("b", cb)),
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        # A transaction begun and committed through one instance, read through the other.
        with cb.transaction() as tx:
            tx.publish("t", [b"tx-1", b"tx-2"])
        from_a = [m.payload for m in ca.poll("t", limit=10_000)]
        from_b = [m.payload for m in cb.poll("t", limit=10_000)]
        assert from_a == from_b, "the two instances disagree on the order"
        assert len(from_a) == len(set(from_a)) == 302
        for name in ("a", "b"):  # each producer's messages in the order it sent them
            assert [p for p in from_a if p.startswith(name.encode())] == acked[name]
        assert from_a[-2:] == [b"tx-1", b"tx-2"]
        # A long-poll through the standby wakes when a message comes in elsewhere.
        end = ca.poll("t", limit=10_000)[-1].id
        woke: list[float] = []

        def wait_for_one() -> None:
            got = cb.poll("t", start=end, inclusive=False, wait=10.0)
            woke.append(time.monotonic() if got else -1.0)

        waiter = threading.Thread(target=wait_for_one)
        waiter.start()
        time.sleep(0.5)
        sent = time.monotonic()
        ca.publish("t", [b"wake"])
        waiter.join(15)
        # The leader wakes the forwarded long-poll at the commit (the goal is tens of
        # milliseconds; the bound leaves room for a loaded machine).
        assert woke and 0 < woke[0] - sent < 0.5, woke


def test_a_standby_takes_over_after_kill_9_with_nothing_acknowledged_lost(
    instances: Callable[..., ServerProcess], postgres_url: str
) -> None:
    url = fresh_database(postgres_url)
    a = instances(url)
    b = instances(url)
    assert readiness(b) == "forwarding", "a second instance must stand by while the first leads"
    with Client(a.url) as client:
        client.create_topic("orders")
        open_tx = client.begin()
        with client.transaction() as tx:
            tx.publish("orders", [b"t1", b"t2"])
        acked: list[bytes] = []
        stop = threading.Event()

        def publish() -> None:
            # One publisher, batches acknowledged in order, until the leader dies.
            with Client(a.url, timeout=5.0) as pub:
                for n in range(100_000):
                    if stop.is_set():
                        return
                    batch = [b"m%06d-%d" % (n, i) for i in range(20)]
                    try:
                        pub.publish("orders", batch)
                    except TidingsError:
                        return
                    acked.extend(batch)

        through_b: list[bytes] = []

        def publish_through_b() -> None:
            # Through the standby, across the kill: each call retries until a leader
            # answers, and the idempotent producer keeps a retry from writing twice.
            patient = RetryPolicy(attempts=100, initial_backoff=0.05, max_backoff=0.3)
            with Client(b.url, timeout=5.0, retry=patient) as pub:
                for n in range(60):
                    batch = [b"b%04d-%d" % (n, i) for i in range(10)]
                    pub.publish("orders", batch)
                    through_b.extend(batch)
                    time.sleep(0.05)

        thread = threading.Thread(target=publish)
        other = threading.Thread(target=publish_through_b)
        thread.start()
        other.start()
        deadline = time.monotonic() + 10
        while len(acked) < 400 and time.monotonic() < deadline:
            time.sleep(0.01)
        a.kill()
        killed = time.monotonic()
        stop.set()
        thread.join(10)
    wait_leading(b, 20.0)
    took = time.monotonic() - killed
    assert acked, "nothing was published before the kill"
    # The lease, the standby's poll, recovery from the database and the start of its
    # HTTP server; generous, as the two cores are shared with the rest of the suite.
    assert took < LEASE + 8, f"takeover took {took:.1f} s"
    other.join(60)
    assert len(through_b) == 600, "publishing through the standby did not ride through"
    with Client(b.url) as client:
        seen = [m.payload for m in client.poll("orders", limit=10_000)]
        assert seen[:2] == [b"t1", b"t2"]
        rest = seen[2:]
        assert len(rest) == len(set(rest)), "a message was written twice"
        mine = [p for p in rest if p.startswith(b"m")]
        assert mine[: len(acked)] == acked, "an acknowledged message is missing or moved"
        assert [p for p in rest if p.startswith(b"b")] == through_b
        # The transaction state came through the database too.
        state = client.transactions()
        assert open_tx.write_pointer in state.in_progress
        client.abort(open_tx.write_pointer)
        client.publish("orders", [b"after"])
        assert client.poll("orders", limit=10_000)[-1].payload == b"after"
    assert not (a.data_dir / "tx").exists(), "the transaction log belongs in PostgreSQL"


def test_a_stopped_leader_cannot_write_after_another_took_over(
    instances: Callable[..., ServerProcess], postgres_url: str
) -> None:
    url = fresh_database(postgres_url)
    a = instances(url)
    b = instances(url)
    with Client(a.url) as client:
        client.create_topic("t")
        client.publish("t", [b"before"])
    assert a.proc is not None
    a.proc.send_signal(signal.SIGSTOP)
    late: list[object] = []

    def publish_late() -> None:
        # Sent while the leader is stopped: the kernel queues it; the process reads it
        # only after SIGCONT, when another instance leads.
        try:
            once = RetryPolicy(attempts=1)
            with Client(a.url, timeout=20.0, retry=once) as late_client:
                late_client.publish("t", [b"late"])
            late.append("acknowledged")
        except TidingsError as exc:
            late.append(exc)

    thread = threading.Thread(target=publish_late)
    thread.start()
    wait_leading(b, 20.0)
    with Client(b.url) as client:
        client.publish("t", [b"from-b"])
    a.proc.send_signal(signal.SIGCONT)
    thread.join(30)
    assert late and late[0] != "acknowledged", "the ex-leader acknowledged a write"
    assert a.proc.wait(20) == 3, a.log()  # it noticed, and stopped
    assert "lost the leader lease" in a.log()
    with Client(b.url) as client:
        assert [m.payload for m in client.poll("t")] == [b"before", b"from-b"]
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT epoch FROM tidings_leases WHERE name = 'leader'").fetchone()
        assert row == (2,)


def test_a_clean_stop_hands_over_at_once_and_cluster_shows_it(
    instances: Callable[..., ServerProcess], postgres_url: str
) -> None:
    url = fresh_database(postgres_url)
    a = instances(url)
    b = instances(url)
    deadline = time.monotonic() + 15
    while True:  # until b has started and announced itself
        view = httpx.get(a.url + "/v1/cluster", timeout=5).json()
        if len(view["instances"]) == 2 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert view["store"] == "postgresql"
    assert view["leader"]["epoch"] == 1
    assert view["leader"]["url"] == a.url
    ids = {i["id"]: i for i in view["instances"]}
    assert len(ids) == 2
    leader = ids[view["leader"]["instance"]]
    assert leader["leader"] and leader["owns"] == ["topics", "transactions", "groups", "queues"]
    assert next(i for i in ids.values() if not i["leader"])["owns"] == []
    assert 0 < view["leader"]["expiresInMs"] <= LEASE * 1000
    # The same through the standby (forwarded), and through the CLI.
    assert httpx.get(b.url + "/v1/cluster", timeout=5).json()["leader"]["url"] == a.url
    shown = subprocess.run(
        [sys.executable, "-m", "tidings", "--url", b.url, "cluster"],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert shown.returncode == 0, shown.stderr
    assert "leader epoch 1" in shown.stdout and "standing by" in shown.stdout
    assert a.url in shown.stdout and b.url in shown.stdout
    assert a.stop() == 0
    began = time.monotonic()
    wait_leading(b, 10.0)
    assert time.monotonic() - began < LEASE, "a clean stop should not make others wait"
    view = httpx.get(b.url + "/v1/cluster", timeout=5).json()
    assert view["leader"]["epoch"] == 2 and view["leader"]["url"] == b.url


def test_cluster_on_the_embedded_store_is_one_instance(
    start_server: Callable[..., ServerProcess],
) -> None:
    srv = start_server()
    view = httpx.get(srv.url + "/v1/cluster", timeout=5).json()
    assert view["store"] == "lmdb"
    assert len(view["instances"]) == 1 and view["instances"][0]["leader"]
    assert view["leader"]["epoch"] is None


def test_the_standby_forwards_the_token_and_the_leader_checks_it(
    tmp_path: Path, postgres_url: str
) -> None:
    from tests.e2e.test_security import TOKENS, auth_file, bearer

    url = fresh_database(postgres_url)
    path = auth_file(tmp_path / "auth.toml")
    nodes = [
        ServerProcess(
            tmp_path / f"n{n}", ["--store", url, "--lease-seconds", "3", "--auth-file", str(path)]
        ).start()
        for n in range(2)
    ]
    try:
        b = nodes[1]
        assert readiness(b) == "forwarding"
        topics = "/v1/namespaces/default/topics"
        with httpx.Client(base_url=b.url, timeout=10) as http:
            assert http.get(topics).status_code == 401  # no token: refused, via the leader
            assert http.put(topics + "/t-x", headers=bearer("reader")).status_code == 403
            assert http.put(topics + "/t-x", headers=bearer("admin")).status_code == 200
            answer = http.get(topics, headers=bearer("reader"))
            assert answer.status_code == 200 and "t-x" in answer.json()
        # The token reached the leader, but no log line of either instance shows it.
        for node in nodes:
            assert not any(token in node.log() for token in TOKENS.values())
    finally:
        for node in nodes:
            node.kill()


def test_the_standby_judges_a_browser_write_by_its_own_origin(
    instances: Callable[..., ServerProcess], postgres_url: str
) -> None:
    """The console served by a standby writes with the standby's origin, which the
    leader (seeing its own Host on the hop) would take for another site's."""
    url = fresh_database(postgres_url)
    a = instances(url)
    b = instances(url)
    assert readiness(b) == "forwarding"
    path = "/v1/namespaces/default/topics/t-origin"
    with httpx.Client(base_url=b.url, timeout=10) as http, Client(a.url) as client:
        assert http.put(path, headers={"Origin": b.url}).status_code == 200
        body = b'{"messages": ["b3du"]}'  # "own"
        answer = http.post(path + "/publish", content=body, headers={"Origin": b.url})
        assert answer.status_code == 200, answer.text
        forged = http.post(path + "/publish", content=body, headers={"Origin": a.url})
        assert forged.status_code == 403 and forged.json()["type"] == "Forbidden"
        assert [m.payload for m in client.poll("t-origin", limit=10)] == [b"own"]
