"""Client and AsyncClient over fake transports (retries, calls) and real ones (errors)."""

from __future__ import annotations

import socket
from collections.abc import Callable

import orjson
import pytest

from tidings.client import AsyncClient, Client, RetryPolicy
from tidings.client.transports import AiohttpTransport, Request, Response, Urllib3Transport
from tidings.codec import payload_frames, tx_publish, wire
from tidings.codec.transaction import decode_transaction
from tidings.errors import RequestTimeout, ServiceUnavailable, TidingsConnectionError, TopicNotFound
from tidings.structs import Record, RollbackInfo, Transaction

RETRY = RetryPolicy(attempts=3, initial_backoff=0, jitter=0)
Handler = Callable[[Request], Response]


class FakeTransport:
    """Answers with ``handler``; errors in ``failures`` are raised first, one per send."""

    def __init__(self, handler: Handler, *failures: Exception) -> None:
        self.handler = handler
        self.failures = list(failures)
        self.sent: list[Request] = []
        self.closed = False

    def send(self, request: Request) -> Response:
        self.sent.append(request)
        if self.failures:
            raise self.failures.pop(0)
        return self.handler(request)

    def close(self) -> None:
        self.closed = True


class AsyncFakeTransport(FakeTransport):
    async def send(self, request: Request) -> Response:  # type: ignore[override]
        return FakeTransport.send(self, request)

    async def aclose(self) -> None:
        self.closed = True


def json_answer(body: object) -> Handler:
    return lambda request: Response(200, orjson.dumps(body), "application/json")


def test_idempotent_requests_are_retried() -> None:
    transport = FakeTransport(json_answer(["a"]), TidingsConnectionError(), ServiceUnavailable())
    with Client("http://h:1", retry=RETRY, transport=transport) as client:
        assert client.list_topics() == ["a"]
    assert len(transport.sent) == 3 and transport.closed


def test_retries_give_up_after_the_last_attempt() -> None:
    transport = FakeTransport(json_answer([]), *[RequestTimeout(str(i)) for i in range(3)])
    client = Client("http://h:1", retry=RETRY, transport=transport)
    with pytest.raises(RequestTimeout, match="2"):
        client.list_topics()


def test_writes_are_sent_once() -> None:
    transport = FakeTransport(json_answer({}), TidingsConnectionError())
    client = Client("http://h:1", retry=RETRY, transport=transport, idempotent=False)
    with pytest.raises(TidingsConnectionError):
        client.publish("t", b"x")
    with pytest.raises(TopicNotFound):
        Client(
            "http://h:1",
            retry=RETRY,
            transport=FakeTransport(
                lambda r: Response(404, b'{"error":"x","type":"TopicNotFound"}', None)
            ),
        ).get_topic("t")
    assert len(transport.sent) == 1


def test_idempotent_publishes_are_retried_under_the_same_sequence() -> None:
    transport = FakeTransport(lambda r: Response(200, b"", None), TidingsConnectionError())
    client = Client("http://h:1", retry=RETRY, transport=transport)
    client.publish("t", b"x")  # the first attempt fails, the retry is answered
    client.publish("t", b"y")
    sent = [dict(r.headers) for r in transport.sent]
    assert len(sent) == 3
    assert sent[0] == sent[1]  # the retry: the same producer and sequence
    assert sent[0]["Tidings-Sequence"] == "0" and sent[2]["Tidings-Sequence"] == "1"
    assert sent[2]["Tidings-Producer-Id"] == sent[0]["Tidings-Producer-Id"]


def test_publish_with_a_write_pointer_returns_rollback_info() -> None:
    info = RollbackInfo(9, 1, 0, 1, 3)
    transport = FakeTransport(
        lambda r: Response(200, wire.encode_rollback_info(info, wire.JSON), "application/json")
    )
    client = Client("http://h:1", transport=transport)
    assert client.publish("t", [b"a"], write_pointer=9) == info
    assert client.publish("t", "a") is None


def refusing_payloads(request: Request) -> Response:
    """A server before the payloads medium: 415 for it, Avro and JSON taken."""
    if request.content_type == payload_frames.CONTENT_TYPE:
        return Response(415, b'{"error": "no", "type": "UnsupportedMediaType"}', "application/json")
    if request.url.endswith("/store"):
        return Response(200, b"", None, headers={"tidings-payload-range": "1.0-1.1"})
    return Response(200, b"", None)


