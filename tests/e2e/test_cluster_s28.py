"""An instance standing by on PostgreSQL: how it polls the leader lease, and what it
answers once it cannot reach the database.

Black box: real server processes, a real PostgreSQL (reached by the standby through a
TCP relay that a test can cut, as a network partition would, without a reset), and
plain HTTP.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import psycopg
import pytest

from tests.conftest import fresh_database
from tests.e2e.serverproc import ServerProcess, readiness

pytestmark = pytest.mark.e2e

LEASE = 2.0


class Relay:
    """A TCP relay on 127.0.0.1 to ``target``. :meth:`cut` makes it a black hole:
    nothing passes either way and new connections are taken but never answered, as
    when packets are dropped. :meth:`mend` lets traffic pass again (connections that
    lost bytes meanwhile are closed: their streams cannot be resumed)."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.1)
        self.port = int(self._listener.getsockname()[1])
        self._cut = threading.Event()
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._spoiled: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def cut(self) -> None:
        self._cut.set()

    def mend(self) -> None:
        with self._lock:
            for sock in self._spoiled:
                with contextlib.suppress(OSError):
                    sock.close()
            self._spoiled.clear()
            self._cut.clear()

    def close(self) -> None:
        self._closed.set()
        self.mend()
        self._listener.close()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            client.settimeout(0.1)
            if self._cut.is_set():
                with self._lock:
                    self._spoiled.append(client)
                threading.Thread(target=self._pump, args=(client, None), daemon=True).start()
                continue
            upstream = socket.create_connection(self.target, timeout=2)
            upstream.settimeout(0.1)
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket | None) -> None:
        while not self._closed.is_set():
            try:
                data = src.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                break
            if not data:
                break
            if self._cut.is_set() or dst is None:
                with self._lock:  # dropped: this connection's stream is broken for good
                    self._spoiled.extend(s for s in (src, dst) if s is not None)
                continue
            try:
                dst.sendall(data)
            except OSError:
                break
        for sock in (src, dst):
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.close()


@pytest.fixture
def instances(tmp_path: Path) -> Iterator[Callable[[str], ServerProcess]]:
    made: list[ServerProcess] = []

    def make(url: str) -> ServerProcess:
        proc = ServerProcess(
            tmp_path / f"node{len(made)}", ["--store", url, "--lease-seconds", str(LEASE)]
        )
        made.append(proc)
        return proc.start()

    yield make
    for proc in made:
        proc.kill()


def _sessions(url: str) -> int:
    """How many sessions have been opened on the database of ``url`` so far (read
    from another database, so that this reading is not one of them)."""
    name = urlsplit(url).path.lstrip("/")
    with psycopg.connect(url.rsplit("/", 1)[0] + "/postgres", autocommit=True) as conn:
        row = conn.execute(
            "SELECT sessions FROM pg_stat_database WHERE datname = %s", (name,)
        ).fetchone()
    assert row is not None
    return int(row[0])


def test_a_standby_polls_the_lease_over_one_connection(
    instances: Callable[[str], ServerProcess], postgres_url: str
) -> None:
    url = fresh_database(postgres_url)
    leader = instances(url)
    standby = instances(url)
    assert readiness(leader) == "ready" and readiness(standby) == "forwarding"
    time.sleep(0.5)  # both settled: connections open, first polls done
    before = _sessions(url)
    # Polled every twentieth of the lease (0.1 s): 2 s is about 20 polls, and the
    # forwarder looks the leader up on the way too.
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:
        httpx.get(standby.url + "/readyz", timeout=5).raise_for_status()
        time.sleep(0.1)
    time.sleep(1.2)  # a backend reports its session to the statistics within a second
    opened = _sessions(url) - before
    assert opened <= 2, f"{opened} connections opened in 2 s of standing by"


def test_a_standby_cut_off_from_the_store_answers_503_at_once_and_recovers(
    instances: Callable[[str], ServerProcess], postgres_url: str
) -> None:
    url = fresh_database(postgres_url)
    parts = urlsplit(url)
    relay = Relay((parts.hostname or "127.0.0.1", parts.port or 5432))
    try:
        leader = instances(url)
        standby = instances(url.replace(f":{parts.port}/", f":{relay.port}/", 1))
        topics = standby.url + "/v1/namespaces/default/topics"
        # Healthy: no false alarm over a few lease lookups and polls.
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            assert httpx.get(standby.url + "/readyz", timeout=5).status_code == 200
            assert httpx.get(topics, timeout=5).status_code == 200
            time.sleep(0.1)
        relay.cut()
        began = time.monotonic()
        slowest = 0.0
        answers: list[int] = []
        # The leader is alive and reachable: until the standby's view of the lease is
        # older than the lease, requests still go to it; after, 503 at once.
        while time.monotonic() - began < LEASE + 3.0:
            sent = time.monotonic()
            answer = httpx.get(standby.url + "/readyz", timeout=15)
            slowest = max(slowest, time.monotonic() - sent)
            answers.append(answer.status_code)
            time.sleep(0.1)
        assert answers[-1] == 503, answers
        assert slowest < 1.0, f"/readyz took {slowest:.1f} s with the store cut off"
        sent = time.monotonic()
        answer = httpx.get(topics, timeout=15)
        assert answer.status_code == 503 and answer.headers["retry-after"] == "1"
        assert answer.json()["type"] == "ServiceUnavailable"
        assert time.monotonic() - sent < 1.0
        assert readiness(leader) == "ready"  # never a false takeover
        relay.mend()
        # Back: the standby polls over a new connection and forwards again.
        deadline = time.monotonic() + LEASE + 10
        while httpx.get(standby.url + "/readyz", timeout=5).status_code != 200:
            assert time.monotonic() < deadline, standby.log()
            time.sleep(0.1)
        answer = httpx.get(topics, timeout=5)
        assert answer.status_code == 200, answer.text
    finally:
        relay.close()
