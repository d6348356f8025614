"""A queue pop is resent on a retriable 503, which leased nothing, and on nothing else
(a lost answer may have leased messages), through the real server and clients."""

from __future__ import annotations

import orjson
import pytest

from tests.e2e.serverproc import ServerProcess
from tidings import AsyncClient, Client, RetryPolicy
from tidings.client.asyncio_transport import AsyncioTransport
from tidings.client.socket_transport import SocketTransport
from tidings.client.transports import Request, Response
from tidings.errors import (
    RoleUnavailable,
    ServiceUnavailable,
    StoreFull,
    TidingsConnectionError,
    TidingsError,
)

pytestmark = pytest.mark.e2e

QUICK = RetryPolicy(attempts=3, initial_backoff=0.01, max_backoff=0.02)


def _refusal(error: TidingsError) -> Response:
    """What a server (or a standby with no leader) answers when it did not pop."""
    return Response(error.status, orjson.dumps(error.to_json()), "application/json")


class FailsPops:
    """Answers the first ``times`` pops with ``error`` without sending them (a 503 is
    a refusal: the pop never reached a leader), or, for a connection error, sends the
    pop and loses its answer; counts the pops that reached the server."""

    def __init__(self, error: TidingsError, times: int = 1) -> None:
        self.error, self.left, self.sent = error, times, 0

    def fail(self, request: Request) -> bool:
        if not request.url.split("?")[0].endswith("/pop") or self.left <= 0:
            return False
        self.left -= 1
        return True


class SyncFailsPops(SocketTransport):
    def __init__(self, error: TidingsError, times: int = 1) -> None:
        super().__init__()
        self.script = FailsPops(error, times)

    def send(self, request: Request) -> Response:
        failing = self.script.fail(request)
        if failing and self.script.error.status:
            return _refusal(self.script.error)
        response = super().send(request)
        if request.url.split("?")[0].endswith("/pop"):
            self.script.sent += 1
        if failing:
            raise self.script.error
        return response


class AsyncFailsPops(AsyncioTransport):
    def __init__(self, error: TidingsError, times: int = 1) -> None:
        super().__init__()
        self.script = FailsPops(error, times)

    async def send(self, request: Request) -> Response:
        failing = self.script.fail(request)
        if failing and self.script.error.status:
            return _refusal(self.script.error)
        response = await super().send(request)
        if request.url.split("?")[0].endswith("/pop"):
            self.script.sent += 1
        if failing:
            raise self.script.error
        return response


@pytest.mark.parametrize(
    "error",
    [
        ServiceUnavailable("no instance leads the cluster right now; retry shortly"),
        StoreFull("the store has no room for the write"),
    ],
)
def test_a_pop_answered_503_is_sent_again(
    server: ServerProcess, topic: str, error: TidingsError
) -> None:
    transport = SyncFailsPops(error)
    with Client(server.url, transport=transport, retry=QUICK) as client:
        client.create_topic(topic)
        client.publish(topic, [b"job"])
        q = client.queue(topic, "work")
        assert [m.payload for m in q.pop(5)] == [b"job"]
        assert (transport.script.left, transport.script.sent) == (0, 1)


async def test_an_async_pop_answered_503_is_sent_again(server: ServerProcess, topic: str) -> None:
    transport = AsyncFailsPops(ServiceUnavailable("no instance leads the cluster"))
    async with AsyncClient(server.url, transport=transport, retry=QUICK) as client:
        await client.create_topic(topic)
        await client.publish(topic, [b"job"])
        q = client.queue(topic, "work")
        assert [m.payload for m in await q.pop(5)] == [b"job"]
        assert (transport.script.left, transport.script.sent) == (0, 1)


def test_a_pop_gives_up_after_the_retry_policy(server: ServerProcess, topic: str) -> None:
    transport = SyncFailsPops(ServiceUnavailable("no leader"), times=5)
    with Client(server.url, transport=transport, retry=QUICK) as client:
        client.create_topic(topic)
        client.publish(topic, [b"job"])
        with pytest.raises(ServiceUnavailable):
            client.queue(topic, "work").pop(5)
        assert (transport.script.left, transport.script.sent) == (2, 0)  # 3 attempts


