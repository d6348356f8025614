"""Publish, store, rollback and poll through a real server, in every media type."""

from __future__ import annotations

import base64
import itertools
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest

from tests.e2e.serverproc import ServerProcess
from tidings import Client
from tidings.codec import avro, payload_frames, wire
from tidings.codec.payload_frames import CONTENT_TYPE
from tidings.codec.wire import AVRO, AVRO_EXT, JSON, ConsumeRequest, Media
from tidings.structs import Message, MessageId, Record, RollbackInfo

pytestmark = pytest.mark.e2e

NS = "/v1/namespaces/msg-ns"
MEDIA = [JSON, AVRO, AVRO_EXT]


@pytest.fixture
def api(server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=10) as client:
        yield client


@pytest.fixture
def live(api: httpx.Client, topic: str) -> str:
    assert api.put(f"{NS}/topics/{topic}").status_code == 200
    return f"{NS}/topics/{topic}"


def post(
    api: httpx.Client, path: str, body: bytes, media: Media, params: dict[str, int] | None = None
) -> httpx.Response:
    return api.post(path, content=body, headers={"content-type": media.value}, params=params)


def publish(
    api: httpx.Client,
    path: str,
    payloads: list[bytes],
    media: Media = JSON,
    write_pointer: int | None = None,
) -> httpx.Response:
    records = [Record(p) for p in payloads]
    return post(
        api, path + "/publish", wire.encode_publish_request(write_pointer, records, media), media
    )


def poll(
    api: httpx.Client, path: str, media: Media = JSON, req: ConsumeRequest | None = None
) -> list[Message]:
    r = post(
        api, path + "/poll", wire.encode_consume_request(req or ConsumeRequest(), media), media
    )
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == media.value
    return wire.decode_messages(r.content, media)


@pytest.mark.parametrize("media", MEDIA, ids=lambda m: m.value)
def test_publish_and_poll(api: httpx.Client, live: str, media: Media) -> None:
    r = publish(api, live, [b"one", b"two"], media)
    assert (r.status_code, r.content) == (200, b"")
    # Seed 000's empty answer: no JSON (or Avro) document, so not labelled as one.
    assert r.headers["content-type"] == "application/octet-stream"
    publish(api, live, [b"three"], media)
    messages = poll(api, live, media)
    assert [m.payload for m in messages] == [b"one", b"two", b"three"]
    assert [m.id for m in messages] == sorted(m.id for m in messages)
    # From an id, exclusive; limit.
    after = poll(api, live, media, ConsumeRequest(messages[0].id, False, 1))
    assert [m.payload for m in after] == [b"two"]
    again = poll(api, live, media, ConsumeRequest(messages[1].id, True, None))
    assert [m.payload for m in again] == [b"two", b"three"]
    # From a timestamp (ms).
    by_time = poll(api, live, media, ConsumeRequest(messages[0].id.publish_ts, True, 10))
    assert by_time == messages


def test_json_poll_shape(api: httpx.Client, live: str) -> None:
    publish(api, live, [b"\x00\xffbinary"])
    r = api.post(live + "/poll")  # no body, no content type: JSON, from the oldest
    assert r.status_code == 200
    [item] = r.json()
    assert set(item) == {"id", "payload", "key", "headers"}
    assert base64.b64decode(item["payload"]) == b"\x00\xffbinary"
    assert len(base64.b64decode(item["id"])) == 20
    assert item["key"] is None and item["headers"] == {}


def test_seed_only_avro_client(api: httpx.Client, live: str) -> None:
    """A client that knows only seed 000's schemas decodes the plain Avro answer."""
    publish(api, live, [b"x"], AVRO)
    r = post(api, live + "/poll", b"", AVRO)
    [msg] = avro.read(r.content, avro.MESSAGES, "poll response")
    assert set(msg) == {"id", "payload"} and msg["payload"] == b"x"


@pytest.mark.parametrize("media", [JSON, AVRO_EXT], ids=lambda m: m.value)
def test_keys_headers_and_ttl(api: httpx.Client, live: str, media: Media) -> None:
    records = [
        Record(b"a", key=b"k1", headers={"h": b"v", "trace": b"\x01"}),
        Record(b"b"),
        Record(b"c", ttl=3600),
    ]
    body = wire.encode_publish_request(None, records, media)
    assert post(api, live + "/publish", body, media).status_code == 200
    got = poll(api, live, media)
    assert [(m.payload, m.key, dict(m.headers)) for m in got] == [
        (b"a", b"k1", {"h": b"v", "trace": b"\x01"}),
        (b"b", None, {}),
        (b"c", None, {}),
    ]