def test_plain_payloads_go_in_the_payloads_medium() -> None:
    transport = FakeTransport(lambda r: Response(200, b"", None))
    client = Client("http://h:1", transport=transport)
    client.publish("t", [b"a", b"bc"])
    client.publish("t", [Record(b"k", key=b"key"), b"m"])  # keys go in it too
    client.publish("t", [Record(b"h", headers={"a": b"b"})])  # headers: Avro carries them
    first, keyed, headers = transport.sent
    assert first.content_type == keyed.content_type == payload_frames.CONTENT_TYPE
    assert payload_frames.read_frames(first.body).payloads() == [b"a", b"bc"]
    assert payload_frames.read_frames(keyed.body).records() == [Record(b"k", b"key"), b"m"]
    assert headers.content_type == wire.AVRO_EXT.value
    json_client = Client("http://h:1", transport=transport, media=wire.JSON)
    json_client.publish("t", [b"a"])
    assert transport.sent[-1].content_type == wire.JSON.value


def test_a_server_refusing_the_payloads_medium_gets_avro_from_then_on() -> None:
    transport = FakeTransport(refusing_payloads)
    client = Client("http://h:1", transport=transport)
    client.publish("t", [b"a", b"bc"])
    refused, again = transport.sent
    assert refused.content_type == payload_frames.CONTENT_TYPE
    assert again.content_type == wire.AVRO_EXT.value
    assert wire.decode_publish_request(again.body, wire.AVRO_EXT).records == [b"a", b"bc"]
    # Nothing was written by the refused one: the same producer sequence again.
    assert dict(again.headers) == dict(refused.headers)
    client.publish("t", [b"d"])
    client.store("t", [b"s"], write_pointer=7)
    assert [r.content_type for r in transport.sent[2:]] == [wire.AVRO_EXT.value] * 2


def test_a_store_refused_in_the_payloads_medium_is_sent_again_in_avro() -> None:
    transport = FakeTransport(refusing_payloads)
    client = Client("http://h:1", transport=transport)
    client.store("t", [b"s1", b"s2"], write_pointer=7)
    assert [r.content_type for r in transport.sent] == [
        payload_frames.CONTENT_TYPE,
        wire.AVRO_EXT.value,
    ]
    stored = wire.decode_publish_request(transport.sent[1].body, wire.AVRO_EXT)
    assert (stored.write_pointer, stored.records) == (7, [b"s1", b"s2"])


async def test_the_async_client_falls_back_to_avro_too() -> None:
    transport = AsyncFakeTransport(refusing_payloads)
    async with AsyncClient("http://h:1", transport=transport) as client:
        await client.publish("t", [b"a"])
        await client.publish("t", [b"b"])
    assert [r.content_type for r in transport.sent] == [
        payload_frames.CONTENT_TYPE,
        wire.AVRO_EXT.value,
        wire.AVRO_EXT.value,
    ]


_SNAPSHOT = b'{"writePointer": 5, "readPointer": 4, "invalid": [], "inProgress": []}'


def transacting(refuse_payloads: bool) -> Callable[[Request], Response]:
    """A server answering one-request transactions (refusing the payloads medium, as
    one before it did, with ``refuse_payloads``)."""

    def answer(request: Request) -> Response:
        if refuse_payloads and request.content_type == payload_frames.CONTENT_TYPE:
            return refusing_payloads(request)
        return Response(200, _SNAPSHOT, "application/json")

    return answer


def _transaction_topics(request: Request) -> dict[str, list[Record | bytes]]:
    envelope = tx_publish.read_transaction_publish(request.body)
    if request.content_type == payload_frames.CONTENT_TYPE:
        read = payload_frames.read_frames
        return {t["topic"]: list(read(t["body"]).records()) for t in envelope["topics"]}
    decode = wire.decode_publish_request
    return {t["topic"]: list(decode(t["body"], wire.AVRO_EXT).records) for t in envelope["topics"]}


def test_a_transaction_in_one_request_sends_payloads_and_keys_in_the_payloads_medium() -> None:
    transport = FakeTransport(transacting(refuse_payloads=False))
    client = Client("http://h:1", transport=transport)
    with client.transaction() as tx:
        tx.publish("a", [b"x", b"yz"])
        tx.publish("b", [Record(b"v", b"k"), Record(b"w")])
    with client.transaction() as tx:  # a header: Avro carries it
        tx.publish("a", [Record(b"h", headers={"n": b"v"})])
    keyed, headers = transport.sent
    assert keyed.content_type == payload_frames.CONTENT_TYPE
    assert _transaction_topics(keyed) == {"a": [b"x", b"yz"], "b": [Record(b"v", b"k"), b"w"]}
    assert headers.content_type == wire.AVRO_EXT.value
    assert _transaction_topics(headers) == {"a": [Record(b"h", headers={"n": b"v"})]}


