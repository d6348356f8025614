"""The columnar poll response through a real server and both clients: asked for with
``Accept``, the same messages as every other medium, with the same page headers."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.e2e.serverproc import ServerProcess
from tidings import AsyncClient, Client
from tidings.codec import columns, wire
from tidings.codec.wire import AVRO, AVRO_EXT, COLUMNS, JSON, ConsumeRequest, Media
from tidings.structs import Message, Record

pytestmark = pytest.mark.e2e

NS = "poll-columns"
ACCEPT = {"accept": columns.CONTENT_TYPE}
PAGE: dict[str, Any] = {
    "inclusive": True,
    "limit": None,
    "transaction": None,
    "wait": None,
    "isolation": None,
}


@pytest.fixture
def client(server: ServerProcess) -> Iterator[Client]:
    with Client(server.url, NS) as c:
        yield c


@pytest.fixture
def filled(client: Client, topic: str) -> Iterator[str]:
    """Every entry shape: plain, keyed with headers, key only, committed, stored (with
    keys and headers), one in progress, one after it."""
    client.create_topic(topic)
    client.publish(topic, [b"p1", b""])
    client.publish(topic, [Record(b"k1", key=b"k", headers={"h": b"v", "n": b""})])
    client.publish(topic, [Record(b"k2", key=b"")])
    committed = client.begin()
    client.publish(topic, [b"t1"], write_pointer=committed.write_pointer)
    client.commit(committed)
    stored = client.begin()
    client.store(
        topic,
        [b"s1", Record(b"s2", key=b"sk"), Record(b"s3", headers={"x": b"y"})],
        write_pointer=stored.write_pointer,
    )
    client.publish(topic, [], write_pointer=stored.write_pointer)
    client.commit(stored)
    open_tx = client.begin()
    client.publish(topic, [b"open"], write_pointer=open_tx.write_pointer)
    client.publish(topic, [b"after"])
    yield topic
    client.abort(open_tx)


def post_poll(
    server: ServerProcess,
    topic: str,
    media: Media,
    req: ConsumeRequest,
    headers: dict[str, str],
    **params: str,
) -> httpx.Response:
    return httpx.post(
        f"{server.url}/v1/namespaces/{NS}/topics/{topic}/poll",
        content=wire.encode_consume_request(req, media),
        headers={"content-type": media.value, **headers},
        params=params,
    )


def _plain(messages: list[Message]) -> list[Message]:
    return [m._replace(write_pointer=None) for m in messages]


@pytest.mark.parametrize("media", [JSON, AVRO, AVRO_EXT], ids=lambda m: m.value)
def test_columns_hold_what_the_extended_answer_holds(
    server: ServerProcess, filled: str, media: Media
) -> None:
    reader = httpx.post(f"{server.url}/v1/transactions").json()
    snapshot = base64.b64decode(reader["encoded"])
    assert httpx.post(f"{server.url}/v1/transactions/{reader['writePointer']}/abort").is_success
    for req, params in [
        (ConsumeRequest(), {}),
        (ConsumeRequest(limit=5), {}),
        (ConsumeRequest(transaction=snapshot), {}),
        (ConsumeRequest(), {"isolation": "read_committed"}),
    ]:
        ext = post_poll(server, filled, AVRO_EXT, req, {}, **params)
        cols = post_poll(server, filled, media, req, ACCEPT, **params)
        assert (ext.status_code, cols.status_code) == (200, 200)
        assert cols.headers["content-type"] == columns.CONTENT_TYPE
        expected = wire.decode_messages(ext.content, AVRO_EXT)
        got = wire.decode_messages(cols.content, COLUMNS)
        assert got == expected and got
        for name in ("tidings-count", "tidings-last-id"):
            assert cols.headers[name] == ext.headers[name]
        assert cols.headers.get("tidings-last-stable-id") == ext.headers.get(
            "tidings-last-stable-id"
        )
    payloads = [m.payload for m in got]
    assert payloads == [b"p1", b"", b"k1", b"k2", b"t1", b"s1", b"s2", b"s3"]
    assert [m.key for m in got][2:7] == [b"k", b"", None, None, b"sk"]
    assert dict(got[2].headers) == {"h": b"v", "n": b""} and dict(got[7].headers) == {"x": b"y"}


def test_accept_picks_the_columns_only_when_it_names_them(
    server: ServerProcess, filled: str
) -> None:
    req = ConsumeRequest(limit=2)
    for accept in (
        f"{columns.CONTENT_TYPE}, {AVRO_EXT.value}",
        f"{AVRO.value};q=0.5, {columns.CONTENT_TYPE.upper()};q=1",
    ):
        r = post_poll(server, filled, AVRO, req, {"accept": accept})
        assert r.headers["content-type"] == columns.CONTENT_TYPE, accept
    for accept in ("*/*", AVRO.value, columns.CONTENT_TYPE + "x", "application/vnd.tidings"):
        r = post_poll(server, filled, AVRO, req, {"accept": accept})
        assert r.headers["content-type"] == AVRO.value, accept
    # An ids-only poll answers ids in the request's medium, whatever Accept says.
    r = post_poll(server, filled, AVRO, req, ACCEPT, fields="id")
    assert r.headers["content-type"] == AVRO.value
    assert len(wire.decode_message_ids(r.content, AVRO)) == 2


def test_an_empty_page_and_errors(server: ServerProcess, client: Client, topic: str) -> None:
    client.create_topic(topic)
    r = post_poll(server, topic, AVRO_EXT, ConsumeRequest(), ACCEPT)
    assert r.status_code == 200 and r.headers["tidings-count"] == "0"
    assert r.headers["content-type"] == columns.CONTENT_TYPE
    assert columns.read_columns(r.content).messages() == []
    # Errors stay JSON.
    r = post_poll(server, topic + "-missing", AVRO_EXT, ConsumeRequest(), ACCEPT)
    assert r.status_code == 404 and "error" in r.json()
    r = post_poll(server, topic, AVRO_EXT, ConsumeRequest(limit=0), ACCEPT)
    assert r.status_code == 400 and "error" in r.json()
    # A request in the columnar medium is refused: it is for answers only.
    r = httpx.post(
        f"{server.url}/v1/namespaces/{NS}/topics/{topic}/poll",
        content=columns.write_messages([]),
        headers={"content-type": columns.CONTENT_TYPE},
    )
    assert r.status_code == 415 and "error" in r.json()


def test_clients_read_pages_in_columns(server: ServerProcess, client: Client, filled: str) -> None:
    page = client.poll_page(filled, None, **PAGE)
    assert page.media is COLUMNS
    with Client(server.url, NS, media=JSON) as json_client:
        expected = json_client.poll(filled)
        assert json_client.poll_page(filled, None, **PAGE).media is JSON
    assert page.messages() == _plain(expected)
    assert _plain(client.poll(filled)) == _plain(expected)
    consumer = client.consume(filled, "earliest", transactional=False, follow=False, batch_size=3)
    assert [m.payload for m in consumer] == [m.payload for m in expected]

    async def run() -> list[Message]:
        async with AsyncClient(server.url, NS) as c:
            page = await c.poll_page(filled, None, **PAGE)
            assert page.media is COLUMNS
            return await c.poll(filled)

    assert _plain(asyncio.run(run())) == _plain(expected)
