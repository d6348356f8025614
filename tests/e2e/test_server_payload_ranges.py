"""Payload ranges through the real server: the store's ``Tidings-Payload-Range``
header, ``payloadRanges`` in the JSON publish body, and the clients on top of both."""

from __future__ import annotations

import base64
from typing import Any

import httpx
import pytest

from tests.e2e.serverproc import ServerProcess
from tidings import (
    AVRO,
    AVRO_EXT,
    JSON,
    AsyncClient,
    BadRequest,
    Client,
    Media,
    PayloadRange,
    PayloadsAlreadyPublished,
)
from tidings.codec import wire

pytestmark = pytest.mark.e2e


def _b64(*payloads: bytes) -> list[str]:
    return [base64.b64encode(p).decode() for p in payloads]


def _range_json(header: str) -> dict[str, list[int]]:
    first, last = header.split("-")
    first_ts, first_seq = map(int, first.split("."))
    last_ts, last_seq = map(int, last.split("."))
    return {"first": [first_ts, first_seq], "last": [last_ts, last_seq]}


@pytest.mark.parametrize("media", [JSON, AVRO, AVRO_EXT], ids=lambda m: m.name)
def test_store_answers_with_its_range_in_every_medium(
    server: ServerProcess, topic: str, media: Media
) -> None:
    with Client(server.url, timeout=10) as client:
        client.create_topic(topic)
        tx = client.begin()
        body = wire.encode_publish_request(tx.write_pointer, [b"a", b"b", b"c"], media)
        url = f"{server.url}/v1/namespaces/default/topics/{topic}/store"
        answer = httpx.post(url, content=body, headers={"Content-Type": media.value})
        assert answer.status_code == 200, answer.text
        assert answer.content == b""  # the body is unchanged: empty
        first_ts, first_seq, last_ts, last_seq = wire.parse_payload_range(
            answer.headers["Tidings-Payload-Range"]
        )
        assert (last_ts - first_ts) * 0x10000 + last_seq - first_seq == 2
        client.abort(tx)


def test_json_publish_exposes_only_the_ranges_named(server: ServerProcess, topic: str) -> None:
    base = f"{server.url}/v1/namespaces/default/topics/{topic}"
    with Client(server.url, timeout=10) as client:
        client.create_topic(topic)
        tx = client.begin()
        wp = tx.write_pointer
        kept = httpx.post(
            base + "/store", json={"transactionWritePointer": wp, "messages": _b64(b"a", b"b")}
        )
        failed = httpx.post(
            base + "/store", json={"transactionWritePointer": wp, "messages": _b64(b"failed")}
        )
        assert kept.status_code == failed.status_code == 200
        ranges = [_range_json(kept.headers["Tidings-Payload-Range"])]
        answer = httpx.post(
            base + "/publish",
            json={"transactionWritePointer": wp, "messages": [], "payloadRanges": ranges},
        )
        assert answer.status_code == 200, answer.text
        assert answer.json()["transactionWritePointer"] == wp  # the rollback info, as ever
        client.commit(tx)
        assert [m.payload for m in client.poll(topic, transaction=client.snapshot())] == [
            b"a",
            b"b",
        ]


