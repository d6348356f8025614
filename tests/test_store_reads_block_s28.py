"""Which stores' reads must stay off an event loop: the server asks once at its start
(``Api.reads_block``) and keeps the embedded stores' reads on the loop, where they are
cheaper than a hand-over to a thread."""

from __future__ import annotations

from tidings.store.backend import Store


def test_only_a_store_over_the_network_says_its_reads_block(store: Store) -> None:
    expected = type(store).__name__ == "PostgresStore"
    assert store.reads_block is expected
