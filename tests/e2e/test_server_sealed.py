"""A write pointer's payloads, once published, cannot be added to or published again."""

from __future__ import annotations

import httpx
import pytest

from tests.e2e.serverproc import ServerProcess
from tidings import Client, PayloadsAlreadyPublished


def test_late_store_is_409_and_changes_nothing(server: ServerProcess, topic: str) -> None:
    with Client(server.url) as client:
        client.create_topic(topic)
        tx = client.begin()
        client.store(topic, [b"a", b"b"], write_pointer=tx.write_pointer)
        client.publish(topic, [], write_pointer=tx.write_pointer)
        client.commit(tx)
        base = f"{server.url}/v1/namespaces/default/topics/{topic}"
        late = {"transactionWritePointer": tx.write_pointer, "messages": ["bGF0ZQ=="]}
        answer = httpx.post(base + "/store", json=late)
        assert answer.status_code == 409
        assert answer.json()["type"] == "PayloadsAlreadyPublished"
        again = httpx.post(base + "/publish", json={"transactionWritePointer": tx.write_pointer})
        assert again.status_code == 409
        with pytest.raises(PayloadsAlreadyPublished):
            client.store(topic, [b"late"], write_pointer=tx.write_pointer)
        messages = client.poll(topic, transaction=client.snapshot())
        assert [m.payload for m in messages] == [b"a", b"b"]
