"""A real server whose LMDB map is full: a clear answer, and writes again once the
cleaner has made room."""

from __future__ import annotations

import base64
import time
from collections.abc import Callable

import httpx
import pytest

from tests.e2e.serverproc import ServerProcess

pytestmark = pytest.mark.slow

BIG = base64.b64encode(b"x" * 20_000).decode()


def _publish(client: httpx.Client) -> httpx.Response:
    body = {"transactionWritePointer": None, "messages": [BIG]}
    return client.post("/v1/namespaces/default/topics/t/publish", json=body)


def test_a_full_map_answers_503_store_full_and_recovers_with_retention(
    start_server: Callable[..., ServerProcess],
) -> None:
    srv = start_server(TIDINGS_MAP_SIZE="2MiB", TIDINGS_CLEANUP_INTERVAL="2")
    with httpx.Client(base_url=srv.url, timeout=10) as client:
        assert client.put("/v1/namespaces/default/topics/t", json={"ttl": 1}).status_code == 200
        for _ in range(300):  # 2 MiB holds fewer than 100 of them
            answer = _publish(client)
            if answer.status_code != 200:
                break
        assert answer.status_code == 503, answer.text
        assert answer.json()["type"] == "StoreFull"
        # Every message expires within a second, and the cleaner's first pass (2 s
        # after the start) deletes them all in one commit. The publishes after it must
        # find the room, although nothing else commits meanwhile.
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            stats = client.get("/v1/namespaces/default/topics/t/stats").json()
            if stats["messageCount"] == 0:
                break
            time.sleep(0.1)
        assert stats["messageCount"] == 0, stats
        for _ in range(3):
            answer = _publish(client)
            assert answer.status_code == 200, answer.text
    assert "Traceback" not in srv.log()
