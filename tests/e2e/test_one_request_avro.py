"""The one-request transaction's Avro body (``avro/binary; schema=tidings``), and the
same body with each topic's messages in the payloads medium, through the real server:
they publish what the JSON body publishes, their acks and group positions count as its
do, and a bad body is a 4xx that changes nothing."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.e2e.serverproc import ServerProcess
from tidings import Client
from tidings.codec import avro, payload_frames
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


PAYLOADS = payload_frames.CONTENT_TYPE
#: What the payloads medium carries: payloads and keys (long ones too), no headers or TTL.
FRAMED = [
    b"plain",
    Record(b"keyed", key=b"k-1"),
    Record(b"long key", key=b"k" * 200),
    Record(b"x" * 20_000, key=b"big"),
    Record(b"", key=b""),
]


def _framed(topic: str, records: list[Record | bytes], write_pointer: int | None = None) -> bytes:
    body = payload_frames.write_frames(write_pointer, records)
    return avro.write(
        _envelope(topics=[{"topic": topic, "body": body}]), avro.TRANSACTION_PUBLISH_REQUEST
    )


@pytest.mark.parametrize(
    "records",
    [FRAMED, [b"a", b"b", b"c"], [Record(b"a", b"k1"), Record(b"b", b"k2")], FRAMED[2:4]],
    ids=["mixed", "plain", "keyed", "a long key"],
)
def test_a_payloads_body_publishes_what_an_avro_body_does(
    server: ServerProcess, client: Client, topic: str, records: list[Record | bytes]
) -> None:
    by_avro, by_frames = topic + "-avro", topic + "-frames"
    for t in (by_avro, by_frames):
        client.create_topic(t)
    body = avro.write(
        _envelope(
            topics=[{"topic": by_avro, "body": encode_publish_request(None, records, AVRO_EXT)}]
        ),
        avro.TRANSACTION_PUBLISH_REQUEST,
    )
    assert _post_avro(server, body).status_code == 200
    answer = _post_avro(server, _framed(by_frames, records), PAYLOADS)
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"].startswith("application/json")
    state = client.transactions()
    assert answer.json()["writePointer"] not in state.in_progress
    assert _seen(client, by_frames) == _seen(client, by_avro)
    assert len(_seen(client, by_frames)) == len(records)


def test_bad_payloads_bodies_are_400_and_change_nothing(
    server: ServerProcess, client: Client, topic: str
) -> None:
    client.create_topic(topic)
    good = payload_frames.write_frames(None, [b"x", b"y"])

    def env(body: bytes) -> bytes:
        return avro.write(
            _envelope(topics=[{"topic": topic, "body": body}]), avro.TRANSACTION_PUBLISH_REQUEST
        )

    bad = [
        ("not a payloads body", env(encode_publish_request(None, [b"x"], AVRO_EXT))),
        ("a write pointer in the body", _framed(topic, [b"x"], write_pointer=7)),
        ("no messages", env(payload_frames.write_frames(None, []))),
        ("cut short", env(good[:-1])),
        ("a position past the end", env(good[:20] + b"\xff" + good[21:])),
        ("an envelope cut short", _framed(topic, [b"x"])[:-2]),
    ]
    before = client.transactions()
    for what, body in bad:
        answer = _post_avro(server, body, PAYLOADS)
        assert answer.status_code == 400, (what, answer.status_code, answer.text)
        assert answer.json()["error"], what
    after = client.transactions()
    assert after.last_write_pointer == before.last_write_pointer
    assert client.poll(topic) == []
