"""Publishes under ended transactions are refused, and the invalid list is pruned once
no entry names a pointer (a real ``tidings serve`` running both services)."""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx
import pytest

from tests.e2e.serverproc import ServerProcess
from tidings import Client
from tidings.errors import (
    TransactionAborted,
    TransactionCommitted,
    TransactionNotFound,
    TransactionTimedOut,
)

pytestmark = pytest.mark.e2e


def everything(client: Client, topic: str) -> list[bytes]:
    return [m.payload for m in client.poll(topic)]  # read-uncommitted: every entry


def test_publishing_under_an_ended_transaction_is_refused(client_url: str, topic: str) -> None:
    with Client(client_url) as client:
        client.create_topic(topic)
        committed = client.begin()
        client.publish(topic, [b"c"], write_pointer=committed.write_pointer)
        client.commit(committed)
        aborted = client.begin()
        client.abort(aborted)
        short = client.begin(timeout=0.2)
        time.sleep(0.4)
        cases = [
            (committed.write_pointer, TransactionCommitted),
            (aborted.write_pointer, TransactionAborted),
            (short.write_pointer, TransactionTimedOut),
            (committed.write_pointer - 10**12, TransactionNotFound),  # never begun
        ]
        for wp, error in cases:
            with pytest.raises(error):
                client.publish(topic, [b"late"], write_pointer=wp)
            with pytest.raises(error):  # a pointer publish of stored payloads too
                client.publish(topic, [], write_pointer=wp)
        # Nothing of them was written, not even invisibly.
        assert everything(client, topic) == [b"c"]
        r = httpx.post(
            f"{client_url}/v1/namespaces/default/topics/{topic}/publish",
            json={"messages": ["bGF0ZQ=="], "transactionWritePointer": committed.write_pointer},
        )
        assert r.status_code == 410 and r.json()["type"] == "TransactionCommitted"


@pytest.fixture
def client_url(server: ServerProcess) -> str:
    return server.url


def test_invalid_pointers_are_pruned_once_no_entry_names_them(
    start_server: Callable[..., ServerProcess], topic: str
) -> None:
    server = start_server(TIDINGS_TX_PRUNE_INTERVAL="0.3", TIDINGS_TX_SWEEP_INTERVAL="0.05")
    with Client(server.url) as client:
        client.create_topic(topic)
        # Timed out with an entry still published: it must stay invalid. (A timeout
        # long enough for the publish to get in first on a loaded machine.)
        kept = client.begin(timeout=2.5)
        info = client.publish(topic, [b"zombie"], write_pointer=kept.write_pointer)
        assert info is not None
        # Timed out having written nothing: nothing names it.
        empty = client.begin(timeout=0.3)

        def invalid() -> set[int]:
            return set(client.transactions().invalid)

        deadline = time.monotonic() + 10
        while kept.write_pointer not in invalid() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert kept.write_pointer in invalid()
        deadline = time.monotonic() + 10
        while empty.write_pointer in invalid() and time.monotonic() < deadline:
            time.sleep(0.1)
        state = client.transactions()
        assert empty.write_pointer not in state.invalid  # timed out, then pruned
        assert empty.write_pointer not in state.in_progress
        time.sleep(1.0)  # several passes more: the named pointer stays
        assert kept.write_pointer in invalid()
        assert client.poll(topic, transaction=client.snapshot()) == []

        # Rolled back, the entry no longer names it (its pointer is negative): pruned,
        # and a read-committed reader still never sees the entry.
        client.rollback(topic, info)
        deadline = time.monotonic() + 10
        while kept.write_pointer in invalid() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert kept.write_pointer not in invalid()
        assert client.poll(topic, transaction=client.snapshot()) == []
        assert everything(client, topic) == [b"zombie"]  # the entry is still there
        metrics = httpx.get(f"{server.url}/metrics").text
        assert "tidings_transactions_pruned_total 2.0" in metrics
        # The pruned pointer cannot be written again.
        with pytest.raises(TransactionTimedOut):
            client.publish(topic, [b"again"], write_pointer=kept.write_pointer)
