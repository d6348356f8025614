"""Every poll answer says the generation of the topic its page was read from
(``Tidings-Topic-Generation``), so a reader can tell a topic deleted and created again
under the same name from the one it was reading without a request of its own."""

from __future__ import annotations

import uuid

import httpx
import pytest

from tests.e2e.serverproc import ServerProcess
from tidings import Client
from tidings.codec.columns import CONTENT_TYPE as COLUMNS_TYPE

pytestmark = pytest.mark.e2e

NS = "poll-generation"


def _headers(server: ServerProcess, topic: str, query: str, accept: str | None) -> httpx.Headers:
    url = f"{server.url}/v1/namespaces/{NS}/topics/{topic}/poll{query}"
    headers = {"Accept": accept} if accept else {}
    answer = httpx.post(url, json={"limit": 10}, headers=headers, timeout=10)
    assert answer.status_code == 200, answer.text
    return answer.headers


def test_a_poll_answers_the_generation_it_read(store_server: ServerProcess) -> None:
    topic = "g-" + uuid.uuid4().hex[:10]
    kinds = [
        ("", None),
        ("?fields=id", None),
        ("?isolation=read_committed", None),
        ("", COLUMNS_TYPE),
        ("?waitMs=1", None),
    ]
    with Client(store_server.url, NS) as client:
        client.create_topic(topic)
        client.publish(topic, [b"a", b"b"])
        for query, accept in kinds:
            assert _headers(store_server, topic, query, accept)["tidings-topic-generation"] == "1"
        page = client._send(
            client._api.poll_page(
                topic, None, inclusive=True, limit=10, transaction=None, wait=None
            )
        )
        assert page.generation == 1 and page.count == 2
        client.delete_topic(topic)
        client.create_topic(topic)  # created again, and empty: the header still says so
        for query, accept in kinds:
            assert _headers(store_server, topic, query, accept)["tidings-topic-generation"] == "2"
        ids = client._send(
            client._api.poll_ids_page(topic, None, inclusive=True, limit=10, transaction=None)
        )
        assert ids.ids == [] and ids.generation == 2
        client.delete_topic(topic)
        missing = httpx.post(
            f"{store_server.url}/v1/namespaces/{NS}/topics/{topic}/poll", json={}, timeout=10
        )
        assert missing.status_code == 404 and "error" in missing.json()
        assert "tidings-topic-generation" not in missing.headers