@pytest.mark.parametrize("media", MEDIA, ids=lambda m: m.value)
def test_transactional_publish_and_rollback(api: httpx.Client, live: str, media: Media) -> None:
    tx = api.post("/v1/transactions").json()
    r = publish(api, live, [b"t1", b"t2"], media, tx["writePointer"])
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == media.value
    info = wire.decode_rollback_info(r.content, media)
    assert info.write_pointer == tx["writePointer"]
    assert (info.start_ts, info.start_seq) <= (info.end_ts, info.end_seq)

    # A transactional reader that began before the commit does not see it.
    reader = api.post("/v1/transactions").json()
    encoded = base64.b64decode(reader["encoded"])
    assert poll(api, live, media, ConsumeRequest(transaction=encoded)) == []
    # A non-transactional reader sees it.
    assert [m.payload for m in poll(api, live, media)] == [b"t1", b"t2"]

    # Roll back with the response body exactly as received.
    r = post(api, live + "/rollback", r.content, media)
    assert r.status_code == 200, r.text
    if media is JSON:
        assert r.json() == {"rolledBack": 2}  # one entry per message
    else:
        assert r.content == b""
    assert api.post(f"/v1/transactions/{tx['writePointer']}/abort").status_code == 200
    # Rolled-back entries stay visible to non-transactional readers (seed 000) only.
    assert [m.payload for m in poll(api, live, media)] == [b"t1", b"t2"]
    later = base64.b64decode(api.post("/v1/transactions").json()["encoded"])
    assert poll(api, live, media, ConsumeRequest(transaction=later)) == []


@pytest.mark.parametrize("media", MEDIA, ids=lambda m: m.value)
def test_store_then_publish(api: httpx.Client, live: str, media: Media) -> None:
    tx = api.post("/v1/transactions").json()
    wp = tx["writePointer"]
    for chunk in ([b"p1", b"p2"], [b"p3"]):
        body = wire.encode_publish_request(wp, [Record(p) for p in chunk], media)
        r = post(api, live + "/store", body, media)
        assert (r.status_code, r.content) == (200, b""), r.text
    assert poll(api, live, media) == []  # stored payloads are not published yet
    r = publish(api, live, [], media, wp)
    assert r.status_code == 200, r.text
    assert api.post(f"/v1/transactions/{wp}/commit", json={}).status_code == 200
    snapshot = base64.b64decode(api.post("/v1/transactions").json()["encoded"])
    got = poll(api, live, media, ConsumeRequest(transaction=snapshot))
    assert [m.payload for m in got] == [b"p1", b"p2", b"p3"]
    assert len({m.id for m in got}) == 3


def test_store_without_write_pointer_is_400(api: httpx.Client, live: str) -> None:
    r = api.post(live + "/store", json={"messages": ["YQ=="]})
    assert r.status_code == 400


def test_empty_publish_is_400(api: httpx.Client, live: str) -> None:
    for media in MEDIA:
        r = post(api, live + "/publish", wire.encode_publish_request(None, [], media), media)
        assert r.status_code == 400
        assert r.json()["type"] == "EmptyPublish"


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/publish", b"{"),
        ("/publish", b"[]"),
        ("/publish", b'{"messages": "abc"}'),
        ("/publish", b'{"messages": ["not base64!"]}'),
        ("/publish", b'{"messages": [12]}'),
        ("/publish", b'{"messages": ["YQ=="], "transactionWritePointer": "7"}'),
        ("/publish", b'{"messages": ["YQ=="], "transactionWritePointer": 1e40}'),
        ("/publish", b'{"messages": ["YQ=="], "extras": [{"key": 5}]}'),
        ("/publish", b'{"messages": ["YQ=="], "extras": []}'),
        ("/publish", b'{"messages": ["YQ=="], "extras": [{"ttl": 0}]}'),
        ("/publish", b'{"messages": ["YQ=="], "extras": [{"headers": {"a": 1}}]}'),
        ("/store", b'{"messages": ["YQ=="], "transactionWritePointer": true}'),
        ("/poll", b'{"startFrom": "AAAA"}'),
        ("/poll", b'{"startFrom": -1}'),
        ("/poll", b'{"startFrom": 1.5}'),
        ("/poll", b'{"limit": 0}'),
        ("/poll", b'{"limit": "10"}'),
        ("/poll", b'{"inclusive": "yes"}'),
        ("/poll", b'{"transaction": "AAAA"}'),
        ("/poll", b'{"transaction": 17}'),
        ("/rollback", b"{}"),
        ("/rollback", b'{"transactionWritePointer": 1, "startTimestamp": "x"}'),
    ],
)
def test_bad_json_bodies_are_400_and_change_nothing(
    api: httpx.Client, live: str, path: str, body: bytes
) -> None:
    r = post(api, live + path, body, JSON)
    assert r.status_code == 400, r.text
    assert set(r.json()) == {"error", "type"}
    assert poll(api, live) == []


