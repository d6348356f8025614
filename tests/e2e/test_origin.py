"""A browser's write from another site is refused: any page can make the browser send
a "simple" POST (no preflight, no Content-Type) to 127.0.0.1, and the server would
carry it out. The ``Origin`` header browsers add tells such a request apart; clients
send none and are not affected.

Black box: a real server, requests as a browser would send them (raw httpx, with the
``Origin`` and ``Host`` a browser writes).
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterator

import httpx
import orjson
import pytest

from tests.e2e.serverproc import ServerProcess
from tidings import Client

pytestmark = pytest.mark.e2e

EVIL = "http://evil.example"
ALLOWED = "https://console.example"


@pytest.fixture
def api(server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=10) as client:
        yield client


@pytest.fixture
def client(server: ServerProcess) -> Iterator[Client]:
    with Client(server.url) as c:
        yield c


def _publish(api: httpx.Client, topic: str, origin: str | None, payload: bytes) -> httpx.Response:
    """A publish as ``fetch(url, {method: "POST", mode: "no-cors", body: blob})`` sends
    it: a body without a Content-Type, and the page's ``Origin``."""
    body = orjson.dumps({"messages": [base64.b64encode(payload).decode()]})
    headers = {} if origin is None else {"Origin": origin}
    return api.post(f"/v1/namespaces/default/topics/{topic}/publish", content=body, headers=headers)


def _payloads(client: Client, topic: str) -> list[bytes]:
    return [m.payload for m in client.poll(topic, limit=100)]


def _assert_refused(answer: httpx.Response) -> None:
    assert answer.status_code == 403, answer.text
    body = answer.json()
    assert body["type"] == "Forbidden"
    assert "cross-origin" in body["error"]


@pytest.mark.parametrize("origin", [EVIL, "null", "http://127.0.0.1"])
def test_a_publish_from_another_origin_is_refused_and_publishes_nothing(
    api: httpx.Client, client: Client, topic: str, origin: str
) -> None:
    client.create_topic(topic)
    _assert_refused(_publish(api, topic, origin, b"forged"))
    assert _payloads(client, topic) == []


def test_a_publish_from_the_servers_own_origin_works(
    server: ServerProcess, api: httpx.Client, client: Client, topic: str
) -> None:
    # The console's requests: the page is served by this server, so Origin is its URL.
    client.create_topic(topic)
    assert _publish(api, topic, server.url, b"own").status_code == 200
    assert _publish(api, topic, server.url.upper(), b"own-upper").status_code == 200
    assert _payloads(client, topic) == [b"own", b"own-upper"]


def test_a_publish_without_origin_works(api: httpx.Client, client: Client, topic: str) -> None:
    client.create_topic(topic)
    assert _publish(api, topic, None, b"plain").status_code == 200
    assert _payloads(client, topic) == [b"plain"]


def test_reads_from_another_origin_still_work(
    api: httpx.Client, client: Client, topic: str
) -> None:
    # The browser's same-origin policy keeps a read's answer from the other site's page.
    client.create_topic(topic)
    client.publish(topic, [b"m"])
    answer = api.get(f"/v1/namespaces/default/topics/{topic}", headers={"Origin": EVIL})
    assert answer.status_code == 200, answer.text


def test_deleting_a_topic_from_another_origin_is_refused(
    api: httpx.Client, client: Client, topic: str
) -> None:
    client.create_topic(topic)
    _assert_refused(api.delete(f"/v1/namespaces/default/topics/{topic}", headers={"Origin": EVIL}))
    assert topic in client.list_topics()


def test_an_allowed_origin_may_publish(
    start_server: Callable[..., ServerProcess], topic: str
) -> None:
    # A proxy that rewrites Host: the page's origin is not the Host the server sees.
    proc = start_server("--allowed-origins", ALLOWED + "/")
    with httpx.Client(base_url=proc.url, timeout=10) as api, Client(proc.url) as client:
        client.create_topic(topic)
        assert _publish(api, topic, ALLOWED, b"allowed").status_code == 200
        _assert_refused(_publish(api, topic, EVIL, b"forged"))
        _assert_refused(_publish(api, topic, "null", b"forged"))
        assert _payloads(client, topic) == [b"allowed"]
