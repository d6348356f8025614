"""Pages bounded by bytes through a real server and both clients: ``maxBytes`` on a
poll, a group poll and a pop, the server's ``fetch_max_bytes`` as default and cap, and
readers that page on past short pages to every message."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator

import httpx
import orjson
import pytest

from tests.e2e.serverproc import ServerProcess
from tidings import AsyncClient, Client
from tidings.codec import queue_bodies, wire
from tidings.codec.media import COLUMNS
from tidings.codec.wire import AVRO, AVRO_EXT, JSON, ConsumeRequest, Media
from tidings.structs import Record

pytestmark = pytest.mark.e2e

NS = "max-bytes"
BAD = ["0", "-1", "abc", "1.5", "9" * 19, ""]


@pytest.fixture
def client(server: ServerProcess) -> Iterator[Client]:
    with Client(server.url, NS) as c:
        yield c


@pytest.fixture
def hundreds(client: Client, topic: str) -> str:
    """Ten messages of 100 bytes, in one batch entry (each counts its payload)."""
    client.create_topic(topic)
    client.publish(topic, [b"%03d" % i + b"x" * 97 for i in range(10)])
    return topic


def post(
    server: ServerProcess, path: str, body: bytes, media: Media, accept: str | None, **query: str
) -> httpx.Response:
    headers = {"Content-Type": media.value}
    if accept is not None:
        headers["Accept"] = accept
    return httpx.post(
        f"{server.url}/v1/namespaces/{NS}/topics/{path}", content=body, headers=headers,
        params=query,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("media", "accept"),
    [(JSON, None), (AVRO, None), (AVRO_EXT, None), (AVRO_EXT, COLUMNS.value)],
)
def test_a_poll_stops_at_the_message_that_reaches_max_bytes(
    server: ServerProcess, hundreds: str, media: Media, accept: str | None
) -> None:
    body = wire.encode_consume_request(ConsumeRequest(None, True, 8, None), media)
    for max_bytes, count in (("250", 3), ("300", 3), ("301", 4), ("1", 1), ("99999", 8)):
        r = post(server, hundreds + "/poll", body, media, accept, maxBytes=max_bytes)
        assert r.status_code == 200, r.text
        answer = COLUMNS if accept else media
        messages = wire.decode_messages(r.content, answer)
        assert len(messages) == count
        assert r.headers["Tidings-Count"] == str(count)
        assert r.headers["Tidings-Last-Id"] == messages[-1].id.hex
        assert [m.payload[:3] for m in messages] == [b"%03d" % i for i in range(count)]
        # At its bound, the page says more may follow; short of it, it says nothing.
        assert ("Tidings-More" in r.headers) == (max_bytes != "99999"), max_bytes
        if max_bytes != "99999":
            assert r.headers["Tidings-More"] == "true"


@pytest.mark.parametrize("bad", BAD)
def test_bad_max_bytes_is_400_everywhere_and_changes_nothing(
    server: ServerProcess, client: Client, hundreds: str, bad: str
) -> None:
    body = wire.encode_consume_request(ConsumeRequest(None, True, 8, None), JSON)
    r = post(server, hundreds + "/poll", body, JSON, None, maxBytes=bad)
    assert r.status_code == 400 and "maxBytes" in r.json()["error"]
    # A group poll: the member stays where it was.
    consumer = client.consume(hundreds, group="g", wait=0, follow=False)
    first = consumer.poll()
    member = consumer.member_id
    assert member is not None
    r = post(
        server, hundreds + "/groups/g/poll", b'{"memberId": "%s", "limit": 2}' % member.encode(),
        JSON, None, maxBytes=bad,
    )  # fmt: skip
    assert r.status_code == 400 and "maxBytes" in r.json()["error"]
    assert consumer.poll() == [] and len(first) == 10
    consumer.close()
    # A pop with acks: neither acked nor popped.
    queue = client.queue(hundreds, "q")
    popped = queue.pop(2)
    pop_body = orjson.dumps(
        queue_bodies.pop_request(
            queue.consumer_id, 5, None, None, None, None, [m.id for m in popped]
        )
    )
    r = post(server, hundreds + "/queues/q/pop", pop_body, JSON, None, maxBytes=bad)
    assert r.status_code == 400 and "maxBytes" in r.json()["error"]
    stats = client.describe_queue(hundreds, "q")
    assert stats.acked == 0 and stats.pending == 2  # nothing acked, nothing more leased
    queue.close()


def test_the_servers_bound_is_the_default_and_the_cap(
    start_server: Callable[..., ServerProcess], topic: str
) -> None:
    server = start_server(TIDINGS_FETCH_MAX_BYTES="1000")
    with Client(server.url, NS) as client:
        client.create_topic(topic)
        client.publish(topic, [b"a" * 100] * 30)
        client.publish(topic, [b"b" * 5_000])  # larger than the bound: alone on a page
        client.publish(topic, [b"c" * 100] * 5)
        assert len(client.poll(topic, limit=100)) == 10
        assert len(client.poll(topic, limit=100, max_bytes=10**9)) == 10
        assert len(client.poll(topic, limit=100, max_bytes=150)) == 2
        # A consumer pages on past short pages, and a message past the bound comes alone.
        consumer = client.consume(topic, follow=False, batch_size=100)
        pages = []
        while page := consumer.poll():
            pages.append(page)
        assert [len(p) for p in pages] == [10, 10, 10, 1, 5]
        assert pages[3][0].payload == b"b" * 5_000
        # Ids-only polls are bounded by their limit alone.
        assert len(client.poll_ids(topic, limit=100)) == 36
        # So are a group member's pages and a worker's pops.
        member = client.consume(topic, group="g", batch_size=100, follow=False, wait=0)
        assert len(member.poll()) == 10
        member.close()
        assert len(client.queue(topic, "q").pop(100)) == 10


def test_group_polls_say_when_they_reached_their_bound(
    server: ServerProcess, hundreds: str
) -> None:
    joined = post(server, hundreds + "/groups/h/join", b"{}", JSON, None)
    member = joined.json()["memberId"]
    body = b'{"memberId": "%s", "limit": 20}' % member.encode()
    for accept in (None, COLUMNS.value):
        r = post(server, hundreds + "/groups/h/poll", body, JSON, accept, maxBytes="150")
        assert r.status_code == 200 and r.headers["Tidings-Count"] == "2"
        assert r.headers["Tidings-More"] == "true"
    r = post(server, hundreds + "/groups/h/poll", body, JSON, None, maxBytes="99999")
    assert r.headers["Tidings-Count"] == "6" and "Tidings-More" not in r.headers
    post(server, hundreds + "/groups/h/leave", b'{"memberId": "%s"}' % member.encode(), JSON, None)


def test_a_spark_sink_finds_its_last_marker_past_pages_cut_by_bytes(
    start_server: Callable[..., ServerProcess],
) -> None:
    from tidings.spark.sink import control_topic, last_committed_batch, marker

    server = start_server(TIDINGS_FETCH_MAX_BYTES="1000")
    with Client(server.url) as client:
        client.create_topic(control_topic("s1"))
        # Markers of about 100 bytes: a page holds ten of them.
        for batch in range(40):
            client.publish(control_topic("s1"), marker("s1", batch, batch + 1, {"out": 1}))
        assert last_committed_batch(client, "s1") == 39


def test_clients_pass_max_bytes_on_every_read(client: Client, hundreds: str) -> None:
    assert len(client.poll(hundreds, max_bytes=250)) == 3
    consumer = client.consume(hundreds, follow=False, max_bytes=250)
    assert [len(consumer.poll()) for _ in range(5)] == [3, 3, 3, 1, 0]
    member = client.consume(hundreds, group="g", follow=False, wait=0, max_bytes=250)
    assert len(member.poll()) == 3
    member.close()
    queue = client.queue(hundreds, "q", max_bytes=250)
    assert len(queue.pop(10)) == 3
    queue.close()
    for bad in (0, -1, True):
        with pytest.raises(ValueError, match="max_bytes"):
            client.consume(hundreds, max_bytes=bad)
        with pytest.raises(ValueError, match="max_bytes"):
            client.queue(hundreds, "q", max_bytes=bad)
        with pytest.raises(ValueError, match="max_bytes"):
            client.poll(hundreds, max_bytes=bad)


def test_the_async_client_passes_max_bytes_too(server: ServerProcess, hundreds: str) -> None:
    async def run() -> None:
        async with AsyncClient(server.url, NS) as client:
            assert len(await client.poll(hundreds, max_bytes=250)) == 3
            consumer = client.consume(hundreds, follow=False, max_bytes=250)
            got = [m async for m in consumer]
            assert len(got) == 10
            member = client.consume(hundreds, group="g", follow=False, wait=0, max_bytes=250)
            assert len(await member.poll()) == 3
            await member.close()
            queue = client.queue(hundreds, "q", max_bytes=250)
            assert len(await queue.pop(10)) == 3
            await queue.close()

    asyncio.run(run())


def test_keyed_and_header_messages_count_their_keys_and_headers(client: Client, topic: str) -> None:
    client.create_topic(topic)
    client.publish(topic, [Record(b"p" * 50, key=b"k" * 50) for _ in range(6)])
    assert len(client.poll(topic, max_bytes=200)) == 2  # ~101 bytes each
    client.publish(topic, [Record(b"q" * 50, headers={"h": b"v" * 50}) for _ in range(6)])
    tail = client.poll(topic, start=client.poll(topic, limit=6)[-1].id, inclusive=False)
    assert len(tail) == 6
    assert len(client.poll(topic, start=tail[0].id, max_bytes=200)) == 2
