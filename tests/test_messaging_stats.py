"""Topic stats without a scan: count and payload bytes kept in the topic's state.

What ``stats()`` reports must equal what a non-transactional fetch returns once the
cleaner has run (until then, rows past the TTL or their own expiry still count).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidings.clock import FakeClock
from tidings.codec import keys, values
from tidings.codec.values import Seal, Tally, TopicState
from tidings.errors import PayloadsAlreadyPublished
from tidings.messaging import MessagingConfig, MessagingService
from tidings.store import MemoryStore, Store
from tidings.store.backend import WriteView
from tidings.structs import MessageId, PayloadRange, Record, RollbackInfo

NOW = 1_700_000_000_000
TTL = 10  # seconds
PROPERTY = settings(max_examples=100, deadline=None)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(NOW)


@pytest.fixture
def service(store: Store, clock: FakeClock) -> Iterator[MessagingService]:
    s = MessagingService(store, MessagingConfig(cleanup_batch=3), clock=clock)
    s.create_topic("ns", "t", {"ttl": TTL})
    yield s
    s.close()


def counts(service: MessagingService) -> tuple[int, int]:
    stats = service.stats("ns", "t")
    return stats.message_count, stats.bytes


def fetched(service: MessagingService) -> tuple[int, int]:
    """Brute force: every message a non-transactional reader gets, and their bytes."""
    messages = size = 0
    start: MessageId | None = None
    while page := service.fetch("ns", "t", start=start, inclusive=False, limit=10_000):
        messages += len(page)
        size += sum(len(m.payload) for m in page)
        start = page[-1].id
    return messages, size


def state(store: Store) -> TopicState:
    raw = store.get("metadata", keys.state_key(1))
    assert raw is not None
    return values.decode_state(raw)


def metadata(store: Store, prefix: bytes) -> list[tuple[bytes, bytes]]:
    return store.scan_list("metadata", prefix, prefix + b"\xff")


# --- codec ------------------------------------------------------------------------


def test_state_version_2_round_trips_and_version_1_reads_as_unknown() -> None:
    current = TopicState(3, 60, NOW, 7, NOW - 1, 2, 1234, 99_999)
    assert values.decode_state(values.encode_state(current)) == current
    assert len(values.encode_state(current)) == 49
    old = struct.pack(">BiQQHQH", 1, 3, 60, NOW, 7, NOW - 1, 2)
    assert values.decode_state(old) == TopicState(
        3, 60, NOW, 7, NOW - 1, 2, values.UNKNOWN, values.UNKNOWN
    )
    with pytest.raises(ValueError):
        values.decode_state(b"\x09" + old[1:])


def test_seal_and_tally_values_round_trip() -> None:
    ranges = (PayloadRange(NOW, 0, NOW, 4), PayloadRange(NOW + 1, 0, NOW + 2, 9))
    for seal in (Seal(NOW, 5, 50), Seal(NOW, 0, 0, ranges)):
        assert values.decode_seal(values.encode_seal(seal)) == seal
        assert values.seal_time(values.encode_seal(seal)) == NOW
    legacy = NOW.to_bytes(8, "big")
    assert values.decode_seal(legacy) == Seal(NOW, values.UNKNOWN, values.UNKNOWN)
    assert values.seal_time(legacy) == NOW
    tally = Tally(NOW, 3, 4, 400)
    assert values.decode_tally(values.encode_tally(tally)) == tally
    key = keys.tally_key(1, 2, 3, NOW, 0)
    start, stop = keys.tally_range(1, 2, 3)
    assert start <= key < stop
    low, high = keys.tallies_range(1, 2, 3)
    assert low <= key < high


# --- publishing --------------------------------------------------------------------


def test_direct_publishes_add_count_and_payload_bytes(service: MessagingService) -> None:
    assert counts(service) == (0, 0)
    service.publish("ns", "t", [b"a" * 10, b"b" * 5])
    service.publish("ns", "t", [b"c" * 3], write_pointer=4)
    service.publish(
        "ns",
        "t",
        [
            Record(b"keyed", key=b"k" * 50),
            Record(b"headed", headers={"h": b"v" * 40}),
            Record(b"brief", ttl=3600),
        ],
    )
    # Payload bytes only: keys, headers and the stored encoding do not count.
    assert counts(service) == (6, 10 + 5 + 3 + 5 + 6 + 5) == fetched(service)


def test_direct_publish_writes_nothing_more_than_before(
    service: MessagingService, store: Store
) -> None:
    before = metadata(store, b"msg.")
    service.publish("ns", "t", [b"x"] * 3)
    after = metadata(store, b"msg.")
    assert len(after) == len(before)  # only the state record changed
    assert state(store).message_count == 3


def test_stores_count_once_their_pointer_is_published(
    service: MessagingService, store: Store
) -> None:
    service.store_payloads("ns", "t", 5, [b"p" * 4, b"q" * 6])
    service.store_payloads("ns", "t", 5, [Record(b"r" * 2, key=b"key")])
    assert counts(service) == (0, 0)  # stored is not visible
    assert len(metadata(store, keys.TALLY_PREFIX)) == 2
    service.publish("ns", "t", [], write_pointer=5)
    assert counts(service) == (3, 12) == fetched(service)
    assert metadata(store, keys.TALLY_PREFIX) == []  # the seal marker stands for them
    ((_, raw),) = metadata(store, keys.SEALED_PREFIX)
    assert values.decode_seal(raw) == Seal(NOW, 3, 12)


def test_ranged_publish_counts_only_the_rows_it_exposes(service: MessagingService) -> None:
    first = service.store_payloads("ns", "t", 5, [b"a" * 1, b"b" * 2, b"c" * 3])
    failed = service.store_payloads("ns", "t", 5, [b"x" * 100])  # an attempt that failed
    third = service.store_payloads("ns", "t", 5, [b"d" * 4, b"e" * 5])
    assert failed.first_ts == NOW
    service.publish("ns", "t", [], write_pointer=5, payload_ranges=[first, third])
    assert counts(service) == (5, 15) == fetched(service)


def test_ranges_that_cut_stores_count_the_rows_inside(service: MessagingService) -> None:
    first = service.store_payloads("ns", "t", 5, [b"a" * 1, b"b" * 2, b"c" * 3])
    second = service.store_payloads("ns", "t", 5, [b"d" * 4, b"e" * 5, b"f" * 6])
    ranges = [
        PayloadRange(first.first_ts, first.first_seq + 1, first.last_ts, first.last_seq + 1),
        PayloadRange(second.first_ts, second.first_seq + 2, second.last_ts, second.last_seq + 9),
    ]
    service.publish("ns", "t", [], write_pointer=5, payload_ranges=ranges)
    # b, c and d (the first range reaches into the second store), then f.
    assert counts(service) == (4, 2 + 3 + 4 + 6) == fetched(service)


def test_rollback_changes_no_count(service: MessagingService) -> None:
    info = service.publish("ns", "t", [b"abc", b"de"], write_pointer=3)
    service.store_payloads("ns", "t", 4, [b"stored"])
    pointer = service.publish("ns", "t", [], write_pointer=4)
    assert info is not None and pointer is not None
    before = counts(service)
    assert service.rollback("ns", "t", info) == 2
    assert service.rollback("ns", "t", pointer) == 1
    # Non-transactional readers still get rolled-back entries.
    assert counts(service) == before == (3, 11) == fetched(service)


def test_a_second_pointer_publish_changes_no_count(service: MessagingService) -> None:
    service.store_payloads("ns", "t", 5, [b"once"])
    service.publish("ns", "t", [], write_pointer=5)
    with pytest.raises(PayloadsAlreadyPublished):
        service.publish("ns", "t", [], write_pointer=5)
    assert counts(service) == (1, 4) == fetched(service)


# --- the cleaner ---------------------------------------------------------------------


def test_retention_takes_off_exactly_what_it_deletes(
    service: MessagingService, store: Store, clock: FakeClock
) -> None:
    service.publish("ns", "t", [b"old-%d" % i for i in range(7)])  # 7 x 5 bytes
    service.store_payloads("ns", "t", 5, [b"old-stored", b"x"])
    service.publish("ns", "t", [], write_pointer=5)
    clock.advance(6_000)
    service.publish("ns", "t", [b"young"])
    service.store_payloads("ns", "t", 6, [b"young-stored"])
    service.publish("ns", "t", [], write_pointer=6)
    assert counts(service) == (11, 35 + 11 + 5 + 12) == fetched(service)
    clock.advance(4_001)  # the first half is past the TTL: fetch hides it at once ...
    assert fetched(service) == (2, 17)
    assert counts(service) == (11, 63)  # ... and it counts until the cleaner deletes it
    report = service.clean_once()
    # Rows: the batch entry of the seven and the pointer entry; the counts take off all.
    assert (report.messages_deleted, report.payloads_deleted) == (2, 2)
    assert counts(service) == (2, 17) == fetched(service)
    clock.advance(6_000)
    service.clean_once()
    assert counts(service) == (0, 0) == fetched(service)
    assert metadata(store, keys.SEALED_PREFIX) == []


def test_per_message_expiry_in_the_message_table(
    service: MessagingService, clock: FakeClock
) -> None:
    service.publish("ns", "t", [Record(b"short", ttl=1), Record(b"long", ttl=5), b"plain"])
    clock.advance(1_000)
    assert fetched(service) == (2, 9)
    assert counts(service) == (3, 14)
    service.clean_once()
    assert counts(service) == (2, 9) == fetched(service)
    clock.advance(4_000)
    service.clean_once()
    assert counts(service) == (1, 5) == fetched(service)


def test_per_message_expiry_in_the_payload_table(
    service: MessagingService, store: Store, clock: FakeClock
) -> None:
    service.store_payloads("ns", "t", 5, [Record(b"short", ttl=1), b"kept"])
    exposed = service.store_payloads("ns", "t", 6, [Record(b"a", ttl=1), b"bb"])
    service.store_payloads("ns", "t", 6, [Record(b"outside", ttl=1)])
    service.publish("ns", "t", [], write_pointer=5)
    service.publish("ns", "t", [], write_pointer=6, payload_ranges=[exposed])
    service.store_payloads("ns", "t", 7, [Record(b"never", ttl=1), b"later"])
    service.store_payloads("ns", "t", 8, [Record(b"all", ttl=1), Record(b"gone", ttl=1)])
    assert counts(service) == (4, 12) == fetched(service)
    clock.advance(1_000)
    service.clean_once()
    assert len(metadata(store, keys.TALLY_PREFIX)) == 1  # pointer 8's went with its rows
    # "short" and "a" leave the counts and their markers; "outside" was never counted.
    assert counts(service) == (2, 6) == fetched(service)
    seals = {k: values.decode_seal(v) for k, v in metadata(store, keys.SEALED_PREFIX)}
    assert sorted((s.message_count, s.payload_bytes) for s in seals.values()) == [(1, 2), (1, 4)]
    # The unpublished store's tally lost "never": publishing it later adds "later" only.
    service.publish("ns", "t", [], write_pointer=7)
    service.publish("ns", "t", [], write_pointer=8)
    assert counts(service) == (3, 11) == fetched(service)


def test_unpublished_stores_leave_no_tally_behind(
    service: MessagingService, store: Store, clock: FakeClock
) -> None:
    service.store_payloads("ns", "t", 5, [b"abandoned"] * 4)
    assert len(metadata(store, keys.TALLY_PREFIX)) == 1
    clock.advance(TTL * 1000 + 1)
    service.clean_once()
    assert metadata(store, keys.TALLY_PREFIX) == []
    assert counts(service) == (0, 0)


def test_a_stray_tally_goes_with_the_ttl(
    service: MessagingService, store: Store, clock: FakeClock
) -> None:
    # A tally no row matches (its rows went some other way) must not stay for ever.
    stray = keys.tally_key(1, 1, 9, NOW, 0)
    store.apply(lambda view: view.put("metadata", stray, values.encode_tally(Tally(NOW, 0, 1, 1))))
    clock.advance(TTL * 1000 + 1)
    service.clean_once()
    assert metadata(store, keys.TALLY_PREFIX) == []


def test_a_recreated_topic_starts_at_zero(
    service: MessagingService, store: Store, clock: FakeClock
) -> None:
    service.publish("ns", "t", [b"first generation"])
    service.store_payloads("ns", "t", 5, [b"stored"])
    service.delete_topic("ns", "t")
    service.create_topic("ns", "t", {"ttl": TTL})
    assert counts(service) == (0, 0) == fetched(service)
    service.clean_once()  # drops the old generation, tallies included
    assert counts(service) == (0, 0)
    assert metadata(store, keys.TALLY_PREFIX) == []
    service.publish("ns", "t", [b"second"])
    assert counts(service) == (1, 6) == fetched(service)


# --- data from before counts were kept ----------------------------------------------


def make_legacy(store: Store) -> None:
    """Rewrite the store as a version that kept no counts wrote it: state version 1,
    8-byte seal markers, no tallies."""

    def rewrite(view: WriteView) -> None:
        raw = view.get("metadata", keys.state_key(1))
        assert raw is not None
        current = values.decode_state(raw)
        old = struct.pack(">BiQQHQH", 1, *current[:6])
        view.put("metadata", keys.state_key(1), old)
        for key, raw in list(view.scan("metadata", keys.SEALED_PREFIX, b"msg.sealed0")):
            view.put("metadata", key, raw[:8])
        view.delete_range("metadata", keys.TALLY_PREFIX, b"msg.tally0")

    store.apply(rewrite)


def test_a_topic_from_before_counts_is_counted_once(
    service: MessagingService, store: Store, clock: FakeClock
) -> None:
    service.publish("ns", "t", [b"direct", Record(b"keyed", key=b"k", ttl=1)], write_pointer=2)
    a = service.store_payloads("ns", "t", 5, [b"a1", b"a22"])
    service.store_payloads("ns", "t", 5, [b"not-published"])
    service.publish("ns", "t", [], write_pointer=5, payload_ranges=[a])
    service.store_payloads("ns", "t", 6, [b"all", b"of", b"these"])
    service.publish("ns", "t", [], write_pointer=6)
    service.store_payloads("ns", "t", 7, [b"pending"])
    make_legacy(store)
    assert state(store).message_count == values.UNKNOWN
    service.publish("ns", "t", [b"after-upgrade"])  # keeps the counts unknown
    service.store_payloads("ns", "t", 7, [b"post"])  # a tally beside rows without one
    service.clean_once()  # and so does the cleaner
    assert state(store).message_count == values.UNKNOWN
    assert counts(service) == fetched(service) == (8, 6 + 5 + 2 + 3 + 3 + 2 + 5 + 13)
    assert state(store).message_count == 8  # now kept: the next stats() reads no rows
    seals = sorted(values.decode_seal(v) for _, v in metadata(store, keys.SEALED_PREFIX))
    assert [(s.message_count, s.payload_bytes, s.ranges) for s in seals] == [
        (2, 5, (a,)),
        (3, 10, None),
    ]
    # The counts stay right from here: expiry, a pointer stored before, retention.
    clock.advance(1_000)
    service.clean_once()
    assert counts(service) == fetched(service) == (7, 34)
    service.publish("ns", "t", [], write_pointer=7)
    assert counts(service) == fetched(service) == (9, 45)
    clock.advance(TTL * 1000)
    service.clean_once()
    assert counts(service) == fetched(service) == (0, 0)


# --- the property ----------------------------------------------------------------------

positions = st.integers(0, 40)
message = st.tuples(
    st.integers(0, 20),  # payload size
    st.one_of(st.none(), st.integers(1, 4)),  # per-message ttl, seconds
    st.booleans(),  # a key (does not count)
)
#: Which write pointer: 0 a new one (for a store) or the newest (for a publish), n the
#: n-th newest; so that publishes mostly find stores, and some find none or a sealed one.
pointers = st.integers(0, 3)
operation = st.one_of(
    st.tuples(st.just("publish"), st.lists(message, min_size=1, max_size=4), st.booleans()),
    st.tuples(st.just("store"), pointers, st.lists(message, min_size=1, max_size=4)),
    st.tuples(st.just("seal"), pointers, st.none()),
    st.tuples(st.just("seal"), pointers, st.lists(positions, min_size=1, max_size=6)),
    st.tuples(st.just("rollback"), st.integers(0, 10), st.none()),
    st.tuples(st.just("advance"), st.sampled_from([4_000, 7_000]), st.none()),
    st.tuples(st.just("clean"), st.none(), st.none()),
    st.tuples(st.just("ttl"), st.integers(2, 12), st.none()),
)
#: Each operation comes after a step of the clock (often none) and maybe a cleaner pass,
#: so that messages expire and go between the others, not only at explicit jumps.
operations = st.lists(
    st.tuples(st.sampled_from([0, 0, 500, 1_000, 2_500]), st.booleans(), operation),
    min_size=4,
    max_size=40,
)


@dataclass
class Model:
    """What the property test remembers between operations (not what it expects)."""

    stored: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    pointers: list[int] = field(default_factory=list)
    infos: list[RollbackInfo] = field(default_factory=list)
    next_wp: int = 1

    def new_pointer(self) -> int:
        self.next_wp += 1
        return self.next_wp

    def pointer(self, which: int, new: bool) -> int:
        if new or not self.pointers:
            self.pointers.append(self.new_pointer())
            return self.pointers[-1]
        return self.pointers[-1 - which % len(self.pointers)]


def records(batch: list[tuple[int, int | None, bool]]) -> list[Record | bytes]:
    out: list[Record | bytes] = []
    for i, (size, ttl, keyed) in enumerate(batch):
        payload = bytes([65 + i % 26]) * size
        out.append(Record(payload, b"k" if keyed else None, ttl=ttl) if ttl or keyed else payload)
    return out


def ranges_at(rows: list[tuple[int, int]], picks: list[int]) -> list[PayloadRange]:
    """Ranges from pairs of the picked row positions: sorted and never overlapping, so
    they cover whole stores, cut them, span two, or name rows that are gone."""
    chosen = sorted({rows[p % len(rows)] for p in picks})
    if len(chosen) % 2:
        chosen.append(chosen[-1])
    return [PayloadRange(*lo, *hi) for lo, hi in zip(chosen[::2], chosen[1::2], strict=True)]


def apply(service: MessagingService, clock: FakeClock, model: Model, op: Any) -> None:
    kind, arg, more = op
    if kind == "publish":
        wp = model.new_pointer() if more else None
        info = service.publish("ns", "t", records(arg), write_pointer=wp)
        if info is not None:
            model.infos.append(info)
    elif kind == "store":
        wp = model.pointer(arg - 1, arg == 0)
        try:
            got = service.store_payloads("ns", "t", wp, records(more))
        except PayloadsAlreadyPublished:
            return
        assert got.first_ts == got.last_ts  # one millisecond: positions are seqs
        rows = [(got.first_ts, seq) for seq in range(got.first_seq, got.last_seq + 1)]
        model.stored.setdefault(wp, []).extend(rows)
    elif kind == "seal":
        wp = model.pointer(arg, False)
        ranges = None
        if more is not None:
            if not model.stored.get(wp):
                return
            ranges = ranges_at(model.stored[wp], more)
        try:
            info = service.publish("ns", "t", [], write_pointer=wp, payload_ranges=ranges)
        except PayloadsAlreadyPublished:
            return
        assert info is not None
        model.infos.append(info)
    elif kind == "rollback" and model.infos:
        service.rollback("ns", "t", model.infos[arg % len(model.infos)])
    elif kind == "advance":
        clock.advance(arg)
    elif kind == "clean":
        service.clean_once()
        assert counts(service) == fetched(service)
    elif kind == "ttl":
        service.update_topic("ns", "t", {"ttl": arg})


@PROPERTY
@given(operations)
def test_after_the_cleaner_stats_equal_what_fetch_returns(ops: list[Any]) -> None:
    clock = FakeClock(NOW)
    store = MemoryStore()
    service = MessagingService(store, MessagingConfig(cleanup_batch=3), clock=clock)
    try:
        service.create_topic("ns", "t", {"ttl": 6})
        model = Model()
        for step, clean_first, op in ops:
            clock.advance(step)
            if clean_first:
                apply(service, clock, model, ("clean", None, None))
            apply(service, clock, model, op)
        service.clean_once()
        assert counts(service) == fetched(service)
        # And once everything is past the TTL, nothing is left: no drift either way.
        clock.advance(13_000)
        service.clean_once()
        assert counts(service) == fetched(service) == (0, 0)
        assert store.scan_list("metadata", keys.TALLY_PREFIX, b"msg.tally0") == []
    finally:
        service.close()


def ends(service: MessagingService) -> tuple[MessageId | None, MessageId | None]:
    """Brute force: the first and the last id a non-transactional reader gets."""
    first = last = None
    start: MessageId | None = None
    while page := service.fetch("ns", "t", start=start, inclusive=False, limit=10_000):
        first = first or page[0].id
        last = start = page[-1].id
    return first, last


@PROPERTY
@given(operations)
def test_the_oldest_and_newest_ids_are_those_fetch_returns_first_and_last(
    ops: list[Any],
) -> None:
    # At every step, cleaner or not: the newest entry may be past its own expiry, or
    # a pointer entry whose rows are past the TTL, while older messages live.
    clock = FakeClock(NOW)
    service = MessagingService(MemoryStore(), MessagingConfig(cleanup_batch=3), clock=clock)
    try:
        service.create_topic("ns", "t", {"ttl": 6})
        model = Model()
        for step, clean_first, op in ops:
            clock.advance(step)
            if clean_first:
                service.clean_once()
            apply(service, clock, model, op)
            stats = service.stats("ns", "t")
            assert (stats.oldest_id, stats.newest_id) == ends(service)
            assert service.end("ns", "t", None).newest_id == stats.newest_id
    finally:
        service.close()


def test_the_newest_id_skips_entries_past_their_own_expiry(clock: FakeClock) -> None:
    service = MessagingService(MemoryStore(), clock=clock)
    try:
        service.create_topic("ns", "t", {"ttl": 100})
        service.publish("ns", "t", [b"a", b"b"])
        service.publish("ns", "t", [Record(b"c", ttl=1)])
        service.publish("ns", "t", [Record(b"d", key=b"k", ttl=2), Record(b"e", ttl=1)])
        assert service.stats("ns", "t").newest_id == MessageId(NOW, 4)
        clock.advance(1_000)
        assert service.stats("ns", "t").newest_id == MessageId(NOW, 3)
        assert service.end("ns", "t", None).newest_id == MessageId(NOW, 3)
        clock.advance(1_000)
        assert service.end("ns", "t", None).newest_id == MessageId(NOW, 1)
        service.clean_once()
        assert service.end("ns", "t", None).newest_id == MessageId(NOW, 1)
        clock.advance(100_000)
        assert service.end("ns", "t", None).newest_id is None
    finally:
        service.close()
