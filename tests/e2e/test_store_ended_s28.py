"""A store under a transaction that has ended is refused, as a publish under it is:
its rows could never be published, only take room until they expire."""

from __future__ import annotations

import pytest

from tests.e2e.serverproc import ServerProcess
from tidings import Client
from tidings.errors import TransactionAborted, TransactionCommitted, TransactionNotFound

pytestmark = pytest.mark.e2e


def test_a_store_under_an_ended_transaction_is_refused(server: ServerProcess) -> None:
    with Client(server.url) as client:
        client.create_topic("stored-late")
        aborted = client.begin()
        client.abort(aborted)
        committed = client.begin()
        client.commit(committed)
        with pytest.raises(TransactionAborted):
            client.store("stored-late", [b"late"], write_pointer=aborted.write_pointer)
        with pytest.raises(TransactionCommitted):
            client.store("stored-late", [b"late"], write_pointer=committed.write_pointer)
        with pytest.raises(TransactionNotFound):
            client.store("stored-late", [b"late"], write_pointer=2**62)
        # An open one still takes them.
        live = client.begin()
        client.store("stored-late", [b"on time"], write_pointer=live.write_pointer)
        client.abort(live)
