"""Instances on one PostgreSQL database, black box: what a standby passes on to the
leader and back, and how the cluster copes with failures (real server processes, a
real PostgreSQL)."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import psycopg
import pytest

from tests.conftest import PgTestCluster, fresh_database
from tests.e2e.serverproc import ServerProcess, readiness, wait_leading
from tidings import Client, RetryPolicy
from tidings.errors import TidingsError

pytestmark = pytest.mark.e2e

LEASE = 2.0
TOPICS = "/v1/namespaces/default/topics"


@pytest.fixture(scope="module")
def pair(postgres_url: str) -> Iterator[tuple[ServerProcess, ServerProcess]]:
    """A leader and a standby on one fresh database, shared by the module's tests
    that do not stop either."""
    root = Path(tempfile.mkdtemp(prefix="tidings-pair-"))
    url = fresh_database(postgres_url)
    nodes: list[ServerProcess] = []
    try:
        for n in range(2):
            args = ["--store", url, "--lease-seconds", str(LEASE)]
            nodes.append(ServerProcess(root / f"node{n}", args).start())
        assert readiness(nodes[0]) == "ready" and readiness(nodes[1]) == "forwarding"
        yield nodes[0], nodes[1]
    finally:
        for node in nodes:
            node.kill()
        shutil.rmtree(root, ignore_errors=True)


def test_a_head_request_through_the_standby_answers_as_the_leader(
    pair: tuple[ServerProcess, ServerProcess],
) -> None:
    leader, standby = pair
    with httpx.Client(timeout=10) as http:
        assert http.put(leader.url + TOPICS + "/head-t", json={}).status_code == 200
        for path in (TOPICS + "/head-t/stats", TOPICS + "/no-such-topic/stats", TOPICS):
            direct = http.head(leader.url + path)
            forwarded = http.head(standby.url + path)
            assert forwarded.status_code == direct.status_code, path
            assert forwarded.content == b""
            # The length a GET would have: the leader's, not that of the empty body.
            assert forwarded.headers["content-length"] == direct.headers["content-length"]
            assert int(direct.headers["content-length"]) > 0
            assert forwarded.headers["content-type"] == direct.headers["content-type"]


def test_the_standby_sends_one_date_header(pair: tuple[ServerProcess, ServerProcess]) -> None:
    standby = pair[1]
    with httpx.Client(timeout=10) as http:
        for method, path in (("GET", TOPICS), ("PUT", TOPICS + "/date-t"), ("GET", "/nope")):
            answer = http.request(method, standby.url + path, json={} if method == "PUT" else None)
            assert len(answer.headers.get_list("date")) == 1, (method, path, answer.headers)


class FreezingProxy:
    """A TCP proxy to PostgreSQL on 127.0.0.1 that can go silent: once frozen, it
    passes no byte either way and closes nothing, as a network partition looks from
    both ends (no reset, no timeout before TCP's own, many minutes later)."""

    def __init__(self, port: int) -> None:
        import socket
        import threading

        self._upstream = port
        self.frozen = threading.Event()
        self._closed = threading.Event()
        self._socks: list[socket.socket] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        import socket
        import threading

        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            self._socks.append(client)
            if self.frozen.is_set():
                continue  # a connection that never gets an answer
            upstream = socket.create_connection(("127.0.0.1", self._upstream))
            self._socks.append(upstream)
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, src: object, dst: object) -> None:
        import socket

        assert isinstance(src, socket.socket) and isinstance(dst, socket.socket)
        while not self._closed.is_set():
            try:
                data = src.recv(65536)
            except OSError:
                return
            while self.frozen.is_set() and not self._closed.is_set():
                self._closed.wait(0.05)  # hold what came: nothing passes
            if not data or self._closed.is_set():
                return
            try:
                dst.sendall(data)
            except OSError:
                return

    def close(self) -> None:
        self._closed.set()
        self._listener.close()
        for sock in self._socks:
            sock.close()


def test_a_leader_cut_off_from_postgresql_stops_within_the_lease(
    postgres_cluster: PgTestCluster, tmp_path: Path
) -> None:
    # Its renewal hangs, it does not fail: the leader must still judge by its own
    # clock that its lease has passed, and stop, while another instance takes over.
    url = fresh_database(postgres_cluster.url)
    proxy = FreezingProxy(postgres_cluster.port)
    via_proxy = url.replace(f":{postgres_cluster.port}/", f":{proxy.port}/")
    # In-flight requests get a second once it stops (the default is 30).
    a = ServerProcess(
        tmp_path / "a",
        ["--store", via_proxy, "--lease-seconds", str(LEASE)],
        {"TIDINGS_SHUTDOWN_TIMEOUT": "1"},
    )
    b = ServerProcess(tmp_path / "b", ["--store", url, "--lease-seconds", str(LEASE)])
    try:
        a.start()
        b.start()
        assert readiness(a) == "ready"
        with Client(a.url) as client:
            client.create_topic("t")
            client.publish("t", [b"before"])
        proxy.frozen.set()
        cut = time.monotonic()
        late: list[object] = []

        def publish_late() -> None:
            # Its write waits for PostgreSQL's answer, which never comes.
            try:
                with Client(a.url, timeout=60.0, retry=RetryPolicy(attempts=1)) as late_client:
                    late_client.publish("t", [b"late"])
                late.append("acknowledged")
            except TidingsError as exc:
                late.append(exc)

        thread = threading.Thread(target=publish_late)
        thread.start()
        wait_leading(b, 20.0)
        assert a.proc is not None
        try:
            code = a.proc.wait(LEASE + 20)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the cut-off leader still runs {time.monotonic() - cut:.0f} s later")
        assert code == 3, a.log()
        assert "lost the leader lease" in a.log()
        thread.join(10)
        assert late and late[0] != "acknowledged", "the cut-off leader acknowledged a write"
        with Client(b.url) as client:
            client.publish("t", [b"after"])
            assert [m.payload for m in client.poll("t")] == [b"before", b"after"]
    finally:
        a.kill()
        b.kill()
        proxy.close()