@pytest.mark.parametrize("asynchronous", [False, True])
async def test_a_transaction_refused_in_the_payloads_medium_is_sent_again_in_avro(
    asynchronous: bool,
) -> None:
    if asynchronous:
        async_transport = AsyncFakeTransport(transacting(refuse_payloads=True))
        async with AsyncClient("http://h:1", transport=async_transport) as async_client:
            async with async_client.transaction() as atx:
                await atx.publish("a", [b"x"])
            async with async_client.transaction() as atx:
                await atx.publish("a", [b"y"])
        sent = async_transport.sent
    else:
        transport = FakeTransport(transacting(refuse_payloads=True))
        client = Client("http://h:1", transport=transport)
        with client.transaction() as tx:
            tx.publish("a", [b"x"])
        with client.transaction() as tx:
            tx.publish("a", [b"y"])
        sent = transport.sent
    assert [r.content_type for r in sent] == [
        payload_frames.CONTENT_TYPE,
        wire.AVRO_EXT.value,
        wire.AVRO_EXT.value,
    ]
    assert [_transaction_topics(r) for r in sent] == [{"a": [b"x"]}] * 2 + [{"a": [b"y"]}]


def test_poll_encodes_a_snapshot() -> None:
    tx = Transaction(3, 8, (1,), (5,))
    transport = FakeTransport(lambda r: Response(200, b"[]", "application/json"))
    client = Client("http://h:1", transport=transport)
    assert client.poll("t", transaction=tx, wait=1) == []
    body = wire.decode_consume_request(transport.sent[0].body, client.media)
    assert body.transaction is not None and decode_transaction(body.transaction) == tx


def test_snapshot_comes_from_the_state() -> None:
    transport = FakeTransport(
        json_answer(
            {
                "readPointer": 10,
                "lastWritePointer": 20,
                "inProgress": [{"writePointer": 15, "expiresAt": 1}],
                "invalid": [7],
            }
        )
    )
    snap = Client("http://h:1", transport=transport).snapshot()
    assert (snap.read_pointer, snap.invalid, snap.in_progress) == (10, (7,), (15,))
    assert transport.sent[0].method == "GET"


async def test_async_client_retries_and_closes() -> None:
    # A publish is answered with an empty body, as the server does (a list is no
    # answer to a publish: the client takes it for a broken server).
    def answer(request: Request) -> Response:
        body = b"" if request.method == "POST" else orjson.dumps(["a"])
        return Response(200, body, "application/json")

    transport = AsyncFakeTransport(answer, TidingsConnectionError())
    async with AsyncClient("http://h:1", retry=RETRY, transport=transport) as client:
        assert await client.list_topics() == ["a"]
        assert await client.publish("t", [b"x"]) is None
    assert len(transport.sent) == 3 and transport.closed


def test_constructor_checks() -> None:
    with pytest.raises(ValueError):
        Client("ftp://h")
    with pytest.raises(TypeError):
        Client(media="json")  # type: ignore[arg-type]
    assert repr(Client("http://h:1/", "ns")) == "Client(url='http://h:1', namespace='ns')"


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_urllib3_transport_maps_connection_errors() -> None:
    transport = Urllib3Transport()
    request = Request("GET", f"http://127.0.0.1:{closed_port()}/healthz", timeout=2)
    with pytest.raises(TidingsConnectionError):
        transport.send(request)
    transport.close()


def test_transports_map_timeouts() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        transport = Urllib3Transport()
        with pytest.raises(RequestTimeout):
            transport.send(Request("GET", f"http://127.0.0.1:{port}/", timeout=0.2))
        transport.close()


async def test_aiohttp_transport_maps_errors() -> None:
    transport = AiohttpTransport()
    try:
        with pytest.raises(TidingsConnectionError):
            await transport.send(Request("GET", f"http://127.0.0.1:{closed_port()}/", timeout=2))
        with socket.socket() as listener:
            listener.bind(("127.0.0.1", 0))
            listener.listen()
            port = listener.getsockname()[1]
            with pytest.raises(RequestTimeout):
                await transport.send(Request("GET", f"http://127.0.0.1:{port}/", timeout=0.2))
    finally:
        await transport.aclose()
