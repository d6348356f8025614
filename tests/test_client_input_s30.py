"""The client's bad arguments and a server's bad answers: each is a typed error, raised
before anything is sent (arguments) or instead of a success (answers)."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Callable

import orjson
import pytest

from tidings import Client, Record
from tidings.client.asyncio_transport import AsyncioTransport
from tidings.client.base import RetryPolicy
from tidings.client.socket_transport import SocketTransport
from tidings.client.transports import Request, Response
from tidings.codec.wire import AVRO_EXT, JSON, Media
from tidings.errors import (
    BadRequest,
    InvalidProperties,
    ServerError,
    ServiceUnavailable,
    TidingsConnectionError,
)

RETRY = RetryPolicy(attempts=2, initial_backoff=0, jitter=0)
Handler = Callable[[Request], Response]


class Fake:
    """A transport answering every request with ``handler``; keeps what was sent."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.sent: list[Request] = []

    def send(self, request: Request) -> Response:
        self.sent.append(request)
        return self.handler(request)

    def close(self) -> None:
        pass


def answer(body: bytes, status: int = 200, content_type: str = "application/json") -> Handler:
    return lambda request: Response(status, body, content_type)


def client(handler: Handler, media: Media = JSON) -> tuple[Client, Fake]:
    fake = Fake(handler)
    return Client("http://h:1", media=media, retry=RETRY, transport=fake), fake


# --- integers past 64 bits -------------------------------------------------------------


@pytest.mark.parametrize("media", [JSON, AVRO_EXT])
def test_integers_past_64_bits_are_refused_before_sending(media: Media) -> None:
    c, fake = client(answer(b"{}"), media)
    huge = 2**70
    with pytest.raises(InvalidProperties, match="ttl"):
        c.create_topic("t", ttl=huge)
    with pytest.raises(InvalidProperties, match="ttl"):
        c.update_topic("t", ttl=-huge)
    with pytest.raises(BadRequest, match="maxMessages"):
        c.queue("t", "q").pop(max_messages=huge)
    with pytest.raises(BadRequest, match="limit"):
        c.poll("t", limit=huge)
    with pytest.raises(BadRequest, match="sessionTimeoutMs"):
        c.consume("t", group="g", session_timeout=huge, follow=False).poll()
    with pytest.raises(ValueError, match="max_bytes"):
        c.poll("t", max_bytes=huge)
    assert not [r for r in fake.sent if not r.url.endswith("/release")]


@pytest.mark.parametrize("media", [JSON, AVRO_EXT])
@pytest.mark.parametrize("ttl", [2**70, 2**63, 0])
def test_a_message_ttl_the_server_cannot_take_is_refused_before_sending(
    media: Media, ttl: int
) -> None:
    c, fake = client(answer(b""), media)
    with pytest.raises(BadRequest, match="ttl"):
        c.publish("t", Record(b"x", ttl=ttl))
    with pytest.raises(BadRequest, match="ttl"):
        c.publish("t", Record(b"x", headers={"h": b"v"}, ttl=ttl))
    assert not fake.sent


@pytest.mark.parametrize("seconds", [float("inf"), float("nan"), 0, -1])
def test_a_session_timeout_that_is_no_positive_number_is_a_value_error(seconds: float) -> None:
    c, fake = client(answer(b"{}"))
    with pytest.raises(ValueError, match="session_timeout"):
        c.consume("t", group="g", session_timeout=seconds, follow=False).poll()
    assert not fake.sent


# --- URLs --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "http://user:secret@127.0.0.1:8470",
        "http://user:secret@127.0.0.1:99999",
        "http://token@127.0.0.1:8470",
        "http://a..b:8470",
        "http://" + "x" * 64 + ".example:8470",
        "http://h:99999",
        "http://h x:1",
    ],
)
def test_a_url_the_client_cannot_use_is_refused_at_construction(url: str) -> None:
    with pytest.raises(ValueError) as caught:
        Client(url)
    assert "secret" not in str(caught.value)
    with pytest.raises(ValueError):
        Client("http://127.0.0.1:8470", transactions_url=url)


# --- a queue's with block ------------------------------------------------------------------