def _serve(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    """``tidings serve`` that is expected to stop at once (a timeout otherwise)."""
    from tests.e2e.serverproc import free_port

    return subprocess.run(
        [sys.executable, "-m", "tidings", "serve", "--host", "127.0.0.1",
         "--port", str(free_port()), "--data-dir", str(tmp_path / "data"), *args],
        capture_output=True,
        timeout=30,
    )  # fmt: skip


def test_a_store_url_that_is_not_postgresql_is_a_bad_configuration(tmp_path: Path) -> None:
    done = _serve(tmp_path, "--store", "mysql://nope")
    assert done.returncode == 2, done  # docs/operations.md: 2 for a bad configuration
    assert done.stdout.decode().strip().splitlines() == [
        "Error: cannot start: store must be a postgresql:// URL, got 'mysql://nope'"
    ]
    assert b"Traceback" not in done.stdout + done.stderr


@pytest.mark.parametrize("role", ["messaging", "transactions"])
def test_a_postgresql_store_refuses_a_role_other_than_all(
    tmp_path: Path, postgres_url: str, role: str
) -> None:
    # A transactions-only process started, its log in data_dir: the store unused.
    done = _serve(tmp_path, "--role", role, "--store", fresh_database(postgres_url))
    assert done.returncode == 2, done
    assert "needs role `all`" in done.stdout.decode()
    assert not (tmp_path / "data" / "tx").exists()


def _cut_sessions(url: str) -> int:
    """Cut every session of ``url``'s database but this one, as a restart of
    PostgreSQL would; how many were cut."""
    database = url.rsplit("/", 1)[1]
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = %s AND pid <> pg_backend_pid()",
            (database,),
        ).fetchall()
    return len(rows)


def _cut_under_a_log_write(url: str, call: Callable[[], None]) -> BaseException | None:
    """Run ``call`` while the transaction log's table is locked, so that the leader's
    next write of its log waits, and cut every session of the database meanwhile, as a
    restart of PostgreSQL under that write would (a session cut while idle is replaced
    before the next write: that write would not fail); what ``call`` raised."""
    database = url.rsplit("/", 1)[1]
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            call()
        except BaseException as exc:
            outcome.append(exc)
        else:
            outcome.append(None)

    locker = psycopg.connect(url)
    try:
        locker.execute("LOCK TABLE tidings_tx IN ACCESS EXCLUSIVE MODE")
        thread = threading.Thread(target=run)
        thread.start()
        with psycopg.connect(url, autocommit=True) as watcher:
            for _ in range(250):  # bounded: 5 s
                waiting = watcher.execute(
                    "SELECT count(*) FROM pg_stat_activity "
                    "WHERE datname = %s AND wait_event_type = 'Lock'",
                    (database,),
                ).fetchone()
                if waiting is not None and waiting[0] > 0:
                    break
                time.sleep(0.02)
        assert _cut_sessions(url) >= 1  # the locker's too: the lock goes with it
        thread.join(30)
        assert not thread.is_alive(), "the call still waits after the cut"
    finally:
        with contextlib.suppress(psycopg.Error):
            locker.close()
    return outcome[0]


def test_a_leader_whose_transaction_log_failed_hands_over(
    postgres_url: str, tmp_path: Path
) -> None:
    # A write of the transaction log failed (its connection was cut: a restart of
    # PostgreSQL does that). The log then refuses every call until it is recovered from
    # the database; the leader must not go on leading with it (and saying it is ready).
    url = fresh_database(postgres_url)
    args = ["--store", url, "--lease-seconds", "5"]
    a = ServerProcess(tmp_path / "a", args)
    b = ServerProcess(tmp_path / "b", args)
    try:
        a.start()
        b.start()
        with Client(b.url) as client:
            client.create_topic("t")
            with client.transaction() as tx:
                tx.publish("t", [b"before"])
        once = RetryPolicy(attempts=1)

        def transact() -> None:
            with Client(b.url, retry=once) as client, client.transaction() as tx:
                tx.publish("t", [b"cut"])

        failed = False
        for _ in range(5):  # a write of the server's own may meet the cut first
            if isinstance(_cut_under_a_log_write(url, transact), TidingsError):
                failed = True
                break
        assert failed, "no transaction call met the cut connection"
        # A transaction whose outcome is unknown is not retried by the client: try
        # new ones until the transaction service answers again (another instance
        # recovered it from the database).
        deadline = time.monotonic() + 30
        errors: list[TidingsError] = []
        with Client(b.url, timeout=10.0) as client:
            while True:
                try:
                    with client.transaction() as tx:
                        tx.publish("t", [b"after"])
                    break
                except TidingsError as exc:
                    errors.append(exc)
                    assert time.monotonic() < deadline, f"transactions still fail: {errors[-3:]}"
                    time.sleep(0.2)
            payloads = [m.payload for m in client.poll("t")]
        assert payloads[0] == b"before" and payloads[-1] == b"after"
        assert a.proc is not None
        assert a.proc.wait(20) == 1, a.log()
        assert "the transaction log stopped after a failed write" in a.log()
        assert readiness(b) == "ready"
    finally:
        a.kill()
        b.kill()
