"""Plain messaging, black-box, through the real server and clients: where the topic
ends ("latest", the newest id in stats) and what a consumer starting there gets."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from tests.e2e.serverproc import ServerProcess
from tidings import Client, Record

pytestmark = pytest.mark.e2e


def payloads(messages: list) -> list[bytes]:  # type: ignore[type-arg]
    return [m.payload for m in messages]


def test_a_newest_message_past_its_own_ttl_is_not_the_end(
    server: ServerProcess, topic: str
) -> None:
    # The last entry of the topic expired (its own TTL) while older messages live: the
    # newest live message is the one before it, not none at all -- "none" made a
    # consumer starting at "latest" read the whole topic again.
    with Client(server.url) as client:
        client.create_topic(topic)
        client.publish(topic, [b"a", b"b"])
        client.publish(topic, Record(b"short-lived", ttl=1))
        client.publish(topic, Record(b"short-lived too", key=b"k", ttl=1))
        time.sleep(1.2)
        live = list(client.consume(topic, follow=False))
        assert payloads(live) == [b"a", b"b"]
        assert client.end(topic).newest_id == live[-1].id
        stats = client.stats(topic)
        assert stats.newest_id == live[-1].id
        assert stats.newest_time == live[-1].id.publish_ts
        for transactional in (True, False):
            latest = client.consume(
                topic, "latest", transactional=transactional, follow=True, wait=0.2
            )
            assert latest.poll() == []
            client.publish(topic, b"new")
            assert payloads(latest.poll()) == [b"new"]
            latest.close()


def test_latest_on_a_messaging_only_server_waits_for_an_open_transaction(
    start_server: Callable[..., ServerProcess], topic: str
) -> None:
    # A server without the transaction service cannot tell the last stable position
    # (stableKnown false): a read-committed consumer starting at "latest" must still
    # not start past the first entry of a transaction open now, or that transaction's
    # messages are never delivered to it once it commits.
    messaging = start_server("--role", "messaging")
    transactions = start_server("--role", "transactions")
    with Client(messaging.url, transactions_url=transactions.url) as client:
        client.create_topic(topic)
        client.publish(topic, [b"old-1", b"old-2"])
        tx = client.begin()
        client.publish(topic, [b"tx-1", b"tx-2"], write_pointer=tx.write_pointer)
        client.publish(topic, b"after the transaction's entry")
        end = client.end(topic)
        assert not end.stable_known
        latest = client.consume(topic, "latest", follow=True, wait=0.2)
        assert latest.poll() == []
        client.commit(tx)
        seen = payloads(latest.poll())
        assert seen == [b"tx-1", b"tx-2", b"after the transaction's entry"]
        client.publish(topic, b"new")
        assert payloads(latest.poll()) == [b"new"]
        latest.close()
        # With nothing open, "latest" is after the newest message, as before.
        quiet = client.consume(topic, "latest", follow=True, wait=0.2)
        assert quiet.poll() == []
        client.publish(topic, b"newer")
        assert payloads(quiet.poll()) == [b"newer"]
        quiet.close()
        # A transaction open on another topic only: nothing of this one is read again.
        other = topic + "-other"
        client.create_topic(other)
        elsewhere = client.begin()
        client.publish(other, b"elsewhere", write_pointer=elsewhere.write_pointer)
        after_other = client.consume(topic, "latest", follow=True, wait=0.2)
        assert after_other.poll() == []
        client.publish(topic, b"newest")
        assert payloads(after_other.poll()) == [b"newest"]
        after_other.close()
        client.commit(elsewhere)
