"""The cap on open transactions through the real server and clients (``tx_max_open``)."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest

from tests.e2e.serverproc import ServerProcess
from tidings import Client
from tidings.errors import ConfigError, TooManyTransactions
from tidings.server.config import load_config

pytestmark = pytest.mark.e2e


def _metric(url: str, name: str) -> float:
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"no metric {name}")


def test_begins_beyond_the_cap_are_refused_with_a_retriable_503_that_changes_nothing(
    start_server: Callable[..., ServerProcess], topic: str
) -> None:
    server = start_server(TIDINGS_TX_MAX_OPEN="2")
    with Client(server.url) as client:
        client.create_topic(topic)
        first, second = client.begin(), client.begin()
        before = client.transactions()

        with pytest.raises(TooManyTransactions) as caught:
            client.begin()
        assert caught.value.retriable
        answer = httpx.post(f"{server.url}/v1/transactions", json={})
        assert answer.status_code == 503 and answer.headers["retry-after"] == "1"
        assert answer.json()["type"] == "TooManyTransactions"
        assert "tx_max_open" in answer.json()["error"]

        # A transaction in one request takes a slot too: refused before anything is
        # written, so nothing of it is ever seen, not even uncommitted.
        with pytest.raises(TooManyTransactions):
            client.publish_transaction({topic: [b"one-request"]})
        # The context's commit in one request is refused the same way, and the client
        # keeps sending one-request transactions to this server afterwards.
        with pytest.raises(TooManyTransactions), client.transaction() as tx:
            tx.publish(topic, b"context")
        assert client._one_request_transactions()

        assert client.transactions() == before
        assert [m.payload for m in client.poll(topic)] == []
        assert _metric(server.url, "tidings_transactions_refused_total") >= 4

        # Ending a transaction frees its slot.
        client.abort(first)
        with client.transaction() as tx:
            tx.publish(topic, b"fits")
        client.commit(second)
        third = client.begin()
        client.abort(third)
        assert [m.payload for m in client.poll(topic, isolation="read_committed")] == [b"fits"]


@pytest.mark.parametrize("bad", ["0", "-3", "many"])
def test_the_cap_must_be_a_positive_integer(bad: str) -> None:
    with pytest.raises(ConfigError, match=r"tx_max_open|TIDINGS_TX_MAX_OPEN"):
        load_config({}, env={"TIDINGS_TX_MAX_OPEN": bad})