@pytest.mark.parametrize(
    "extra",
    [
        {"messages": _b64(b"x")},  # ranges with messages
        {"transactionWritePointer": None},  # ranges without a write pointer
        {"payloadRanges": []},
        {"payloadRanges": "0.0-1.1"},
        {"payloadRanges": [{"first": [1, 0]}]},
        {"payloadRanges": [{"first": [1, 0], "last": [1]}]},
        {"payloadRanges": [{"first": [1, 0], "last": [1, 70000]}]},
        {"payloadRanges": [{"first": [-1, 0], "last": [1, 0]}]},
        {"payloadRanges": [{"first": [1, 0], "last": [1, "2"]}]},
        {"payloadRanges": [{"first": [5, 0], "last": [1, 0]}]},  # first after last
        {"payloadRanges": [{"first": [1, 0], "last": [3, 0]}, {"first": [2, 0], "last": [4, 0]}]},
        {"payloadRanges": [{"first": [i, 0], "last": [i, 0]} for i in range(10_001)]},
    ],
)
def test_bad_payload_ranges_are_400(
    server: ServerProcess, topic: str, extra: dict[str, Any]
) -> None:
    base = f"{server.url}/v1/namespaces/default/topics/{topic}"
    with Client(server.url, timeout=10) as client:
        client.create_topic(topic)
        tx = client.begin()
        client.store(topic, [b"a"], write_pointer=tx.write_pointer)
        body: dict[str, Any] = {
            "transactionWritePointer": tx.write_pointer,
            "messages": [],
            "payloadRanges": [{"first": [1, 0], "last": [1, 0]}],
            **extra,
        }
        answer = httpx.post(base + "/publish", json=body, timeout=30)
        assert answer.status_code == 400, answer.text
        assert answer.json()["type"] == "BadRequest"
        # Nothing was sealed: the pointer can still be published.
        client.publish(topic, [], write_pointer=tx.write_pointer)
        client.commit(tx)
        assert [m.payload for m in client.poll(topic)] == [b"a"]


def test_store_body_with_payload_ranges_is_400(server: ServerProcess, topic: str) -> None:
    with Client(server.url, timeout=10) as client:
        client.create_topic(topic)
        body = {
            "transactionWritePointer": 5,
            "messages": [],
            "payloadRanges": [{"first": [1, 0], "last": [1, 0]}],
        }
        url = f"{server.url}/v1/namespaces/default/topics/{topic}/store"
        assert httpx.post(url, json=body).status_code == 400


@pytest.mark.parametrize("media", [JSON, AVRO_EXT], ids=lambda m: m.name)
def test_client_store_and_publish_ranges(server: ServerProcess, topic: str, media: Media) -> None:
    # The client's media is Avro for the store; a publish with ranges goes as JSON.
    with Client(server.url, timeout=10, media=media) as client:
        client.create_topic(topic)
        tx = client.begin()
        wp = tx.write_pointer
        first = client.store(topic, [b"a1", b"a2"], write_pointer=wp)
        client.store(topic, [b"failed"], write_pointer=wp)
        second = client.store(topic, [b"b1"], write_pointer=wp)
        assert isinstance(first, PayloadRange) and first.last < second.first
        info = client.publish(topic, [], write_pointer=wp, payload_ranges=[second, first])
        assert info.write_pointer == wp
        with pytest.raises(PayloadsAlreadyPublished):
            client.publish(topic, [], write_pointer=wp, payload_ranges=[first])
        client.commit(tx)
        got = client.poll(topic, transaction=client.snapshot())
        assert [m.payload for m in got] == [b"a1", b"a2", b"b1"]
        assert [(m.id.write_ts, m.id.p_seq) for m in got[:2]] == [
            first.first,
            first.last,
        ]


def test_client_bad_ranges_raise_bad_request(server: ServerProcess, topic: str) -> None:
    with Client(server.url, timeout=10) as client:
        client.create_topic(topic)
        tx = client.begin()
        rng = client.store(topic, [b"a"], write_pointer=tx.write_pointer)
        with pytest.raises(BadRequest):
            client.publish(topic, [], payload_ranges=[rng])  # type: ignore[call-overload]
        with pytest.raises(BadRequest):
            client.publish(topic, [b"x"], write_pointer=tx.write_pointer, payload_ranges=[rng])
        with pytest.raises(BadRequest):
            client.publish(
                topic, [], write_pointer=tx.write_pointer, payload_ranges=[rng, rng]
            )  # overlapping
        client.abort(tx)


async def test_async_client_store_and_publish_ranges(server: ServerProcess, topic: str) -> None:
    async with AsyncClient(server.url, timeout=10) as client:
        await client.create_topic(topic)
        tx = await client.begin()
        wp = tx.write_pointer
        await client.store(topic, [b"failed"], write_pointer=wp)
        kept = await client.store(topic, [b"kept"], write_pointer=wp)
        assert isinstance(kept, PayloadRange)
        await client.publish(topic, [], write_pointer=wp, payload_ranges=[kept])
        await client.commit(tx)
        got = await client.poll(topic, transaction=await client.snapshot())
        assert [m.payload for m in got] == [b"kept"]
