"""Consumer groups at their edges, through the real server and clients: a member back
after its session ran out, a closed member, and the like."""

from __future__ import annotations

import time

import httpx
import pytest

from tests.e2e.serverproc import ServerProcess
from tidings import Client
from tidings.structs import Record

pytestmark = pytest.mark.e2e


def _fill(client: Client, topic: str, n: int = 20, keys: int = 5) -> None:
    client.create_topic(topic)
    client.publish(topic, [Record(b"v%d" % i, b"k%d" % (i % keys)) for i in range(n)])


def test_a_member_rejoining_with_its_id_after_its_session_ran_out_owns_partitions_again(
    server: ServerProcess, topic: str
) -> None:
    with Client(server.url) as client:
        _fill(client, topic)
    url = f"{server.url}/v1/namespaces/default/topics/{topic}/groups/g"
    with httpx.Client(timeout=10) as http:
        first = http.post(url + "/join", json={"sessionTimeoutMs": 100, "partitions": 4}).json()
        member = first["memberId"]
        assert first["partitions"] == [0, 1, 2, 3]
        time.sleep(0.3)  # past its session; no call on the group dropped it yet
        again = http.post(url + "/join", json={"memberId": member, "sessionTimeoutMs": 10_000})
        assert again.status_code == 200
        # Coming back is a rebalance, and the member alone owns every partition.
        assert again.json()["partitions"] == [0, 1, 2, 3]
        assert again.json()["generation"] > first["generation"]
        described = http.get(url).json()
        assert [p["owner"] for p in described["partitions"]] == [member] * 4
        polled = http.post(url + "/poll", json={"memberId": member, "limit": 100})
        assert polled.status_code == 200 and polled.headers["Tidings-Count"] == "20"
        http.post(url + "/leave", json={"memberId": member})
