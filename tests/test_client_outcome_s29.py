"""What the client does with a 500 ``OutcomeUnknown`` (a write whose commit went
unanswered on the server's PostgreSQL store, and whose outcome the server could not
learn): sent again only where that is safe."""

from __future__ import annotations

import orjson
import pytest

from tests.test_client_clients import RETRY, FakeTransport
from tidings.client import Client
from tidings.client.transports import Request, Response
from tidings.errors import OutcomeUnknown

UNKNOWN = orjson.dumps({"error": "may or may not", "type": "OutcomeUnknown"})


def _unknown_once(answer: Response) -> FakeTransport:
    """Answers OutcomeUnknown to the first request, ``answer`` to the others."""
    state = {"first": True}

    def handle(request: Request) -> Response:
        if state["first"]:
            state["first"] = False
            return Response(500, UNKNOWN, "application/json")
        return answer

    return FakeTransport(handle)


def test_an_idempotent_publish_is_sent_again_under_the_same_sequence() -> None:
    # Safe: the server drops the second if the first was written.
    transport = _unknown_once(Response(200, b"", None))
    with Client("http://h:1", retry=RETRY, transport=transport) as client:
        client.publish("t", b"x")
    assert len(transport.sent) == 2
    assert dict(transport.sent[0].headers) == dict(transport.sent[1].headers)


def test_a_plain_publish_is_not_sent_again() -> None:
    transport = _unknown_once(Response(200, b"", None))
    client = Client("http://h:1", retry=RETRY, transport=transport, idempotent=False)
    with pytest.raises(OutcomeUnknown, match="may or may not") as caught:
        client.publish("t", b"x")
    assert caught.value.status == 500 and caught.value.retriable
    assert len(transport.sent) == 1


def test_a_pop_is_not_sent_again() -> None:
    # Its messages may have been leased to this worker already.
    transport = _unknown_once(Response(200, b"[]", "application/json"))
    client = Client("http://h:1", retry=RETRY, transport=transport)
    with pytest.raises(OutcomeUnknown):
        client.queue("t", "q").pop()
    assert len(transport.sent) == 1
