"""A wait longer than any socket timeout can hold is capped in the client (the server
caps it at its ``max_wait_ms`` anyway), not an OverflowError."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from tests.e2e.serverproc import ServerProcess
from tidings import Client

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    proc = ServerProcess(
        tmp_path_factory.mktemp("waits") / "data", env={"TIDINGS_MAX_WAIT_MS": "300"}
    ).start()
    try:
        with Client(proc.url) as client:
            client.create_topic("t")
        yield proc
    finally:
        proc.kill()


def test_a_huge_wait_is_capped_by_the_server(server: ServerProcess) -> None:
    with Client(server.url, timeout=10) as client:
        started = time.monotonic()
        assert client.poll("t", wait=1e30) == []
        with client.consume("t", group="g", wait=1e30, partitions=1) as member:
            assert member.poll() == []
        with client.queue("t", "q") as queue:
            assert queue.pop(wait=1e30) == []
        assert time.monotonic() - started < 8
