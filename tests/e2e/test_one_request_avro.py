"""The one-request transaction's Avro body (``avro/binary; schema=tidings``), through the
real server: it publishes what the JSON body publishes, its acks and group positions
count as theirs do, and a bad body is a 4xx that changes nothing."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.e2e.serverproc import ServerProcess
from tidings import Client
from tidings.codec import avro
from tidings.codec.media import AVRO, AVRO_EXT, JSON
from tidings.codec.wire import encode_publish_request
from tidings.structs import Record

pytestmark = pytest.mark.e2e

NS = "one-request-avro"


@pytest.fixture
def client(server: ServerProcess) -> Iterator[Client]:
    with Client(server.url, NS) as c:
        yield c


def _url(server: ServerProcess) -> str:
    return f"{server.url}/v1/namespaces/{NS}/transactions/publish"


def _envelope(**fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "timeout": None,
        "transactionalId": None,
        "epoch": None,
        "topics": [],
        "acks": [],
        "groupCommits": [],
    }
    base.update(fields)
    return base


def _post_avro(server: ServerProcess, body: bytes, media: str = AVRO_EXT.value) -> httpx.Response:
    return httpx.post(_url(server), content=body, headers={"Content-Type": media})


RECORDS = [
    b"plain",
    Record(b"keyed", key=b"k-1"),
    Record(b"with a header", key=b"k-2", headers={"h": b"v", "i": b""}),
    Record(b"with a ttl", ttl=3600),
    Record(b"long key", key=b"k" * 200),
    Record(b"x" * 20_000, key=b"big"),
]


def _seen(client: Client, topic: str) -> list[tuple[bytes, bytes | None, dict[str, bytes]]]:
    return [(m.payload, m.key, dict(m.headers)) for m in client.consume(topic, follow=False)]


def test_an_avro_body_publishes_what_a_json_body_does(
    server: ServerProcess, client: Client, topic: str
) -> None:
    by_json, by_avro = topic + "-json", topic + "-avro"
    for t in (by_json, by_avro):
        client.create_topic(t)
    with Client(server.url, NS, media=JSON) as json_client:
        json_client.publish_transaction({by_json: RECORDS})
    body = avro.write(
        _envelope(
            timeout=30.0,
            topics=[{"topic": by_avro, "body": encode_publish_request(None, RECORDS, AVRO_EXT)}],
        ),
        avro.TRANSACTION_PUBLISH_REQUEST,
    )
    answer = _post_avro(server, body)
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"].startswith("application/json")
    snapshot = answer.json()
    assert snapshot["writePointer"] > 0
    expected = [
        (r, None, {}) if isinstance(r, bytes) else (r.payload, r.key, dict(r.headers))
        for r in RECORDS
    ]
    assert _seen(client, by_json) == expected
    assert _seen(client, by_avro) == expected
    # The messages are the transaction's: visible because it committed, under its pointer.
    state = client.transactions()
    assert snapshot["writePointer"] <= state.read_pointer
    assert snapshot["writePointer"] not in state.in_progress


def test_the_client_sends_either_medium_and_the_result_is_the_same(
    server: ServerProcess, topic: str
) -> None:
    # (Read back in the medium that carries keys: plain avro/binary polls cannot.)
    with Client(server.url, NS) as reader:
        for media in (AVRO_EXT, AVRO, JSON):
            target = f"{topic}-{media.name.lower()}"
            with Client(server.url, NS, media=media) as c:
                c.create_topic(target)
                c.publish_transaction({target: RECORDS[:3]})
            assert _seen(reader, target) == [
                (b"plain", None, {}),
                (b"keyed", b"k-1", {}),
                (b"with a header", b"k-2", {"h": b"v", "i": b""}),
            ]


def _bad_bodies(topic: str) -> list[tuple[str, bytes]]:
    good = encode_publish_request(None, [b"x"], AVRO_EXT)

    def env(**fields: Any) -> bytes:
        return avro.write(_envelope(**fields), avro.TRANSACTION_PUBLISH_REQUEST)

    one = [{"topic": topic, "body": good}]
    member = {"topic": topic, "group": "g", "memberId": "m-1"}
    return [
        ("not avro", b"\xff\xff\xff\xff"),
        ("trailing bytes", env(topics=one) + b"\x00"),
        ("cut short", env(topics=one)[:-3]),
        ("bad topic name", env(topics=[{"topic": "bad name", "body": good}])),
        ("a topic twice", env(topics=one + one)),
        (
            "a write pointer in the body",
            env(topics=[{"topic": topic, "body": encode_publish_request(7, [b"x"], AVRO_EXT)}]),
        ),
        ("no messages", env(topics=[{"topic": topic, "body": b"\x02\x00\x00"}])),
        ("a body that is not a publish", env(topics=[{"topic": topic, "body": b"\x07junk"}])),
        ("a bad timeout", env(topics=one, timeout=-1.0)),
        (
            "an ack id of 19 bytes",
            env(
                topics=one,
                acks=[{"topic": topic, "queue": "q", "consumerId": "c1", "ids": [b"\x01" * 19]}],
            ),
        ),
        (
            "a bad consumer id",
            env(
                topics=one,
                acks=[{"topic": topic, "queue": "q", "consumerId": "c 1", "ids": [b"\x01" * 20]}],
            ),
        ),
        (
            "a position id of 3 bytes",
            env(
                topics=one,
                groupCommits=[{**member, "positions": [{"partition": 0, "id": b"abc"}]}],
            ),
        ),
        ("no positions", env(topics=one, groupCommits=[{**member, "positions": []}])),
    ]


def test_bad_avro_bodies_are_400_and_change_nothing(
    server: ServerProcess, client: Client, topic: str
) -> None:
    client.create_topic(topic)
    before = client.transactions()
    for what, body in _bad_bodies(topic):
        answer = _post_avro(server, body)
        assert answer.status_code == 400, (what, answer.status_code, answer.text)
        assert answer.json()["error"], what
    after = client.transactions()
    # Refused before the transaction began: no pointer was taken, nothing published.
    assert after.last_write_pointer == before.last_write_pointer
    assert client.poll(topic) == []


def test_an_unknown_topic_aborts_the_whole_transaction(
    server: ServerProcess, client: Client, topic: str
) -> None:
    client.create_topic(topic)
    open_before = set(client.transactions().in_progress)
    publish = [
        {"topic": topic, "body": encode_publish_request(None, [b"never"], AVRO_EXT)},
        {"topic": topic + "-missing", "body": encode_publish_request(None, [b"x"], AVRO_EXT)},
    ]
    answer = _post_avro(
        server, avro.write(_envelope(topics=publish), avro.TRANSACTION_PUBLISH_REQUEST)
    )
    assert (answer.status_code, answer.json()["type"]) == (404, "TopicNotFound")
    assert client.poll(topic) == []
    # Its transaction aborted (others' on the shared server may still be open).
    assert set(client.transactions().in_progress) <= open_before


def test_plain_avro_and_other_media_are_415(server: ServerProcess, topic: str) -> None:
    body = avro.write(_envelope(), avro.TRANSACTION_PUBLISH_REQUEST)
    for media in (AVRO.value, "text/plain"):
        answer = _post_avro(server, body, media)
        assert (answer.status_code, answer.json()["type"]) == (415, "UnsupportedMediaType")
