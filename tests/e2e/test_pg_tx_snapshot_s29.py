"""A snapshot of the transaction log kept in PostgreSQL, taken while the log's writes
are slow, black box: the requests that take the transaction manager's lock on the
event loop (a begin, a commit) must not stall it, so ``/healthz`` still answers.

The snapshot's rotation waited, holding that lock, for every log record written so
far to be committed in PostgreSQL; a begin arriving meanwhile waited for the lock on
the event loop, and every request of the process with it. The log's writes are held
up here by an ``EXCLUSIVE`` lock on ``tidings_tx`` (reads go on, writes wait).
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import fresh_database
from tests.e2e.serverproc import LeadingServerProcess, ServerProcess

psycopg = pytest.importorskip("psycopg")

pytestmark = pytest.mark.e2e

#: Longest /healthz may take while the log's writes wait (it takes milliseconds).
PROMPT = 2.0


@pytest.fixture(scope="module")
def pg(postgres_url: str) -> Iterator[tuple[ServerProcess, str]]:
    """A server that snapshots its transaction log after every record or two."""
    root = Path(tempfile.mkdtemp(prefix="tidings-pgsnap-"))
    url = fresh_database(postgres_url)
    env = {"TIDINGS_TX_SNAPSHOT_EVERY": "1"}
    proc = LeadingServerProcess(root / "data", ["--store", url], env).start()
    try:
        yield proc, url
    finally:
        proc.kill()
        shutil.rmtree(root, ignore_errors=True)


def _waiting(url: str) -> int:
    """Sessions waiting for a lock on the transaction log's table."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = 'tidings_tx'::regclass"
        ).fetchone()
    assert row is not None
    return int(row[0])


def test_a_begin_during_a_slow_snapshot_does_not_stall_the_server(
    pg: tuple[ServerProcess, str],
) -> None:
    proc, url = pg
    answers: list[int] = []

    def begin() -> None:
        with httpx.Client(base_url=proc.url, timeout=60) as own:
            answers.append(own.post("/v1/transactions", json={}).status_code)

    with httpx.Client(base_url=proc.url, timeout=30) as client:
        assert client.post("/v1/transactions", json={}).status_code == 200
        lock = psycopg.connect(url)
        first = threading.Thread(target=begin)
        second = threading.Thread(target=begin)
        try:
            lock.execute("SET lock_timeout = '10s'")
            lock.execute("LOCK TABLE tidings_tx IN EXCLUSIVE MODE")
            # Its record waits for the lock, and the snapshot it makes due waits for it.
            first.start()
            deadline = time.monotonic() + 10
            while _waiting(url) == 0:
                assert time.monotonic() < deadline, "the begin never wrote its record"
                time.sleep(0.05)
            time.sleep(0.5)  # the snapshot's rotation under way
            second.start()  # takes the manager's lock on the event loop
            time.sleep(0.5)
            began = time.monotonic()
            try:
                answer = client.get("/healthz", timeout=3 * PROMPT)
            except httpx.TimeoutException:
                pytest.fail("/healthz did not answer while the log's writes waited")
            took = time.monotonic() - began
            assert answer.status_code == 200, answer.text
            assert took < PROMPT, f"/healthz took {took:.2f} s while a snapshot waited"
        finally:
            lock.rollback()
            lock.close()
            first.join(30)
            second.join(30)
    assert answers == [200, 200]
    # The snapshot went through: later calls still work.
    with httpx.Client(base_url=proc.url, timeout=30) as client:
        assert client.post("/v1/transactions", json={}).status_code == 200
        assert client.get("/v1/transactions").status_code == 200
