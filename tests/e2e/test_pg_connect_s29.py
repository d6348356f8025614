"""A PostgreSQL that never answers a connection (a black-holed address: the port takes
the TCP connection and says nothing), black box: a start stops with a clear error
within ``pg_connect_timeout``, and at run time a write that needs a new connection
gets a 503 within about that, and reads come back as soon as PostgreSQL does.

The store's writer waited 10 s whatever was set, the lease's connections 5 s, and the
read pool's connections psycopg's default of 130 s, so a pool whose opening threads
were all stuck on such an address could not open a connection for minutes after the
database came back.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import PgTestCluster, fresh_database, fresh_schema
from tests.e2e.pgproxy import CommitCutProxy
from tests.e2e.serverproc import LeadingServerProcess, ServerProcess, free_port

pytest.importorskip("psycopg")

from tidings.errors import StoreUnavailable
from tidings.store.backends.postgres import PostgresStore

pytestmark = pytest.mark.e2e

NS = "/v1/namespaces/default"
CONNECT_TIMEOUT = 2
#: What a bound of CONNECT_TIMEOUT may take beyond it on a busy machine.
MARGIN = 2.5


def test_a_start_on_a_black_holed_postgresql_stops_within_the_connect_timeout(
    tmp_path: Path,
) -> None:
    with socket.create_server(("127.0.0.1", 0), backlog=16) as hole:  # never accepts
        url = f"postgresql://postgres@127.0.0.1:{hole.getsockname()[1]}/postgres"
        began = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", "tidings", "serve", "--host", "127.0.0.1",
             "--port", str(free_port()), "--data-dir", str(tmp_path / "data"),
             "--store", url],
            capture_output=True,
            timeout=60,
            env={**os.environ, "TIDINGS_PG_CONNECT_TIMEOUT": str(CONNECT_TIMEOUT)},
        )  # fmt: skip
        took = time.monotonic() - began
    out = (done.stdout + done.stderr).decode(errors="replace")
    assert done.returncode != 0, out
    assert "cannot reach the PostgreSQL store" in out, out
    assert "pg_connect_timeout" in out, out
    # The interpreter's start and imports take a second or so besides, more on a busy
    # machine. (The message is what tells the fixed start from the old one, which
    # waited 5 s here, whatever was set, and named no setting.)
    assert took < CONNECT_TIMEOUT + MARGIN + 4, f"stopped after {took:.1f} s"


@pytest.fixture(scope="module")
def behind(postgres_cluster: PgTestCluster) -> Iterator[tuple[ServerProcess, CommitCutProxy]]:
    """A server whose store connections go through a proxy that can black-hole them."""
    root = Path(tempfile.mkdtemp(prefix="tidings-pgconnect-"))
    url = fresh_database(postgres_cluster.url)
    proxy = CommitCutProxy(postgres_cluster.port)
    via_proxy = url.replace(f":{postgres_cluster.port}/", f":{proxy.port}/")
    env = {"TIDINGS_PG_CONNECT_TIMEOUT": str(CONNECT_TIMEOUT)}
    args = ["--store", via_proxy, "--lease-seconds", "30"]
    proc = LeadingServerProcess(root / "data", args, env).start()
    try:
        yield proc, proxy
    finally:
        proc.kill()
        proxy.close()
        shutil.rmtree(root, ignore_errors=True)


def test_a_write_while_postgresql_is_black_holed_is_a_503_within_the_connect_timeout(
    behind: tuple[ServerProcess, CommitCutProxy], topic: str
) -> None:
    proc, proxy = behind
    with httpx.Client(base_url=proc.url, timeout=60) as http:
        base = f"{NS}/topics/{topic}"
        assert http.put(base, json={}).status_code == 200
        proxy.blackhole.set()
        proxy.cut_all()
        try:
            # The first fails on the dead connection at once; the writer then opens
            # another, which the next waits for (twice: once more for its own group).
            for _ in range(2):
                began = time.monotonic()
                answer = http.post(base + "/publish", json={"messages": ["YQ=="]})
                took = time.monotonic() - began
                assert answer.status_code == 503, answer.text
                assert answer.json()["type"] == "StoreUnavailable"
                assert took < 2 * CONNECT_TIMEOUT + MARGIN, f"answered after {took:.1f} s"
        finally:
            proxy.restore()
        again = http.post(base + "/publish", json={"messages": ["Yg=="]})
        assert again.status_code == 200, again.text
        polled = http.post(base + "/poll", json={})
        assert [m["payload"] for m in polled.json()] == ["Yg=="]


def test_reads_come_back_at_once_after_a_black_holed_postgresql_does(
    postgres_cluster: PgTestCluster,
) -> None:
    proxy = CommitCutProxy(postgres_cluster.port)
    url = fresh_schema(postgres_cluster.url).replace(
        f":{postgres_cluster.port}/", f":{proxy.port}/"
    )
    store = PostgresStore(url, readers=2, connect_timeout=CONNECT_TIMEOUT, read_wait=1.0)
    try:
        store.apply(lambda view: view.put("messages", b"a", b"1"))
        proxy.blackhole.set()
        proxy.cut_all()
        # The pool's threads now try to open connections that are never answered.
        with pytest.raises(StoreUnavailable):
            store.get("messages", b"a")
        proxy.restore()
        deadline = time.monotonic() + CONNECT_TIMEOUT + MARGIN + 2
        while True:
            try:
                assert store.get("messages", b"a") == b"1"
                break
            except StoreUnavailable:
                assert time.monotonic() < deadline, "reads did not come back"
    finally:
        store.close()
        proxy.close()
