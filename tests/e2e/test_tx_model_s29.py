"""Transactions, read-committed visibility and the last stable position through the
real server and client."""

from __future__ import annotations

from collections.abc import Iterable

import httpx
import pytest

from tests.e2e.serverproc import ServerProcess
from tidings import Client
from tidings.client import Consumer
from tidings.errors import ProducerFenced, TransactionInvalid
from tidings.structs import Transaction

pytestmark = pytest.mark.e2e


class ChangeKeys:
    """A participant of a client transaction that wrote ``keys`` (for conflicts)."""

    def __init__(self, keys: frozenset[bytes]) -> None:
        self.keys = keys

    def start(self, transaction: Transaction) -> None:
        del transaction

    def changes(self) -> Iterable[bytes]:
        return self.keys

    def commit(self) -> None:
        pass

    def post_commit(self) -> None:
        pass

    def rollback(self) -> None:
        pass


def test_an_aborted_transaction_leaves_the_last_stable_position(
    server: ServerProcess, topic: str
) -> None:
    # An aborted transaction counted as open until some later transaction committed:
    # the topic's stats, end and read-committed polls named its first (rolled back)
    # entry as the last stable position, and a reader starting at "latest" started
    # there, returning messages published before it started.
    with Client(server.url) as client:
        client.create_topic(topic)
        tx = client.begin()
        client.rollback(topic, client.publish(topic, b"aborted", write_pointer=tx.write_pointer))
        client.abort(tx)
        client.publish(topic, b"before")
        assert client.stats(topic).last_stable_id is None
        assert client.end(topic).last_stable_id is None
        answer = httpx.post(
            f"{server.url}/v1/namespaces/default/topics/{topic}/poll",
            params={"isolation": "read_committed"},
            json={},
        )
        assert "Tidings-Last-Stable-Id" not in answer.headers
        latest = client.consume(topic, "latest", wait=0.0)
        assert isinstance(latest, Consumer)
        assert latest.poll() == []
        client.publish(topic, b"after")
        assert [m.payload for m in latest.poll()] == [b"after"]
        latest.close()


def test_a_producer_fenced_during_its_transaction_gets_producer_fenced(
    server: ServerProcess, topic: str
) -> None:
    # A zombie whose transactional id was registered again while its transaction was
    # open got TransactionInvalid (its publish at commit was refused), with a note
    # that the transaction "becomes invalid when it times out", which it already was.
    with Client(server.url) as client:
        client.create_topic(topic)
        first = client.register_producer("zombie-" + topic)
        for participants in ((), (ChangeKeys(frozenset({b"k"})),)):
            with (
                pytest.raises(ProducerFenced) as raised,
                client.transaction(*participants, producer=first, defer_begin=False) as tx,
            ):
                tx.publish(topic, b"zombie")
                first = client.register_producer("zombie-" + topic)
            assert isinstance(raised.value.__cause__, TransactionInvalid)
            assert "times out" not in "".join(getattr(raised.value, "__notes__", []))
            assert tx.state == "aborted"
        assert client.poll(topic) == []
