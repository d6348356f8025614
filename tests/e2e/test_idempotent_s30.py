"""Idempotent producers: regressions found by the model in
test_idempotent_model_s30.py, as plain tests."""

from __future__ import annotations

import httpx
import pytest

from tests.e2e.serverproc import ServerProcess
from tidings import Client

pytestmark = pytest.mark.e2e


def test_a_one_request_transaction_with_producer_headers_is_refused(
    server: ServerProcess, topic: str
) -> None:
    # A transaction in one request is not deduplicated by producer sequence (sent
    # twice, it commits twice), so the headers would promise what the server does
    # not do: refused, as on a store, and nothing is begun or published.
    url = f"{server.url}/v1/namespaces/default/transactions/publish"
    body = {"topics": [{"topic": topic, "messages": ["eA=="]}]}
    producer = {"Tidings-Producer-Id": "3d" * 16, "Tidings-Sequence": "0"}
    with Client(server.url) as client:
        client.create_topic(topic)
        before = client.transactions()
        for headers in (producer, {"Tidings-Sequence": "0"}, {"Tidings-Producer-Id": "3d" * 16}):
            refused = httpx.post(url, json=body, headers=headers)
            assert refused.status_code == 400, (headers, refused.text)
            assert refused.json()["type"] == "BadRequest"
            assert "Tidings-Producer-Id" in refused.json()["error"]
        assert client.poll(topic) == []
        assert client.transactions().last_write_pointer == before.last_write_pointer
        taken = httpx.post(url, json={"topics": [{"topic": topic, "messages": ["eQ=="]}]})
        assert taken.status_code == 200, taken.text
        assert [m.payload for m in client.poll(topic)] == [b"y"]
