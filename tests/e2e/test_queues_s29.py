"""Queues across a server restart, through the real server and the real client: acks
made in a transaction that committed before the restart, whose lease record no write
has put as resolved yet."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.e2e.serverproc import ServerProcess
from tidings import Client
from tidings.errors import NotDelivered

pytestmark = pytest.mark.e2e


def test_a_restart_forgets_who_acked_in_a_committed_transaction_and_counts_it_no_more(
    start_server: Callable[..., ServerProcess], topic: str
) -> None:
    server = start_server()
    with Client(server.url) as client:
        client.create_topic(topic)
        client.publish(topic, [b"a", b"b"])
        mine = client.queue(topic, "q", ack_timeout=600)
        batch = mine.pop(2)
        with client.transaction() as tx:
            mine.ack(batch[:1], transaction=tx)
        # The commit resolves at the queue's next call, which writes nothing: the
        # record under the transaction's pointer is what the store has.
        assert mine.stats().acked == 1
        cid = mine.consumer_id
    for _ in range(2):  # and after each restart alike
        server.kill()
        server.start()
        with Client(server.url) as client:
            stats = client.describe_queue(topic, "q")
            # Acked before this server started: not one of its acks.
            assert (stats.acked, stats.pending, stats.waiting) == (0, 1, 0)
            assert stats.consumers == {cid: 1}
    with Client(server.url) as client:
        # Who acked it is forgotten, as for any ack before a restart: another worker's
        # ack is answered as done, a transactional one is refused as never delivered.
        other = client.queue(topic, "q")
        other.ack(batch[:1])
        with pytest.raises(NotDelivered), client.transaction() as tx:
            other.ack(batch[:1], transaction=tx)
        again = client.queue(topic, "q")
        again.consumer_id = cid
        again.ack(batch)
        stats = client.describe_queue(topic, "q")
        assert (stats.acked, stats.pending, stats.waiting) == (1, 0, 0)
