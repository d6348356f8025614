"""Topic administration through a real server: every endpoint and status of seed 000."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.e2e.serverproc import ServerProcess

pytestmark = pytest.mark.e2e

NS = "/v1/namespaces/topics-ns"


@pytest.fixture
def api(server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=10) as client:
        yield client


def test_create_get_list_update_delete(api: httpx.Client, topic: str) -> None:
    r = api.put(f"{NS}/topics/{topic}", json={"ttl": 3600, "owner": "team-a"})
    assert r.status_code == 200, r.text
    assert r.json() == {
        "name": topic,
        "properties": {"ttl": "3600", "owner": "team-a"},
        "generation": 1,
    }
    assert api.get(f"{NS}/topics/{topic}").json() == r.json()
    assert topic in api.get(f"{NS}/topics").json()

    r = api.put(f"{NS}/topics/{topic}/properties", json={"ttl": "60"})
    assert r.status_code == 200, r.text
    # An update replaces all properties.
    assert r.json()["properties"] == {"ttl": "60"}
    assert api.get(f"{NS}/topics/{topic}").json()["properties"] == {"ttl": "60"}

    r = api.delete(f"{NS}/topics/{topic}")
    assert (r.status_code, r.json()) == (200, {})
    assert api.get(f"{NS}/topics/{topic}").status_code == 404
    assert topic not in api.get(f"{NS}/topics").json()


def test_create_with_empty_body_uses_default_ttl(api: httpx.Client, topic: str) -> None:
    r = api.put(f"{NS}/topics/{topic}")
    assert r.status_code == 200, r.text
    assert r.json()["properties"] == {"ttl": str(7 * 24 * 3600)}


def test_recreate_bumps_generation(api: httpx.Client, topic: str) -> None:
    assert api.put(f"{NS}/topics/{topic}").json()["generation"] == 1
    api.delete(f"{NS}/topics/{topic}")
    assert api.put(f"{NS}/topics/{topic}").json()["generation"] == 2


def test_list_is_sorted_and_per_namespace(api: httpx.Client) -> None:
    ns = "/v1/namespaces/list-ns"
    for name in ("b", "c", "a"):
        api.put(f"{ns}/topics/{name}")
    assert api.get(f"{ns}/topics").json() == ["a", "b", "c"]
    assert api.get("/v1/namespaces/empty-ns/topics").json() == []


def test_create_existing_is_409(api: httpx.Client, topic: str) -> None:
    api.put(f"{NS}/topics/{topic}")
    r = api.put(f"{NS}/topics/{topic}")
    assert r.status_code == 409
    assert r.json()["type"] == "TopicAlreadyExists"


@pytest.mark.parametrize(
    "body",
    [
        {"ttl": 0},
        {"ttl": -5},
        {"ttl": "abc"},
        {"ttl": 1.5},
        {"ttl": True},
        {"ttl": None},
        {"x": [1]},
        {"x": {"y": 1}},
    ],
)
def test_invalid_properties_are_400(api: httpx.Client, topic: str, body: object) -> None:
    r = api.put(f"{NS}/topics/{topic}", json=body)
    assert r.status_code == 400, r.text
    assert r.json()["type"] == "InvalidProperties"
    assert api.get(f"{NS}/topics/{topic}").status_code == 404


@pytest.mark.parametrize("raw", [b"[1,2]", b"{not json", b'"ttl"', b"\xff\xfe"])
def test_malformed_properties_are_400(api: httpx.Client, topic: str, raw: bytes) -> None:
    r = api.put(f"{NS}/topics/{topic}", content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    assert set(r.json()) == {"error", "type"}


def test_update_errors(api: httpx.Client, topic: str) -> None:
    assert api.put(f"{NS}/topics/{topic}/properties", json={"ttl": 5}).status_code == 404
    api.put(f"{NS}/topics/{topic}")
    assert api.put(f"{NS}/topics/{topic}/properties", json={"ttl": 0}).status_code == 400
    assert api.get(f"{NS}/topics/{topic}").json()["properties"]["ttl"] == str(7 * 24 * 3600)


def test_unknown_topic_is_404(api: httpx.Client, topic: str) -> None:
    for method, path in [
        ("GET", f"{NS}/topics/{topic}"),
        ("DELETE", f"{NS}/topics/{topic}"),
        ("GET", f"{NS}/topics/{topic}/stats"),
    ]:
        r = api.request(method, path)
        assert r.status_code == 404, (method, path)
        assert r.json()["type"] == "TopicNotFound"


@pytest.mark.parametrize("name", ["a.b", "x" * 129, "sp ace", "é"])
def test_invalid_names_are_400(api: httpx.Client, name: str) -> None:
    assert api.put(f"{NS}/topics/{name}").status_code == 400
    r = api.get(f"/v1/namespaces/{name}/topics")
    assert r.status_code == 400
    assert r.json()["type"] == "InvalidName"


def test_admin_speaks_json_only(api: httpx.Client, topic: str) -> None:
    r = api.put(f"{NS}/topics/{topic}", content=b"", headers={"content-type": "avro/binary"})
    assert r.status_code == 415
    assert r.json()["type"] == "UnsupportedMediaType"


def test_stats(api: httpx.Client, topic: str) -> None:
    api.put(f"{NS}/topics/{topic}")
    r = api.get(f"{NS}/topics/{topic}/stats")
    assert r.status_code == 200
    empty = r.json()
    assert empty["messageCount"] == 0 and empty["oldestId"] is None
    api.post(f"{NS}/topics/{topic}/publish", json={"messages": ["YWJj", "ZGVmZw=="]})
    api.post(f"{NS}/topics/{topic}/poll", json={})
    stats = api.get(f"{NS}/topics/{topic}/stats").json()
    assert stats["namespace"] == "topics-ns" and stats["topic"] == topic
    assert stats["messageCount"] == 2
    assert stats["bytes"] == 7
    assert len(stats["oldestId"]) == 40 and stats["oldestId"] < stats["newestId"]
    assert stats["oldestTime"] <= stats["newestTime"]
    assert stats["messagesPublished"] == 2 and stats["bytesPublished"] == 7
    assert stats["fetches"] == 1
    assert stats["publishRate"] > 0 and stats["fetchRate"] > 0


def test_unknown_path_and_method(api: httpx.Client, topic: str) -> None:
    r = api.get("/v1/nothing-here")
    assert r.status_code == 404 and r.json()["type"] == "NotFound"
    r = api.post(f"{NS}/topics/{topic}")
    assert r.status_code == 405
    assert "error" in r.json()
    assert "PUT" in r.headers["allow"]


def test_head_changes_nothing(api: httpx.Client, topic: str) -> None:
    assert api.head(f"{NS}/topics/{topic}").status_code == 404
    assert api.get(f"{NS}/topics/{topic}").status_code == 404
    api.put(f"{NS}/topics/{topic}")
    assert api.head(f"{NS}/topics/{topic}").status_code == 200
    before = api.get("/v1/transactions").json()["lastWritePointer"]
    assert api.head("/v1/transactions").status_code == 200
    assert api.get("/v1/transactions").json()["lastWritePointer"] == before