def test_a_with_blocks_error_survives_a_failed_release() -> None:
    unavailable = orjson.dumps({"error": "down", "type": "ServiceUnavailable"})
    c, fake = client(answer(unavailable, 503))
    with pytest.raises(KeyError) as caught, c.queue("t", "q"):
        raise KeyError("the block's own")
    assert caught.value.args == ("the block's own",)
    assert any("ServiceUnavailable" in note for note in caught.value.__notes__)
    assert fake.sent and fake.sent[-1].url.endswith("/release")
    # Without an error of its own, the block raises the release's.
    with pytest.raises(ServiceUnavailable), c.queue("t", "q"):
        pass


# --- malformed answers ---------------------------------------------------------------------


@pytest.mark.parametrize("body", [b"<html>oops</html>", b"{", b'"done"', b"[1]"])
def test_a_malformed_answer_to_publish_or_delete_is_no_success(body: bytes) -> None:
    c, _ = client(answer(body))
    with pytest.raises(ServerError):
        c.publish("t", [b"x"])
    with pytest.raises(ServerError):
        c.delete_topic("t")


def test_the_usual_answers_still_succeed() -> None:
    c, _ = client(answer(b""))
    assert c.publish("t", [b"x"]) is None
    c, _ = client(answer(b"{}"))
    assert c.delete_topic("t") is None


@pytest.mark.parametrize("body", [b"{}", b"", b"null", b"[]", b"<html>"])
def test_an_abort_answer_without_its_outcome_is_no_success(body: bytes) -> None:
    c, _ = client(answer(body))
    with pytest.raises(ServerError):
        c.abort(5)
    with pytest.raises(ServerError):
        c.invalidate(5)
    c, _ = client(answer(b'{"outcome": "aborted", "already": false}'))
    assert c.abort(5).aborted


@pytest.mark.parametrize("media", [JSON, AVRO_EXT])
@pytest.mark.parametrize("body", [b"{not json", b'[{"id": 1}]', b"\x00\xff\x07"])
def test_a_malformed_poll_answer_is_a_server_error(media: Media, body: bytes) -> None:
    content_type = "application/json" if body.startswith((b"{", b"[")) else media.value
    c, _ = client(answer(body, content_type=content_type), media)
    with pytest.raises(ServerError):
        c.poll("t")
    with pytest.raises(ServerError):
        list(c.consume("t", follow=False))
    with pytest.raises(ServerError):
        c.queue("t", "q").pop()


BODIES = [b"{", b"[]", b'"x"', b"null", b'{"newestId": "zz", "lastStableId": null}', b"\xff"]


@pytest.mark.parametrize("body", BODIES)
def test_any_success_answer_that_does_not_decode_is_a_server_error(body: bytes) -> None:
    c, _ = client(answer(body))
    for call in (
        lambda: c.end("t"),
        lambda: c.get_topic("t"),
        lambda: c.stats("t"),
        lambda: c.transactions(),
        lambda: c.queue("t", "q").nack([]) or c.purge_queue("t", "q"),
    ):
        with pytest.raises(ServerError):
            call()


# --- the transports on their own --------------------------------------------------------


def test_the_transports_refuse_a_host_no_dns_name_can_be_with_a_tidings_error() -> None:
    request = Request("GET", "http://a..b:1/healthz", timeout=1)
    with pytest.raises(TidingsConnectionError):
        SocketTransport().send(request)

    async def send() -> None:
        transport = AsyncioTransport()
        try:
            await transport.send(request)
        finally:
            await transport.aclose()

    with pytest.raises(TidingsConnectionError):
        asyncio.run(send())


def test_the_host_header_never_carries_credentials() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        server.settimeout(5)
        port = server.getsockname()[1]
        seen: list[bytes] = []

        def answer_once() -> None:
            conn, _ = server.accept()
            with conn:
                seen.append(conn.recv(65536))
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")

        thread = threading.Thread(target=answer_once)
        thread.start()
        transport = SocketTransport()
        try:
            response = transport.send(
                Request("GET", f"http://user:secret@127.0.0.1:{port}/healthz", timeout=5)
            )
        finally:
            transport.close()
            thread.join(5)
    assert response.status == 200
    assert f"Host: 127.0.0.1:{port}\r\n".encode() in seen[0]
    assert b"secret" not in seen[0]
