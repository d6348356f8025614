"""The service as a whole: concurrent publishers, listeners, counters, stats."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator

import pytest

from tidings.clock import FakeClock
from tidings.errors import TopicNotFound
from tidings.messaging import MessagingService, TopicCounters
from tidings.messaging.counters import LATENCY_BUCKETS, RateMeter
from tidings.store import Store
from tidings.structs import MessageId, Record, RollbackInfo

NOW = 1_700_000_000_000


@pytest.fixture
def service(store: Store) -> Iterator[MessagingService]:
    s = MessagingService(store)
    s.create_topic("ns", "t")
    yield s
    s.close()


def test_concurrent_publishers_lose_nothing_and_keep_order(service: MessagingService) -> None:
    threads, batches, size = 8, 15, 20
    infos: dict[int, list[RollbackInfo]] = {t: [] for t in range(threads)}
    errors: list[BaseException] = []

    def publisher(t: int) -> None:
        try:
            for b in range(batches):
                batch = [b"%d:%d:%d" % (t, b, i) for i in range(size)]
                if b % 3 == 2:
                    service.publish("ns", "t", batch)
                else:
                    info = service.publish("ns", "t", batch, write_pointer=1 + t * 1000 + b)
                    assert info is not None
                    infos[t].append(info)
        except BaseException as exc:
            errors.append(exc)

    workers = [threading.Thread(target=publisher, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert errors == []
    got = []
    start: MessageId | None = None
    while page := service.fetch("ns", "t", start=start, inclusive=False, limit=10_000):
        got.extend(page)
        start = page[-1].id
    assert len(got) == threads * batches * size  # nothing lost, nothing overwritten
    ids = [m.id for m in got]
    assert ids == sorted(set(ids))  # strictly increasing, no duplicates
    for t in range(threads):
        mine = [m.payload for m in got if m.payload.startswith(b"%d:" % t)]
        assert mine == [b"%d:%d:%d" % (t, b, i) for b in range(batches) for i in range(size)]
        # A batch acknowledged before the next was sent has smaller ids (commit order).
        ends = [(i.start_ts, i.start_seq, i.end_ts, i.end_seq) for i in infos[t]]
        assert all(a[2:] < b[:2] for a, b in itertools.pairwise(ends))
    # Each batch is contiguous: no other publisher's message lands inside it.
    by_batch = [m.payload.rsplit(b":", 1)[0] for m in got]
    runs = [k for i, k in enumerate(by_batch) if i == 0 or by_batch[i - 1] != k]
    assert len(runs) == threads * batches


def test_listeners_hear_durable_writes(service: MessagingService) -> None:
    heard: list[tuple[str, str]] = []
    service.add_listener(lambda ns, t: heard.append((ns, t)))

    def broken(ns: str, t: str) -> None:
        raise RuntimeError("listener bug")

    service.add_listener(broken)
    service.publish("ns", "t", [b"x"])
    service.store_payloads("ns", "t", 4, [b"y"])
    info = service.publish("ns", "t", [], write_pointer=4)
    assert info is not None
    service.rollback("ns", "t", info)
    with pytest.raises(TopicNotFound):
        service.publish("ns", "missing", [b"x"])
    assert heard == [("ns", "t")] * 4


def test_failed_writes_are_not_heard_or_counted(service: MessagingService, store: Store) -> None:
    heard: list[tuple[str, str]] = []
    service.add_listener(lambda ns, t: heard.append((ns, t)))
    other = MessagingService(store)
    service.publish("ns", "t", [b"cached"])
    other.delete_topic("ns", "t")  # behind this service's back: its cache says live
    with pytest.raises(TopicNotFound):
        service.publish("ns", "t", [b"x"])
    assert heard == [("ns", "t")]
    assert service.counters()[("ns", "t")].messages_published == 1


def test_publish_all_is_one_write_all_or_nothing(service: MessagingService, store: Store) -> None:
    heard: list[tuple[str, str]] = []
    service.add_listener(lambda ns, t: heard.append((ns, t)))
    service.create_topic("ns", "u")
    infos = service.publish_all_future(
        "ns", [("t", [b"t1", b"t2"]), ("u", [b"u1"]), ("t", [b"t3"])], write_pointer=7
    ).result()
    assert [info.write_pointer if info else None for info in infos] == [7, 7, 7]
    assert [m.payload for m in service.fetch("ns", "t")] == [b"t1", b"t2", b"t3"]
    assert [m.write_pointer for m in service.fetch("ns", "u")] == [7]
    assert sorted(set(heard)) == [("ns", "t"), ("ns", "u")]
    counters = service.counters()
    assert counters[("ns", "t")].messages_published == 3
    assert counters[("ns", "u")].messages_published == 1
    # One batch fails in the write (its topic was deleted behind this service's back):
    # the others are not written either.
    MessagingService(store).delete_topic("ns", "u")
    failed = service.publish_all_future("ns", [("t", [b"lost"]), ("u", [b"lost"])])
    with pytest.raises(TopicNotFound):
        failed.result()
    assert [m.payload for m in service.fetch("ns", "t")] == [b"t1", b"t2", b"t3"]
    assert service.counters()[("ns", "t")].messages_published == 3
    # Bad input is refused at once, before anything is submitted.
    with pytest.raises(TopicNotFound):
        service.publish_all_future("ns", [("t", [b"x"]), ("missing", [b"x"])])
    assert service.publish_all_future("ns", []).result() == []


def test_counters(service: MessagingService) -> None:
    assert service.counters() == {}
    service.publish("ns", "t", [b"abc", b"de"])
    service.store_payloads("ns", "t", 3, [Record(b"fgh")])
    service.fetch("ns", "t")
    service.fetch("ns", "t", limit=1)
    counters = service.counters()
    assert set(counters) == {("ns", "t")}
    c = counters[("ns", "t")]
    assert isinstance(c, TopicCounters)
    assert (c.messages_published, c.bytes_published) == (3, 8)
    assert (c.fetches, c.messages_fetched) == (2, 3)
    latency = c.publish_latency
    assert latency.count == 2 and sum(latency.counts) == 2 and latency.sum > 0
    assert latency.bounds == LATENCY_BUCKETS
    assert latency.cumulative()[-1] == (float("inf"), 2)
    service.publish("ns", "t", [b"more"])
    assert c.messages_published == 3  # a snapshot does not change afterwards


def test_rate_meter() -> None:
    meter = RateMeter(window=10)
    for second in range(100):
        meter.add(5, 1000.0 + second)
    assert meter.rate(1099.5) == pytest.approx(5.0)
    assert meter.rate(1200.0) == 0.0


def test_stats(store: Store) -> None:
    clock = FakeClock(NOW)
    service = MessagingService(store, clock=clock)
    service.create_topic("ns", "t")
    empty = service.stats("ns", "t")
    assert (empty.message_count, empty.bytes, empty.oldest_id, empty.newest_time) == (
        0,
        0,
        None,
        None,
    )
    service.publish("ns", "t", [b"a" * 10, b"b" * 5])
    clock.advance(7)
    service.store_payloads("ns", "t", 9, [b"c" * 3, b"d"])
    service.publish("ns", "t", [], write_pointer=9)
    service.fetch("ns", "t")
    stats = service.stats("ns", "t")
    assert (stats.namespace, stats.topic) == ("ns", "t")
    assert (stats.message_count, stats.bytes) == (4, 19)
    assert stats.oldest_id == MessageId(NOW, 0)
    assert stats.newest_id is not None and stats.newest_id.publish_ts == NOW + 7
    assert (stats.oldest_time, stats.newest_time) == (NOW, NOW + 7)
    assert (stats.messages_published, stats.bytes_published, stats.fetches) == (4, 19, 1)
    assert stats.publish_rate > 0 and stats.fetch_rate > 0
    with pytest.raises(TopicNotFound):
        service.stats("ns", "missing")


def test_close_leaves_the_store_open(service: MessagingService, store: Store) -> None:
    service.start()
    service.close()
    service.publish("ns", "t", [b"still works"])
    assert store.scan_list("messages", b"", b"\xff")