@pytest.mark.parametrize("media", [AVRO, AVRO_EXT], ids=lambda m: m.value)
@pytest.mark.parametrize("path", ["/publish", "/store", "/poll", "/rollback"])
@pytest.mark.parametrize("body", [b"\xff", b"\x02\x01", b"\x01" * 64])
def test_bad_avro_bodies_are_400(
    api: httpx.Client, live: str, media: Media, path: str, body: bytes
) -> None:
    r = post(api, live + path, body, media)
    assert r.status_code == 400, r.text
    assert poll(api, live) == []


def frames(
    api: httpx.Client, path: str, payloads: list[bytes], write_pointer: int | None = None
) -> httpx.Response:
    body = payload_frames.write_frames(write_pointer, payloads)
    return api.post(path, content=body, headers={"content-type": payload_frames.CONTENT_TYPE})


def test_publish_and_store_in_the_payloads_medium(api: httpx.Client, live: str) -> None:
    r = frames(api, live + "/publish", [b"one", b"", b"three"])
    assert (r.status_code, r.content) == (200, b""), r.text
    assert frames(api, live + "/publish", [b"four"]).status_code == 200
    assert [m.payload for m in poll(api, live)] == [b"one", b"", b"three", b"four"]
    # With a write pointer: answered in JSON, as the request has no answers of its own.
    wp = api.post("/v1/transactions").json()["writePointer"]
    r = frames(api, live + "/publish", [b"t1", b"t2"], wp)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/json"
    assert wire.decode_rollback_info(r.content, JSON).write_pointer == wp
    # A store, then the pointer publish of what it stored.
    stored_wp = api.post("/v1/transactions").json()["writePointer"]
    r = frames(api, live + "/store", [b"s1", b"s2"], stored_wp)
    assert (r.status_code, r.content) == (200, b""), r.text
    assert wire.parse_payload_range(r.headers["tidings-payload-range"]) is not None
    assert frames(api, live + "/publish", [], stored_wp).status_code == 200
    for pointer in (wp, stored_wp):
        assert api.post(f"/v1/transactions/{pointer}/commit", json={}).status_code == 200
    assert [m.payload for m in poll(api, live)][4:] == [b"t1", b"t2", b"s1", b"s2"]
    # With keys (a keys column), read back with them.
    keyed = [Record(b"k1", b"a"), Record(b"k2", b""), b"k3"]
    r = api.post(
        live + "/publish",
        content=payload_frames.write_frames(None, keyed),
        headers={"content-type": CONTENT_TYPE},
    )
    assert r.status_code == 200, r.text
    got = poll(api, live, AVRO_EXT)[-3:]
    assert [(m.payload, m.key) for m in got] == [(b"k1", b"a"), (b"k2", b""), (b"k3", None)]


def test_bad_payloads_bodies_are_400_and_change_nothing(api: httpx.Client, live: str) -> None:
    good = payload_frames.write_frames(None, [b"a", b"bc"])
    keyed = payload_frames.write_frames(None, [Record(b"a", b"k"), b"b"])
    at = keyed.index(b"\x01\x00", 20 + 24)  # the presence bytes, after both columns
    bad_bodies = [
        keyed[:at] + b"\x02" + keyed[at + 1 :],  # a presence byte of 2
        b"",  # no head
        b"TDC1" + good[4:],  # another magic
        good[:-1],  # the last position past the body's end
        good + b"x",  # a byte after the last payload
        good[:8] + b"\x01" + good[9:],  # a flag set: none is defined yet
        good[:12] + (-1).to_bytes(8, "little", signed=True) + good[20:],  # a negative pointer
        good[:4] + (10**6).to_bytes(4, "little") + good[8:],  # more payloads than bytes
    ]
    for path in ("/publish", "/store"):
        for body in bad_bodies:
            r = api.post(live + path, content=body, headers={"content-type": CONTENT_TYPE})
            assert r.status_code == 400, (path, body, r.text)
            assert set(r.json()) == {"error", "type"}
    r = frames(api, live + "/publish", [])
    assert (r.status_code, r.json()["type"]) == (400, "EmptyPublish")
    r = frames(api, live + "/store", [b"a"])
    assert r.status_code == 400 and "write" in r.json()["error"].lower()
    assert poll(api, live) == []
    # Of a topic's endpoints only a publish and a store take it.
    for path in ("/poll", "/rollback"):
        r = api.post(live + path, content=good, headers={"content-type": CONTENT_TYPE})
        assert (r.status_code, r.json()["type"]) == (415, "UnsupportedMediaType")


