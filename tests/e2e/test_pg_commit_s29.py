"""A write whose ``COMMIT`` went to PostgreSQL and whose answer was lost, black box: a
server whose store connections pass through a proxy that cuts the writer's connection
right after (or instead of) passing on a publish's ``COMMIT``.

The server asks PostgreSQL how that transaction ended before it answers: committed is
a 200 (written once), not committed a 503 (written never, so a retry writes it once),
and only where it cannot find out within its connect timeout a 500 ``OutcomeUnknown``.
It was a 500 ``ServerError`` each time.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import PgTestCluster, fresh_database
from tests.e2e.pgproxy import CommitCutProxy
from tests.e2e.serverproc import LeadingServerProcess, ServerProcess
from tidings import Client
from tidings.errors import OutcomeUnknown

pytest.importorskip("psycopg")

pytestmark = pytest.mark.e2e

NS = "/v1/namespaces/default"
#: The server's connect timeout here (seconds): also how long it tries to learn a lost
#: commit's outcome.
CONNECT_TIMEOUT = 2


@pytest.fixture(scope="module")
def cut(postgres_cluster: PgTestCluster) -> Iterator[tuple[ServerProcess, CommitCutProxy]]:
    """A server whose store connections go through a :class:`CommitCutProxy`."""
    root = Path(tempfile.mkdtemp(prefix="tidings-pgcommit-"))
    url = fresh_database(postgres_cluster.url)
    proxy = CommitCutProxy(postgres_cluster.port)
    via_proxy = url.replace(f":{postgres_cluster.port}/", f":{proxy.port}/")
    env = {
        "TIDINGS_PG_CONNECT_TIMEOUT": str(CONNECT_TIMEOUT),
        # No write of the cleaner's in the middle of a test.
        "TIDINGS_CLEANUP_INTERVAL": "3600",
    }
    # A long lease: the writer's connection is cut, the lease's are not.
    args = ["--store", via_proxy, "--lease-seconds", "30"]
    proc = LeadingServerProcess(root / "data", args, env).start()
    try:
        yield proc, proxy
    finally:
        proc.kill()
        proxy.close()
        shutil.rmtree(root, ignore_errors=True)


def _payloads(http: httpx.Client, topic: str) -> list[str]:
    polled = http.post(f"{NS}/topics/{topic}/poll", json={})
    assert polled.status_code == 200, polled.text
    return [m["payload"] for m in polled.json()]


def test_a_commit_that_committed_is_acknowledged_though_its_answer_was_lost(
    cut: tuple[ServerProcess, CommitCutProxy], topic: str
) -> None:
    proc, proxy = cut
    with httpx.Client(base_url=proc.url, timeout=30) as http:
        assert http.put(f"{NS}/topics/{topic}", json={}).status_code == 200
        proxy.arm(forward=True)
        # A plain publish: no producer, so a client could not safely send it again.
        answer = http.post(f"{NS}/topics/{topic}/publish", json={"messages": ["YQ=="]})
        assert proxy.cut.is_set()
        assert answer.status_code == 200, answer.text
        assert _payloads(http, topic) == ["YQ=="]
        # The writer goes on, on its new connection.
        again = http.post(f"{NS}/topics/{topic}/publish", json={"messages": ["Yg=="]})
        assert again.status_code == 200, again.text
        assert _payloads(http, topic) == ["YQ==", "Yg=="]


def test_a_commit_that_never_reached_postgresql_is_a_503_and_nothing_was_written(
    cut: tuple[ServerProcess, CommitCutProxy], topic: str
) -> None:
    # PostgreSQL's session still held the transaction open: the server ends it, and
    # then knows it did not commit.
    proc, proxy = cut
    with httpx.Client(base_url=proc.url, timeout=30) as http:
        assert http.put(f"{NS}/topics/{topic}", json={}).status_code == 200
        proxy.arm(forward=False)
        answer = http.post(f"{NS}/topics/{topic}/publish", json={"messages": ["YQ=="]})
        assert proxy.cut.is_set()
        assert answer.status_code == 503, answer.text
        body = answer.json()
        assert body["type"] == "StoreUnavailable" and "nothing was written" in body["error"]
        assert _payloads(http, topic) == []
    # The client retries a 503 (an idempotent publish): written once.
    proxy.arm(forward=False)
    with Client(proc.url) as client:
        client.publish(topic, [b"b"])
    assert proxy.cut.is_set()
    with httpx.Client(base_url=proc.url, timeout=30) as http:
        assert _payloads(http, topic) == ["Yg=="]


def test_a_commit_whose_outcome_postgresql_cannot_tell_in_time_is_outcome_unknown(
    cut: tuple[ServerProcess, CommitCutProxy], topic: str
) -> None:
    proc, proxy = cut
    with httpx.Client(base_url=proc.url, timeout=30) as http:
        assert http.put(f"{NS}/topics/{topic}", json={}).status_code == 200
    proxy.arm(forward=True, blackhole=True)
    try:
        began = time.monotonic()
        # Not idempotent: the client must not send it again blindly, and does not.
        with Client(proc.url, idempotent=False) as client, pytest.raises(OutcomeUnknown) as caught:
            client.publish(topic, [b"a"])
        took = time.monotonic() - began
        assert proxy.cut.is_set()
        assert "may or may not" in str(caught.value) and caught.value.status == 500
        assert took < CONNECT_TIMEOUT + 5, f"the answer took {took:.1f} s"
    finally:
        proxy.restore()
    with httpx.Client(base_url=proc.url, timeout=30) as http:
        # It had committed: once, and the store takes writes again.
        assert _payloads(http, topic) == ["YQ=="]
        again = http.post(f"{NS}/topics/{topic}/publish", json={"messages": ["Yg=="]})
        assert again.status_code == 200, again.text
