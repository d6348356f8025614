"""Idempotent publishing through the real server (issue: idempotent producers)."""

from __future__ import annotations

import httpx
import pytest

from tests.e2e.serverproc import ServerProcess
from tidings import Client
from tidings.client.transports import Request, Response, Urllib3Transport
from tidings.errors import OutOfOrderSequence, TidingsConnectionError

pytestmark = pytest.mark.e2e


class LosesTheFirstAnswer(Urllib3Transport):
    """Sends every request, but the first publish's answer is "lost" on its way back."""

    def __init__(self) -> None:
        super().__init__()
        self.lost = 0

    def send(self, request: Request) -> Response:
        response = super().send(request)
        if request.url.endswith("/publish") and self.lost == 0:
            self.lost += 1
            raise TidingsConnectionError("connection reset while reading the answer")
        return response


def test_a_publish_retried_after_a_lost_answer_is_written_once(
    server: ServerProcess, topic: str
) -> None:
    transport = LosesTheFirstAnswer()
    with Client(server.url, transport=transport) as client:
        client.create_topic(topic)
        client.publish(topic, [b"one", b"two"])  # answered the second time
        client.publish(topic, [b"three"])
        assert transport.lost == 1
        assert [m.payload for m in client.poll(topic)] == [b"one", b"two", b"three"]


def test_without_idempotence_the_same_loss_writes_twice(server: ServerProcess, topic: str) -> None:
    # What idempotence prevents: a plain publish is not retried (it could duplicate), so
    # the caller sees the error, and a retry of its own writes a second copy.
    transport = LosesTheFirstAnswer()
    with Client(server.url, transport=transport, idempotent=False) as client:
        client.create_topic(topic)
        with pytest.raises(TidingsConnectionError):
            client.publish(topic, [b"one"])
        client.publish(topic, [b"one"])
        assert [m.payload for m in client.poll(topic)] == [b"one", b"one"]


def test_sequences_over_rest(server: ServerProcess, topic: str) -> None:
    url = f"{server.url}/v1/namespaces/default/topics/{topic}/publish"
    producer = "ab" * 16

    def publish(seq: object, body: str = "bWVzc2FnZQ==", **extra: str) -> httpx.Response:
        headers = {"Tidings-Producer-Id": producer, "Tidings-Sequence": str(seq), **extra}
        return httpx.post(url, json={"messages": [body]}, headers=headers)

    with Client(server.url) as client:
        client.create_topic(topic)
        assert publish(0).status_code == 200
        assert publish(1).status_code == 200
        assert publish(1).status_code == 200  # a retry: done already, no copy
        assert publish(0).status_code == 200
        gap = publish(3)
        assert gap.status_code == 409 and gap.json()["type"] == OutOfOrderSequence.__name__
        assert len(client.poll(topic)) == 2
        bad = httpx.post(url, json={"messages": ["eA=="]}, headers={"Tidings-Sequence": "1"})
        assert bad.status_code == 400
        bad = publish("x")
        assert bad.status_code == 400
        bad = publish(10**18)  # 19 digits: past what a sequence may be
        assert bad.status_code == 400 and "at most 18 digits" in bad.json()["error"]
        bad = httpx.post(
            url,
            json={"messages": ["eA=="]},
            headers={"Tidings-Producer-Id": "zz", "Tidings-Sequence": "0"},
        )
        assert bad.status_code == 400
        assert len(client.poll(topic)) == 2  # nothing changed


def test_producer_state_survives_a_restart(start_server: object, topic: str) -> None:
    srv = start_server()  # type: ignore[operator]
    url = f"{srv.url}/v1/namespaces/default/topics/{topic}/publish"
    headers = {"Tidings-Producer-Id": "cd" * 16, "Tidings-Sequence": "0"}
    with Client(srv.url) as client:
        client.create_topic(topic)
        assert httpx.post(url, json={"messages": ["eA=="]}, headers=headers).status_code == 200
    srv.kill()
    srv.start()
    with Client(srv.url) as client:
        # The retry after the crash is still recognised.
        assert httpx.post(url, json={"messages": ["eA=="]}, headers=headers).status_code == 200
        assert len(client.poll(topic)) == 1
