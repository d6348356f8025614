"""Instances on one PostgreSQL database, black box: what a standby passes on to the
leader and back, and how the cluster copes with failures (real server processes, a
real PostgreSQL)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import fresh_database
from tests.e2e.serverproc import ServerProcess, readiness

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
