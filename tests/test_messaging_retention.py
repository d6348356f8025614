"""Retention: fetch hides expired messages; the cleaner deletes them in bounded batches."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from tidings.clock import FakeClock
from tidings.codec import keys
from tidings.messaging import MessagingConfig, MessagingService
from tidings.store import Store
from tidings.structs import MessageId, Record

NOW = 1_700_000_000_000


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(NOW)


@pytest.fixture
def service(store: Store, clock: FakeClock) -> Iterator[MessagingService]:
    s = MessagingService(store, MessagingConfig(cleanup_batch=4), clock=clock)
    s.create_topic("ns", "t", {"ttl": 10})
    yield s
    s.close()


def count(store: Store, table: str) -> int:
    return len(store.scan_list(table, b"", b"\xff" * 30))


def test_fetch_never_returns_messages_older_than_the_ttl(
    service: MessagingService, clock: FakeClock
) -> None:
    service.publish("ns", "t", [b"old"])
    service.store_payloads("ns", "t", 5, [b"stored-old"])
    clock.advance(6_000)
    service.publish("ns", "t", [b"new"])
    service.publish("ns", "t", [], write_pointer=5)
    assert [m.payload for m in service.fetch("ns", "t")] == [b"old", b"new", b"stored-old"]
    clock.advance(4_001)  # "old" and the stored payload are now past the 10 s ttl
    assert [m.payload for m in service.fetch("ns", "t")] == [b"new"]
    assert [m.payload for m in service.fetch("ns", "t", start=0)] == [b"new"]
    assert [m.payload for m in service.fetch("ns", "t", start=MessageId(0, 0))] == [b"new"]


def test_per_message_ttl_only_shortens(service: MessagingService, clock: FakeClock) -> None:
    service.publish("ns", "t", [Record(b"short", ttl=2), Record(b"long", ttl=3600), b"plain"])
    service.store_payloads("ns", "t", 7, [Record(b"stored-short", ttl=2), b"stored"])
    service.publish("ns", "t", [], write_pointer=7)
    clock.advance(2_000)
    assert [m.payload for m in service.fetch("ns", "t")] == [b"long", b"plain", b"stored"]
    clock.advance(9_000)  # the topic ttl wins over the longer per-message one
    assert service.fetch("ns", "t") == []


def test_update_of_ttl_applies_at_once(service: MessagingService, clock: FakeClock) -> None:
    service.publish("ns", "t", [b"x"])
    clock.advance(5_000)
    service.update_topic("ns", "t", {"ttl": 3})
    assert service.fetch("ns", "t") == []
    service.update_topic("ns", "t", {"ttl": 100})
    assert [m.payload for m in service.fetch("ns", "t")] == [b"x"]


def test_cleaner_deletes_expired_rows_of_both_tables(
    service: MessagingService, store: Store, clock: FakeClock
) -> None:
    for i in range(10):  # one row each (a publish of several is one batch entry)
        service.publish("ns", "t", [b"%d" % i])
    service.store_payloads("ns", "t", 5, [b"s%d" % i for i in range(6)])
    service.publish("ns", "t", [], write_pointer=5)
    service.store_payloads("ns", "t", 6, [b"unpublished"])
    clock.advance(5_000)
    service.publish("ns", "t", [b"young"])
    service.store_payloads("ns", "t", 6, [b"young-stored"])
    service.store_payloads("ns", "t", 8, [b"young-stored-2"])
    assert service.clean_once().messages_deleted == 0
    before = service.fetch("ns", "t", limit=100)
    clock.advance(5_001)
    report = service.clean_once()
    assert report.messages_deleted == 11
    assert report.payloads_deleted == 7
    assert report.batches >= 5  # batches of at most 4 rows
    assert count(store, "messages") == 1
    assert count(store, "payloads") == 2
    assert [m.payload for m in service.fetch("ns", "t")] == [b"young"]
    assert before[-1].payload == b"young"
    again = service.clean_once()
    assert (again.messages_deleted, again.payloads_deleted, again.batches) == (0, 0, 0)


def test_cleaner_deletes_rows_past_their_own_expiry(
    service: MessagingService, store: Store, clock: FakeClock
) -> None:
    service.update_topic("ns", "t", {"ttl": 3600})
    service.publish("ns", "t", [Record(b"m%d" % i, ttl=1) for i in range(5)] + [b"keep"])
    service.store_payloads("ns", "t", 4, [Record(b"s", ttl=1), b"keep-stored"])
    clock.advance(1_000)
    report = service.clean_once()
    assert (report.messages_deleted, report.payloads_deleted) == (5, 1)
    assert count(store, "messages") == 1
    assert count(store, "payloads") == 1
    index = store.scan_list("metadata", keys.EXPIRY_PREFIX, keys.EXPIRY_PREFIX + b"\xff")
    assert index == []


def test_cleaner_drops_older_generations(
    service: MessagingService, store: Store, clock: FakeClock
) -> None:
    service.publish("ns", "t", [b"g1-%d" % i for i in range(9)])
    service.store_payloads("ns", "t", 3, [b"g1-stored"])
    service.delete_topic("ns", "t")
    service.create_topic("ns", "t", {"ttl": 10})
    service.publish("ns", "t", [b"g2"])
    service.create_topic("ns", "gone")
    service.publish("ns", "gone", [b"x"] * 5)
    service.delete_topic("ns", "gone")
    report = service.clean_once()
    assert report.topics == 2
    assert report.messages_deleted == 2  # rows: each publish of several is one batch entry
    assert report.payloads_deleted == 1
    assert count(store, "messages") == 1
    assert count(store, "payloads") == 0
    assert [m.payload for m in service.fetch("ns", "t")] == [b"g2"]


def test_background_cleaner_runs_and_stops(store: Store, clock: FakeClock) -> None:
    service = MessagingService(store, MessagingConfig(cleanup_interval=0.02), clock=clock)
    service.create_topic("ns", "t", {"ttl": 1})
    service.publish("ns", "t", [b"x"])
    clock.advance(2_000)
    service.start()
    service.start()  # idempotent
    deadline = time.monotonic() + 5
    while count(store, "messages") and time.monotonic() < deadline:
        time.sleep(0.01)
    service.close()
    assert count(store, "messages") == 0
    service.close()  # idempotent


def test_publishing_interleaves_with_cleaning(store: Store, clock: FakeClock) -> None:
    """Each cleaner batch is its own write, so a publish queued meanwhile goes first."""
    service = MessagingService(store, MessagingConfig(cleanup_batch=10), clock=clock)
    service.create_topic("ns", "t", {"ttl": 1})
    for _ in range(100):  # a row each
        service.publish("ns", "t", [b"x"])
    clock.advance(2_000)
    published: list[int] = []
    original = store.apply

    def apply_and_publish(fn):  # type: ignore[no-untyped-def]
        result = original(fn)
        if len(published) < 3:
            service.publish("ns", "t", [b"during"])
            published.append(1)
        return result

    store.apply = apply_and_publish  # type: ignore[method-assign]
    report = service.clean_once()
    assert report.batches >= 10
    assert [m.payload for m in service.fetch("ns", "t")] == [b"during"] * 3


def seals(store: Store) -> int:
    return len(store.scan_list("metadata", keys.SEALED_PREFIX, keys.SEALED_PREFIX + b"\xff"))


def test_cleaner_drops_seal_markers_with_the_ttl_and_the_generation(
    service: MessagingService, store: Store, clock: FakeClock
) -> None:
    service.store_payloads("ns", "t", 5, [b"p"])
    service.publish("ns", "t", [], write_pointer=5)
    assert seals(store) == 1
    service.clean_once()
    assert seals(store) == 1  # still within the ttl: a late store must still be refused
    clock.advance(10_001)
    service.clean_once()
    assert seals(store) == 0
    service.store_payloads("ns", "t", 6, [b"q"])
    service.publish("ns", "t", [], write_pointer=6)
    service.delete_topic("ns", "t")
    service.create_topic("ns", "t")
    service.clean_once()
    assert seals(store) == 0  # the old generation's marker went with its rows


def test_idle_producers_are_forgotten(store: Store, clock: FakeClock) -> None:
    config = MessagingConfig(cleanup_batch=4, producer_expiry=60.0)
    service = MessagingService(store, config, clock=clock)
    try:
        service.create_topic("ns", "t")
        producer = bytes(16)
        service.publish("ns", "t", [b"a"], producer=(producer, 5))
        service.publish("ns", "t", [b"a"], producer=(producer, 5))  # a retry: no copy
        assert len(service.fetch("ns", "t")) == 1
        clock.advance(30_000)
        service.clean_once()
        service.publish("ns", "t", [b"a"], producer=(producer, 5))  # still known
        assert len(service.fetch("ns", "t")) == 1
        clock.advance(61_000)
        service.clean_once()
        # Forgotten: the same number starts a new sequence (and is written).
        service.publish("ns", "t", [b"b"], producer=(producer, 5))
        assert [m.payload for m in service.fetch("ns", "t")] == [b"a", b"b"]
    finally:
        service.close()
