"""Idempotent producers' state on the server: expiry by the cleaner, retries, counts."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from tidings.clock import FakeClock
from tidings.messaging import MessagingConfig, MessagingService
from tidings.store import Store

NOW = 1_700_000_000_000
PRODUCER = bytes(range(16))


def test_a_producer_that_publishes_while_the_cleaner_runs_is_not_forgotten(
    store: Store,
) -> None:
    # The cleaner finds the producer idle past the expiry; before it deletes the record,
    # the producer comes back and publishes. Deleting the record now would make that
    # publish's retry (its answer lost) a second copy.
    clock = FakeClock(NOW)
    service = MessagingService(store, MessagingConfig(producer_expiry=60.0), clock=clock)
    try:
        service.create_topic("ns", "t")
        service.publish("ns", "t", [b"a"], producer=(PRODUCER, 5))
        clock.advance(61_000)
        apply = store.apply
        armed = [True]

        def publish_first(fn: Callable[[Any], Any]) -> Any:
            if armed[0]:
                armed[0] = False
                service.publish("ns", "t", [b"b"], producer=(PRODUCER, 6))
            return apply(fn)

        store.apply = publish_first  # type: ignore[method-assign]
        service.clean_once()
        store.apply = apply  # type: ignore[method-assign]
        assert not armed[0]
        service.publish("ns", "t", [b"b"], producer=(PRODUCER, 6))  # the retry
        assert [m.payload for m in service.fetch("ns", "t")] == [b"a", b"b"]
    finally:
        service.close()


def test_a_topic_created_while_the_cleaner_runs_keeps_its_producers(store: Store) -> None:
    # The cleaner also drops the records of deleted topics: a topic made after it
    # listed the live ones, and published to before it read the records, is no
    # deleted topic.
    clock = FakeClock(NOW)
    service = MessagingService(store, MessagingConfig(producer_expiry=60.0), clock=clock)
    try:
        read = store.read
        armed = [True]

        def create_first() -> Any:
            if armed[0] and sys._getframe(1).f_code.co_name == "_clean_producers":
                armed[0] = False
                service.create_topic("ns", "new")
                service.publish("ns", "new", [b"a"], producer=(PRODUCER, 0))
            return read()

        store.read = create_first  # type: ignore[method-assign]
        service.clean_once()
        store.read = read  # type: ignore[method-assign]
        assert not armed[0]
        service.publish("ns", "new", [b"a"], producer=(PRODUCER, 0))  # the retry
        assert [m.payload for m in service.fetch("ns", "new")] == [b"a"]
    finally:
        service.close()