@pytest.mark.parametrize(
    "error",
    [TidingsConnectionError("connection reset"), RoleUnavailable("no queues here")],
)
def test_a_pop_is_not_sent_again_after_a_lost_answer_or_a_final_503(
    server: ServerProcess, topic: str, error: TidingsError
) -> None:
    # A lost answer may have leased the message: it is the handle's until ack_timeout.
    transport = SyncFailsPops(error)
    with Client(server.url, transport=transport, retry=QUICK) as client:
        client.create_topic(topic)
        client.publish(topic, [b"job"])
        q = client.queue(topic, "work", ack_timeout=60.0)
        with pytest.raises(type(error)):
            q.pop(5)
        assert transport.script.left == 0
        lost = isinstance(error, TidingsConnectionError)
        assert transport.script.sent == (1 if lost else 0)
        if lost:  # leased by the pop whose answer was lost
            assert client.describe_queue(topic, "work").pending == 1


async def test_an_async_pop_is_not_sent_again_after_a_lost_answer(
    server: ServerProcess, topic: str
) -> None:
    transport = AsyncFailsPops(TidingsConnectionError("connection reset"))
    async with AsyncClient(server.url, transport=transport, retry=QUICK) as client:
        await client.create_topic(topic)
        await client.publish(topic, [b"job"])
        with pytest.raises(TidingsConnectionError):
            await client.queue(topic, "work").pop(5)
        assert transport.script.sent == 1


def test_a_pop_with_acks_is_sent_again_on_a_503(server: ServerProcess, topic: str) -> None:
    # Its 503 acked nothing (or acks the resent ones answer as done) and popped nothing.
    transport = SyncFailsPops(StoreFull("the store has no room for the write"), times=0)
    with Client(server.url, transport=transport, retry=QUICK) as client:
        client.create_topic(topic)
        client.publish(topic, [b"a", b"b", b"c"])
        q = client.queue(topic, "work")
        first = q.pop(1)
        transport.script.left = 1
        second = q.pop(1, ack=first)
        assert [m.payload for m in second] == [b"b"]
        assert (transport.script.left, transport.script.sent) == (0, 2)
        stats = client.describe_queue(topic, "work")
        assert (stats.acked, stats.pending, stats.popped) == (1, 1, 2)


class AcksThenFails(SocketTransport):
    """Applies a pop's acks (as a plain ack) and then answers the pop 503, once: as
    a server whose acks were durable and whose pop then failed."""

    def __init__(self) -> None:
        super().__init__()
        self.armed = False

    def send(self, request: Request) -> Response:
        if self.armed and request.url.split("?")[0].endswith("/pop"):
            self.armed = False
            body = orjson.loads(request.body)
            url = request.url.split("?")[0].removesuffix("/pop") + "/ack"
            acks = {"consumerId": body["consumerId"], "ids": body["ackIds"]}
            ack = Request("POST", url, orjson.dumps(acks), "application/json", request.timeout)
            assert super().send(ack).status == 200
            return _refusal(StoreFull("the store has no room for the write"))
        return super().send(request)


def test_a_pop_whose_acks_were_applied_before_its_503_is_sent_again(
    server: ServerProcess, topic: str
) -> None:
    transport = AcksThenFails()
    with Client(server.url, transport=transport, retry=QUICK) as client:
        client.create_topic(topic)
        client.publish(topic, [b"a", b"b"])
        q = client.queue(topic, "work")
        first = q.pop(1)
        transport.armed = True
        assert [m.payload for m in q.pop(1, ack=first)] == [b"b"]
        assert not transport.armed
        stats = client.describe_queue(topic, "work")
        assert (stats.acked, stats.pending, stats.popped) == (1, 1, 2)
