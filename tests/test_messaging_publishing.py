"""Publish, store, rollback and the sequencing rule (DESIGN.md invariant 1)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidings.clock import FakeClock
from tidings.codec import keys, values
from tidings.errors import BadRequest, EmptyPublish, PayloadsAlreadyPublished, TopicNotFound
from tidings.messaging import MessagingService, publishing
from tidings.messaging.sequencing import assign
from tidings.store import Store
from tidings.structs import MessageId, PayloadRange, Record, RollbackInfo, Transaction

NOW = 1_700_000_000_000

# Modest example counts: the suite shares two cores. No deadline: timing is not a property.
PROPERTY = settings(max_examples=60, deadline=None)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(NOW)


@pytest.fixture
def service(store: Store, clock: FakeClock) -> Iterator[MessagingService]:
    s = MessagingService(store, clock=clock)
    s.create_topic("ns", "t")
    yield s
    s.close()


def ids(service: MessagingService, **kwargs: object) -> list[MessageId]:
    return [m.id for m in service.fetch("ns", "t", limit=10_000, **kwargs)]  # type: ignore[arg-type]


# --- the pure rule -------------------------------------------------------------


@PROPERTY
@given(
    st.integers(0, 2**40),
    st.integers(0, 0xFFFF),
    st.integers(0, 2**40),
    st.integers(1, 200_000),
)
def test_assign_is_strictly_after_the_last_position(
    last_ts: int, last_seq: int, now: int, count: int
) -> None:
    start_ts, start_seq, end_ts, end_seq = assign(last_ts, last_seq, now, count)
    assert (start_ts, start_seq) > (last_ts, last_seq)
    assert start_ts >= now
    assert 0 <= start_seq <= 0xFFFF and 0 <= end_seq <= 0xFFFF
    assert (end_ts - start_ts) * 0x10000 + end_seq - start_seq == count - 1


def test_assign_uses_one_timestamp_and_moves_on_when_seq_runs_out() -> None:
    assert assign(0, 0, 100, 3) == (100, 0, 100, 2)
    assert assign(100, 2, 100, 1) == (100, 3, 100, 3)
    assert assign(100, 2, 50, 1) == (100, 3, 100, 3)  # clock stepped back
    assert assign(100, 0xFFFF, 100, 2) == (101, 0, 101, 1)
    assert assign(100, 0xFFFE, 100, 3) == (100, 0xFFFF, 101, 1)
    assert assign(0, 0, 0, 1) == (0, 1, 0, 1)  # (0, 0) is never assigned
    with pytest.raises(ValueError):
        assign(0, 0, 0, 0)


# --- publish ---------------------------------------------------------------------


def test_publish_one_timestamp_per_batch(service: MessagingService, clock: FakeClock) -> None:
    assert service.publish("ns", "t", [b"a", b"b", b"c"]) is None
    clock.advance(5)
    service.publish("ns", "t", [b"d"])
    assert ids(service) == [
        MessageId(NOW, 0),
        MessageId(NOW, 1),
        MessageId(NOW, 2),
        MessageId(NOW + 5, 0),
    ]


def test_seq_overflow_moves_to_next_millisecond(service: MessagingService) -> None:
    count = 0x10000 + 10
    service.publish("ns", "t", [b"%d" % i for i in range(count)])
    got = []
    start: MessageId | None = None
    while page := service.fetch("ns", "t", start=start, inclusive=False, limit=10_000):
        got.extend(page)
        start = page[-1].id
    assert [m.payload for m in got] == [b"%d" % i for i in range(count)]
    assert got[0x10000 - 1].id == MessageId(NOW, 0xFFFF)
    assert got[0x10000].id == MessageId(NOW + 1, 0)
    assert got[-1].id == MessageId(NOW + 1, 9)


def test_clock_stepping_back_changes_no_order(service: MessagingService, clock: FakeClock) -> None:
    expected = []
    for step in [0, -10_000, 3, -1, -3_600_000, 5_000, -2]:
        clock.advance(step)
        batch = [b"%d" % len(expected), b"%d" % (len(expected) + 1)]
        expected.extend(batch)
        service.publish("ns", "t", batch)
        service.store_payloads("ns", "t", 100 + len(expected), [b"p"])
    got = service.fetch("ns", "t")
    assert [m.payload for m in got] == expected
    assert [m.id for m in got] == sorted({m.id for m in got})
    assert all(m.id.publish_ts >= NOW for m in got)


def test_persisted_last_timestamp_survives_a_new_service(
    store: Store, service: MessagingService, clock: FakeClock
) -> None:
    """The last position is stored with the messages, so a restarted service whose
    clock is behind still appends after them."""
    service.publish("ns", "t", [b"1"])
    clock.advance(-60_000)
    restarted = MessagingService(store, clock=clock)
    restarted.publish("ns", "t", [b"2"])
    got = restarted.fetch("ns", "t")
    assert [m.payload for m in got] == [b"1", b"2"]
    assert got[1].id == MessageId(NOW, 1)


def test_records_keep_key_and_headers(service: MessagingService) -> None:
    service.publish(
        "ns",
        "t",
        [Record(b"p1", key=b"k", headers={"a": b"1", "b": b""}), b"p2", bytearray(b"p3")],
    )
    got = service.fetch("ns", "t")
    assert [(m.payload, m.key, dict(m.headers)) for m in got] == [
        (b"p1", b"k", {"a": b"1", "b": b""}),
        (b"p2", None, {}),
        (b"p3", None, {}),
    ]
    assert all(m.write_pointer is None for m in got)


def test_empty_payloads_are_messages(service: MessagingService) -> None:
    service.publish("ns", "t", [b"", Record(b"")])
    assert [m.payload for m in service.fetch("ns", "t")] == [b"", b""]


@pytest.mark.parametrize(
    "messages",
    [
        ["text"],
        [b"ok", 5],
        [Record("text")],  # type: ignore[arg-type]
        [Record(b"x", key="k")],  # type: ignore[arg-type]
        [Record(b"x", headers={"h": "v"})],  # type: ignore[dict-item]
        [Record(b"x", headers={1: b"v"})],  # type: ignore[dict-item]
        [Record(b"x", ttl=0)],
        [Record(b"x", ttl=-5)],
        [Record(b"x", ttl=1.5)],  # type: ignore[arg-type]
    ],
)
def test_bad_messages_change_nothing(service: MessagingService, messages: list[object]) -> None:
    with pytest.raises(BadRequest):
        service.publish("ns", "t", messages)  # type: ignore[arg-type]
    with pytest.raises(BadRequest):
        service.store_payloads("ns", "t", 5, messages)  # type: ignore[arg-type]
    assert service.fetch("ns", "t") == []


def test_empty_publish_is_an_error(service: MessagingService) -> None:
    with pytest.raises(EmptyPublish):
        service.publish("ns", "t", [])
    with pytest.raises(EmptyPublish):
        service.publish_future("ns", "t", [])
    with pytest.raises(EmptyPublish):
        service.store_payloads("ns", "t", 7, [])


@pytest.mark.parametrize("wp", [0, -1, 2**63, True, "5", 1.0])
def test_bad_write_pointers(service: MessagingService, wp: object) -> None:
    with pytest.raises(BadRequest):
        service.publish("ns", "t", [b"x"], write_pointer=wp)  # type: ignore[arg-type]
    with pytest.raises(BadRequest):
        service.store_payloads("ns", "t", wp, [b"x"])  # type: ignore[arg-type]
    assert service.fetch("ns", "t") == []


def test_missing_topic_is_reported_before_queueing(service: MessagingService) -> None:
    with pytest.raises(TopicNotFound):
        service.publish_future("ns", "nope", [b"x"])
    with pytest.raises(TopicNotFound):
        service.store_future("ns", "nope", 5, [b"x"])
    with pytest.raises(TopicNotFound):
        service.rollback_future("ns", "nope", RollbackInfo(5, 0, 0, 0, 0))


# --- transactional publish, store, rollback ----------------------------------------


def test_transactional_publish_returns_rollback_info(
    service: MessagingService, store: Store
) -> None:
    service.publish("ns", "t", [b"plain"])
    info = service.publish("ns", "t", [b"a", b"b"], write_pointer=42)
    assert info == RollbackInfo(42, NOW, 1, NOW, 2)
    got = service.fetch("ns", "t")
    assert [(m.payload, m.write_pointer) for m in got] == [
        (b"plain", None),
        (b"a", 42),
        (b"b", 42),
    ]
    rows = store.scan_list("messages", b"", b"\xff")
    # The transaction's two messages share one batch entry, which carries its pointer.
    assert [values.read_write_pointer(v) for _, v in rows] == [None, 42]


def test_store_then_publish_pointer(service: MessagingService, store: Store) -> None:
    service.store_payloads("ns", "t", 9, [b"s1", b"s2"])
    service.store_payloads("ns", "t", 9, [Record(b"s3", key=b"k")])
    assert service.fetch("ns", "t") == []  # not published yet
    info = service.publish("ns", "t", [], write_pointer=9)
    assert info is not None and (info.start_ts, info.start_seq) == (info.end_ts, info.end_seq)
    rows = store.scan_list("messages", b"", b"\xff")
    assert len(rows) == 1 and rows[0][1] == values.encode_value(None, 9)  # only t
    got = service.fetch("ns", "t")
    assert [(m.payload, m.key, m.write_pointer) for m in got] == [
        (b"s1", None, 9),
        (b"s2", None, 9),
        (b"s3", b"k", 9),
    ]
    assert [m.id for m in got] == sorted(m.id for m in got)
    assert all(m.id.publish_ts == info.start_ts and m.id.write_ts > 0 for m in got)


def test_rollback_flips_exactly_the_named_entries(service: MessagingService, store: Store) -> None:
    service.publish("ns", "t", [b"before"], write_pointer=5)
    info = service.publish("ns", "t", [b"a", b"b"], write_pointer=7)
    service.publish("ns", "t", [b"other"], write_pointer=8)
    service.publish("ns", "t", [b"plain"])
    service.store_payloads("ns", "t", 7, [b"stored"])
    payload_rows = store.scan_list("payloads", b"", b"\xff")
    assert info is not None
    assert service.rollback("ns", "t", info) == 2
    got = service.fetch("ns", "t")
    assert [(m.payload, m.write_pointer) for m in got] == [
        (b"before", 5),
        (b"a", -7),
        (b"b", -7),
        (b"other", 8),
        (b"plain", None),
    ]
    assert store.scan_list("payloads", b"", b"\xff") == payload_rows  # untouched
    assert service.rollback("ns", "t", info) == 0  # already rolled back


def test_rollback_of_entries_of_another_pointer_changes_nothing(
    service: MessagingService, store: Store
) -> None:
    info = service.publish("ns", "t", [b"a"], write_pointer=7)
    assert info is not None
    before = store.scan_list("messages", b"", b"\xff")
    wrong = RollbackInfo(8, info.start_ts, info.start_seq, info.end_ts, info.end_seq)
    assert service.rollback("ns", "t", wrong) == 0
    assert service.rollback("ns", "t", RollbackInfo(7, 0, 0, 1, 0)) == 0  # wrong range
    assert store.scan_list("messages", b"", b"\xff") == before


def test_rollback_of_a_pointer_entry_hides_its_payloads(service: MessagingService) -> None:
    service.store_payloads("ns", "t", 11, [b"x", b"y"])
    info = service.publish("ns", "t", [], write_pointer=11)
    assert info is not None
    assert service.rollback("ns", "t", info) == 1
    tx = Transaction(read_pointer=100, write_pointer=101)
    assert service.fetch("ns", "t", transaction=tx) == []
    got = service.fetch("ns", "t")  # non-transactional readers still see them
    assert [(m.payload, m.write_pointer) for m in got] == [(b"x", -11), (b"y", -11)]


@pytest.mark.parametrize(
    "info",
    [
        RollbackInfo(0, 0, 0, 0, 0),
        RollbackInfo(-7, 0, 0, 0, 0),
        RollbackInfo(7, 5, 0, 4, 0),
        RollbackInfo(7, 5, 3, 5, 2),
        RollbackInfo(7, -1, 0, 0, 0),
        RollbackInfo(7, 0, 0x10000, 1, 0),
        RollbackInfo(7, 0, 0, 2**64, 0),
    ],
)
def test_bad_rollback_info(service: MessagingService, info: RollbackInfo) -> None:
    with pytest.raises(BadRequest):
        service.rollback("ns", "t", info)


def test_negative_pointer_cannot_undo_a_rollback(service: MessagingService) -> None:
    info = service.publish("ns", "t", [b"a"], write_pointer=7)
    assert info is not None
    service.rollback("ns", "t", info)
    undo = RollbackInfo(-7, info.start_ts, info.start_seq, info.end_ts, info.end_seq)
    with pytest.raises(BadRequest):
        service.rollback("ns", "t", undo)
    assert service.fetch("ns", "t")[0].write_pointer == -7


def test_state_is_written_with_the_messages(service: MessagingService, store: Store) -> None:
    service.publish("ns", "t", [b"a", b"b"])
    service.store_payloads("ns", "t", 3, [b"p"])
    raw = store.get("metadata", keys.state_key(1))
    assert raw is not None
    state = values.decode_state(raw)
    assert (state.last_ts, state.last_seq, state.last_write_ts, state.last_p_seq) == (
        NOW,
        1,
        NOW,
        0,
    )


def test_futures_resolve_with_results(service: MessagingService) -> None:
    futures = [
        service.publish_future("ns", "t", [b"%d" % i], write_pointer=i + 1) for i in range(5)
    ]
    infos = [f.result(timeout=10) for f in futures]
    assert [i.write_pointer for i in infos if i is not None] == [1, 2, 3, 4, 5]
    assert service.store_future("ns", "t", 9, [b"s"]).result(timeout=10) == PayloadRange(
        NOW, 0, NOW, 0
    )
    first = infos[0]
    assert first is not None
    assert service.rollback_future("ns", "t", first).result(timeout=10) == 1


# --- a published write pointer is sealed (invariant 1) ---------------------------


def test_store_after_the_pointer_was_published_is_refused(service: MessagingService) -> None:
    service.store_payloads("ns", "t", 7, [b"a", b"b"])
    service.publish("ns", "t", [], write_pointer=7)
    before = [m.payload for m in service.fetch("ns", "t")]
    with pytest.raises(PayloadsAlreadyPublished):
        service.store_payloads("ns", "t", 7, [b"late"])  # a zombie executor
    with pytest.raises(PayloadsAlreadyPublished):
        service.publish("ns", "t", [], write_pointer=7)  # the same entry twice
    assert [m.payload for m in service.fetch("ns", "t")] == before == [b"a", b"b"]


def test_seal_is_per_topic_and_pointer(service: MessagingService) -> None:
    service.create_topic("ns", "other")
    service.store_payloads("ns", "t", 7, [b"a"])
    service.publish("ns", "t", [], write_pointer=7)
    service.store_payloads("ns", "t", 8, [b"b"])  # another pointer: fine
    service.store_payloads("ns", "other", 7, [b"c"])  # another topic: fine
    service.publish("ns", "other", [], write_pointer=7)
    assert [m.payload for m in service.fetch("ns", "other")] == [b"c"]


def test_rolled_back_pointer_stays_sealed(service: MessagingService) -> None:
    service.store_payloads("ns", "t", 7, [b"a"])
    info = service.publish("ns", "t", [], write_pointer=7)
    assert info is not None
    service.rollback("ns", "t", info)
    with pytest.raises(PayloadsAlreadyPublished):
        service.store_payloads("ns", "t", 7, [b"late"])
    assert [m.payload for m in service.fetch("ns", "t")] == [b"a"]  # non-transactional view


def test_direct_publishes_do_not_seal(service: MessagingService) -> None:
    service.publish("ns", "t", [b"x"], write_pointer=9)
    service.publish("ns", "t", [b"y"], write_pointer=9)
    service.store_payloads("ns", "t", 9, [b"z"])
    service.publish("ns", "t", [], write_pointer=9)
    assert [m.payload for m in service.fetch("ns", "t")] == [b"x", b"y", b"z"]


# --- payload ranges: a pointer publish exposing only the rows named -------------


def test_store_returns_the_range_it_wrote(service: MessagingService, clock: FakeClock) -> None:
    first = service.store_payloads("ns", "t", 7, [b"a", b"b", b"c"])
    assert first == PayloadRange(NOW, 0, NOW, 2)
    other_pointer = service.store_payloads("ns", "t", 8, [b"x"])
    assert other_pointer == PayloadRange(NOW, 3, NOW, 3)  # one sequence per topic
    clock.advance(5)
    assert service.store_payloads("ns", "t", 7, [b"d"]) == PayloadRange(NOW + 5, 0, NOW + 5, 0)


def test_ranges_expose_exactly_their_rows(service: MessagingService, clock: FakeClock) -> None:
    # Two attempts of the same task store under one write pointer; the first failed.
    failed = service.store_payloads("ns", "t", 7, [b"failed-1", b"failed-2"])
    clock.advance(1)
    kept_a = service.store_payloads("ns", "t", 7, [b"a1", b"a2"])
    service.store_payloads("ns", "t", 7, [b"failed-3"])
    kept_b = service.store_payloads("ns", "t", 7, [b"b1"])
    assert failed.last < kept_a.first
    info = service.publish("ns", "t", [], write_pointer=7, payload_ranges=[kept_b, kept_a])
    messages = service.fetch("ns", "t")
    assert [m.payload for m in messages] == [b"a1", b"a2", b"b1"]
    assert all(m.write_pointer == 7 for m in messages)
    # One Message Table entry per range, in ascending range order.
    assert info is not None
    assert (info.end_ts, info.end_seq) == (info.start_ts, info.start_seq + 1)
    assert [m.id[:2] for m in messages] == [
        (info.start_ts, info.start_seq),
        (info.start_ts, info.start_seq),
        (info.end_ts, info.end_seq),
    ]
    assert [m.id[2:] for m in messages] == [(NOW + 1, 0), (NOW + 1, 1), (NOW + 1, 3)]
    committed = Transaction(read_pointer=7, write_pointer=100)
    assert [m.payload for m in service.fetch("ns", "t", transaction=committed)] == [
        b"a1",
        b"a2",
        b"b1",
    ]


def test_range_of_part_of_a_store_and_of_missing_rows(service: MessagingService) -> None:
    service.store_payloads("ns", "t", 7, [b"a", b"b", b"c", b"d"])
    service.publish(
        "ns",
        "t",
        [],
        write_pointer=7,
        payload_ranges=[PayloadRange(NOW, 1, NOW, 2), PayloadRange(NOW + 50, 0, NOW + 60, 9)],
    )
    assert [m.payload for m in service.fetch("ns", "t")] == [b"b", b"c"]


def test_plain_pointer_publish_still_exposes_every_row(service: MessagingService) -> None:
    service.store_payloads("ns", "t", 7, [b"a"])
    service.store_payloads("ns", "t", 7, [b"b"])
    service.publish("ns", "t", [], write_pointer=7)
    assert [m.payload for m in service.fetch("ns", "t")] == [b"a", b"b"]


def test_ranged_entries_roll_back_and_stay_sealed(service: MessagingService) -> None:
    rng = service.store_payloads("ns", "t", 7, [b"a", b"b"])
    service.store_payloads("ns", "t", 7, [b"other-attempt"])
    info = service.publish("ns", "t", [], write_pointer=7, payload_ranges=[rng])
    assert info is not None
    assert service.rollback("ns", "t", info) == 1
    tx = Transaction(read_pointer=7, write_pointer=100)
    assert service.fetch("ns", "t", transaction=tx) == []
    # Non-transactional readers still see the rolled-back entry, and only its range.
    rolled = service.fetch("ns", "t")
    assert [(m.payload, m.write_pointer) for m in rolled] == [(b"a", -7), (b"b", -7)]
    with pytest.raises(PayloadsAlreadyPublished):
        service.publish("ns", "t", [], write_pointer=7, payload_ranges=[rng])
    with pytest.raises(PayloadsAlreadyPublished):
        service.store_payloads("ns", "t", 7, [b"late"])


def test_publish_all_with_ranges(service: MessagingService) -> None:
    service.create_topic("ns", "u")
    rng = service.store_payloads("ns", "t", 7, [b"t1"])
    service.store_payloads("ns", "t", 7, [b"t-failed"])
    service.store_payloads("ns", "u", 7, [b"u1"])
    service.publish_all_future(
        "ns", [("t", []), ("u", [])], write_pointer=7, payload_ranges={"t": [rng]}
    ).result(timeout=10)
    assert [m.payload for m in service.fetch("ns", "t")] == [b"t1"]
    assert [m.payload for m in service.fetch("ns", "u")] == [b"u1"]  # no ranges: all


@pytest.mark.parametrize(
    ("kwargs", "ranges"),
    [
        ({"write_pointer": 7}, []),  # none at all: omit the field to mean "every row"
        ({"write_pointer": 7}, [PayloadRange(NOW, 2, NOW, 1)]),  # first after last
        ({"write_pointer": 7}, [PayloadRange(NOW + 1, 0, NOW, 5)]),
        ({"write_pointer": 7}, [PayloadRange(NOW, 0, NOW, 3), PayloadRange(NOW, 3, NOW, 4)]),
        ({"write_pointer": 7}, [PayloadRange(NOW, 5, NOW, 9), PayloadRange(NOW, 0, NOW, 7)]),
        ({"write_pointer": 7}, [(NOW, 0, NOW)]),  # not four fields
        ({"write_pointer": 7}, [PayloadRange(NOW, 0x10000, NOW, 0x10000)]),
        ({"write_pointer": 7}, [PayloadRange(-1, 0, NOW, 0)]),
        ({"write_pointer": 7}, [PayloadRange(True, 0, NOW, 0)]),
        ({"write_pointer": 7}, "not a list"),
        ({"write_pointer": 7}, [PayloadRange(i, 0, i, 0) for i in range(10_001)]),
        ({}, [PayloadRange(NOW, 0, NOW, 0)]),  # no write pointer
    ],
)
def test_bad_payload_ranges_are_refused(
    service: MessagingService, kwargs: dict[str, int], ranges: object
) -> None:
    service.store_payloads("ns", "t", 7, [b"a"])
    messages: list[bytes] = [] if kwargs else [b"direct"]
    with pytest.raises(BadRequest):
        service.publish("ns", "t", messages, payload_ranges=ranges, **kwargs)  # type: ignore[arg-type]
    # Nothing was written, nothing sealed: a correct publish still works.
    assert service.fetch("ns", "t") == []
    service.publish("ns", "t", [], write_pointer=7, payload_ranges=[PayloadRange(NOW, 0, NOW, 0)])
    assert [m.payload for m in service.fetch("ns", "t")] == [b"a"]


def test_ranges_with_messages_are_refused(service: MessagingService) -> None:
    with pytest.raises(BadRequest):
        service.publish(
            "ns", "t", [b"x"], write_pointer=7, payload_ranges=[PayloadRange(NOW, 0, NOW, 0)]
        )


def test_largest_allowed_number_of_ranges(service: MessagingService) -> None:
    service.store_payloads("ns", "t", 7, [b"%d" % i for i in range(20)])
    many = [PayloadRange(NOW, i, NOW, i) for i in range(0, 20, 2)]
    many += [PayloadRange(NOW + 1 + i, 0, NOW + 1 + i, 0) for i in range(10_000 - len(many))]
    service.publish("ns", "t", [], write_pointer=7, payload_ranges=many)
    assert [m.payload for m in service.fetch("ns", "t", limit=10_000)] == [
        b"%d" % i for i in range(0, 20, 2)
    ]


@PROPERTY
@given(
    st.integers(1, 2**63 - 1),
    st.tuples(
        st.integers(0, 2**64 - 1),
        st.integers(0, 0xFFFF),
        st.integers(0, 2**64 - 1),
        st.integers(0, 0xFFFF),
    ),
)
def test_ranged_pointer_value_round_trip(
    write_pointer: int, fields: tuple[int, int, int, int]
) -> None:
    rng = PayloadRange(*fields)
    value = values.encode_pointer(write_pointer, rng)
    assert len(value) == 9 + values.RANGE_SIZE
    decoded = values.decode_value(value)
    assert decoded.write_pointer == write_pointer
    assert decoded.payload is None
    assert values.read_payload_range(value) == rng
    # Rollback rewrites t and keeps the range.
    flipped = values.with_write_pointer(value, -write_pointer)
    assert values.read_payload_range(flipped) == rng
    # The old, unranged pointer value still means "every row".
    plain = values.encode_pointer(write_pointer)
    assert values.decode_value(plain) == (write_pointer, None, None, {}, None)
    assert values.read_payload_range(plain) is None


@PROPERTY
@given(
    st.lists(
        st.tuples(
            st.binary(max_size=30),
            st.none() | st.binary(max_size=300),
            st.dictionaries(st.text(min_size=1, max_size=4), st.binary(max_size=4), max_size=2),
            st.none() | st.integers(1, 1000),
        ),
        min_size=1,
        max_size=10,
    ),
    st.none() | st.integers(1, 2**40),
)
def test_encoded_batch_values_are_the_canonical_encoding(
    fields: list[tuple[bytes, bytes | None, dict[str, bytes], int | None]], wp: int | None
) -> None:
    # The batch encoder's shortcuts (plain payloads, a key alone) write exactly what the
    # general encoder writes, so every reader decodes them alike.
    records = [Record(p, k, h, ttl) for p, k, h, ttl in fields]
    batch = publishing.encode_batch(records, wp, NOW)
    assert batch.values == [
        values.encode_value(p, wp, k, h, None if ttl is None else NOW + ttl * 1000)
        for p, k, h, ttl in fields
    ]
    assert batch.size == sum(len(p) for p, *_ in fields)


def test_a_retried_idempotent_publish_is_not_counted_again(service: MessagingService) -> None:
    # A retry writes nothing: the traffic counters (stats' messagesPublished,
    # bytesPublished, publishRate) count the batch once, like the topic's contents.
    producer = bytes(range(16))
    woken: list[str] = []
    service.add_listener(lambda ns, topic: woken.append(topic))
    service.publish("ns", "t", [b"abc", b"de"], producer=(producer, 7))
    service.publish("ns", "t", [b"abc", b"de"], producer=(producer, 7))
    service.publish("ns", "t", [b"abc", b"de"], producer=(producer, 6))
    stats = service.stats("ns", "t")
    assert (stats.message_count, stats.bytes) == (2, 5)
    assert (stats.messages_published, stats.bytes_published) == (2, 5)
    assert service.counters()[("ns", "t")].publish_latency.count == 1
    assert woken == ["t"]
    service.publish("ns", "t", [b"f"], producer=(producer, 8))
    stats = service.stats("ns", "t")
    assert (stats.messages_published, stats.bytes_published) == (3, 6)
