"""The ids-only poll (``?fields=id``) through a real server and both clients: exactly the
ids of the messages the same poll returns, in every medium, with the page headers."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Iterator

import httpx
import pytest

from tests.e2e.serverproc import ServerProcess
from tidings import AsyncClient, Client
from tidings.codec import wire
from tidings.codec.wire import AVRO, AVRO_EXT, JSON, ConsumeRequest, Media
from tidings.errors import BadRequest, TopicNotFound
from tidings.structs import MessageId, Record

pytestmark = pytest.mark.e2e

NS = "poll-ids"
MEDIA = [JSON, AVRO, AVRO_EXT]


@pytest.fixture
def client(server: ServerProcess) -> Iterator[Client]:
    with Client(server.url, NS) as c:
        yield c


@pytest.fixture
def filled(client: Client, topic: str) -> Iterator[str]:
    """A topic with every entry shape: plain, keyed, committed, stored, in progress.

    The transaction left in progress is aborted afterwards: the server is shared, and
    other tests expect no transaction of theirs to be in progress."""
    client.create_topic(topic)
    client.publish(topic, [b"p1", b"p2"])
    client.publish(topic, [Record(b"k1", key=b"k", headers={"h": b"v"})])
    committed = client.begin()
    client.publish(topic, [b"t1"], write_pointer=committed.write_pointer)
    client.commit(committed)
    stored = client.begin()
    client.store(topic, [b"s1", b"s2", b"s3"], write_pointer=stored.write_pointer)
    client.publish(topic, [], write_pointer=stored.write_pointer)
    client.commit(stored)
    open_tx = client.begin()  # stays in progress: a read-committed poll stops here
    client.publish(topic, [b"open"], write_pointer=open_tx.write_pointer)
    client.publish(topic, [b"after"])
    yield topic
    client.abort(open_tx)


def post_poll(
    server: ServerProcess, topic: str, media: Media, req: ConsumeRequest, **params: str
) -> httpx.Response:
    return httpx.post(
        f"{server.url}/v1/namespaces/{NS}/topics/{topic}/poll",
        content=wire.encode_consume_request(req, media),
        headers={"content-type": media.value},
        params=params,
    )


@pytest.mark.parametrize("media", MEDIA, ids=lambda m: m.value)
def test_ids_are_those_of_the_same_poll(server: ServerProcess, filled: str, media: Media) -> None:
    reader = httpx.post(f"{server.url}/v1/transactions").json()
    snapshot = base64.b64decode(reader["encoded"])
    # Ended at once: its snapshot stays usable, and the shared server keeps no
    # transaction of this test in progress.
    assert httpx.post(f"{server.url}/v1/transactions/{reader['writePointer']}/abort").is_success
    for req in [
        ConsumeRequest(),
        ConsumeRequest(limit=4),
        ConsumeRequest(transaction=snapshot),
    ]:
        full = post_poll(server, filled, media, req)
        ids = post_poll(server, filled, media, req, fields="id")
        assert (full.status_code, ids.status_code) == (200, 200)
        assert ids.headers["content-type"] == media.value
        messages = wire.decode_messages(full.content, media)
        got = wire.decode_message_ids(ids.content, media)
        assert got == [m.id for m in messages] and got
        assert ids.headers["tidings-count"] == str(len(got))
        assert ids.headers["tidings-last-id"] == got[-1].hex
        # The ids carry no payloads: far smaller than the page (20 bytes and framing).
        assert len(ids.content) < len(full.content)
    # fields=all is the ordinary poll.
    full = post_poll(server, filled, media, ConsumeRequest(), fields="all")
    assert full.content == post_poll(server, filled, media, ConsumeRequest()).content


def test_read_committed_ids_stop_at_a_transaction_in_progress(client: Client, filled: str) -> None:
    committed = client.poll_ids(filled, isolation="read_committed")
    everything = client.poll_ids(filled)
    payloads = [m.payload for m in client.poll(filled, isolation="read_committed")]
    assert payloads == [b"p1", b"p2", b"k1", b"t1", b"s1", b"s2", b"s3"]
    assert len(committed) == 7 and committed == everything[:7]
    assert len(everything) == 9  # uncommitted: the open transaction's and the one after
    # Resume after an id, exclusive and inclusive; a timestamp start.
    assert client.poll_ids(filled, committed[2], inclusive=False) == everything[3:]
    assert client.poll_ids(filled, committed[2]) == everything[2:]
    assert client.poll_ids(filled, committed[0].publish_ts, limit=2) == everything[:2]


def test_empty_and_bad_requests(server: ServerProcess, client: Client, topic: str) -> None:
    client.create_topic(topic)
    for media in MEDIA:
        r = post_poll(server, topic, media, ConsumeRequest(), fields="id")
        assert r.status_code == 200 and wire.decode_message_ids(r.content, media) == []
        assert r.headers["tidings-count"] == "0" and "tidings-last-id" not in r.headers
    for bad in ("ids", "payload", "", "ID"):
        r = post_poll(server, topic, JSON, ConsumeRequest(), fields=bad)
        assert r.status_code == 400 and "fields" in r.json()["error"], bad
    with pytest.raises(TopicNotFound):
        client.poll_ids(topic + "-missing")
    with pytest.raises(BadRequest):
        client.poll_ids(topic, limit=0)


def test_long_poll_for_ids_wakes_on_publish(server: ServerProcess, topic: str) -> None:
    async def run() -> None:
        async with AsyncClient(server.url, NS) as c:
            await c.create_topic(topic)
            waiting = asyncio.ensure_future(c.poll_ids(topic, wait=10))
            await asyncio.sleep(0.3)
            assert not waiting.done()
            await c.publish(topic, [b"x"])
            ids = await asyncio.wait_for(waiting, 5)
            [message] = await c.poll(topic)
            assert ids == [message.id] and isinstance(ids[0], MessageId)

    asyncio.run(run())