def test_unknown_topic_is_404(api: httpx.Client, topic: str) -> None:
    path = f"{NS}/topics/{topic}"
    assert publish(api, path, [b"x"]).status_code == 404
    r = api.post(path + "/store", json={"messages": ["YQ=="], "transactionWritePointer": 5})
    assert r.status_code == 404
    assert api.post(path + "/poll", json={}).status_code == 404
    info = RollbackInfo(5, 1, 0, 1, 0)
    r = post(api, path + "/rollback", wire.encode_rollback_info(info, JSON), JSON)
    assert r.status_code == 404
    assert r.json()["type"] == "TopicNotFound"


def test_wrong_content_type_is_415(api: httpx.Client, live: str) -> None:
    for path in ("/publish", "/store", "/rollback", "/poll"):
        r = api.post(live + path, content=b"{}", headers={"content-type": "text/plain"})
        assert r.status_code == 415
        assert r.json()["type"] == "UnsupportedMediaType"


def test_invalid_names_are_400(api: httpx.Client) -> None:
    r = api.post(f"{NS}/topics/bad.name/publish", json={"messages": ["YQ=="]})
    assert r.status_code == 400 and r.json()["type"] == "InvalidName"


def test_limit_is_clamped(api: httpx.Client, live: str) -> None:
    api.post(live + "/publish", json={"messages": ["YQ=="] * 3})
    r = api.post(live + "/poll", json={"limit": 2**31 - 1})
    assert len(r.json()) == 3


def test_big_message_id_round_trip(api: httpx.Client, live: str) -> None:
    publish(api, live, [b"x"])
    [m] = poll(api, live)
    raw = api.post(live + "/poll", json={"startFrom": base64.b64encode(m.id.to_bytes()).decode()})
    assert [MessageId.from_bytes(base64.b64decode(i["id"])) for i in raw.json()] == [m.id]


def test_body_too_large_is_413(start_server: object, tmp_path: object) -> None:
    srv = start_server(TIDINGS_MAX_BODY_BYTES="1KiB")  # type: ignore[operator]
    with httpx.Client(base_url=srv.url, timeout=10) as api:
        api.put(f"{NS}/topics/big")
        small = orjson.dumps({"messages": [base64.b64encode(b"x" * 100).decode()]})
        assert post(api, f"{NS}/topics/big/publish", small, JSON).status_code == 200
        big = orjson.dumps({"messages": [base64.b64encode(b"x" * 2000).decode()]})
        r = post(api, f"{NS}/topics/big/publish", big, JSON)
        assert r.status_code == 413
        assert r.json()["type"] == "PayloadTooLarge"

        # Without a Content-Length (chunked), the limit holds while reading.
        def chunks() -> Iterator[bytes]:
            yield big[:600]
            yield big[600:]

        r = api.post(
            f"{NS}/topics/big/publish", content=chunks(), headers={"content-type": JSON.value}
        )
        assert r.status_code == 413
        assert len(poll(api, f"{NS}/topics/big")) == 1


def _store_commits(url: str) -> int:
    text = httpx.get(url + "/metrics", timeout=5).text
    lines = [ln for ln in text.splitlines() if ln.startswith("tidings_store_commits")]
    assert lines, "the server reports its store commits"
    return int(float(lines[0].split()[-1]))


def test_concurrent_publishers_share_commits_and_lone_ones_are_answered(
    tmp_path: Path,
) -> None:
    """Publishes from many clients at once still share group commits (a lone publish
    may commit on the server's event loop, but not while others are at work), and
    publishes sent one at a time, beside a waiting long-poll, are each acknowledged
    durable and read back in order."""
    own = ServerProcess(tmp_path / "data").start()
    try:
        with Client(own.url) as client:
            client.create_topic("many")
            client.create_topic("lone")
            before = _store_commits(own.url)

            def publisher(n: int) -> None:
                with Client(own.url) as mine:
                    for i in range(25):
                        mine.publish("many", [b"%02d-%02d" % (n, i)])

            threads = [threading.Thread(target=publisher, args=(n,)) for n in range(16)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
            commits = _store_commits(own.url) - before
            assert commits <= 0.75 * 400, commits  # groups formed
            got = [m.payload for m in client.poll("many", limit=1000)]
            assert sorted(got) == sorted(
                b"%02d-%02d" % (n, i) for n in range(16) for i in range(25)
            )
            for n in range(16):  # each client's own order holds
                mine = [p for p in got if p.startswith(b"%02d-" % n)]
                assert mine == sorted(mine)

            waiting = client.consume("lone", "earliest")
            seen: list[bytes] = []
            reader = threading.Thread(
                target=lambda: seen.extend(m.payload for m in itertools.islice(waiting, 30))
            )
            reader.start()
            for i in range(30):
                client.publish("lone", [b"%02d" % i])
            reader.join(30)
            assert seen == [b"%02d" % i for i in range(30)]
    finally:
        own.stop()
