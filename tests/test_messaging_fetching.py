"""Fetch: start positions, limits, transactional visibility, Payload Table expansion."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tidings.clock import FakeClock
from tidings.codec import wire
from tidings.codec.media import COLUMNS
from tidings.errors import BadRequest, InvalidMessageId
from tidings.messaging import MessagingConfig, MessagingService
from tidings.store import MemoryStore, Store
from tidings.structs import Message, MessageId, Record, Transaction

NOW = 1_700_000_000_000


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(NOW)


@pytest.fixture
def service(store: Store, clock: FakeClock) -> Iterator[MessagingService]:
    config = MessagingConfig(fetch_default_limit=5, fetch_max_limit=8)
    s = MessagingService(store, config, clock=clock)
    s.create_topic("ns", "t")
    yield s
    s.close()


def payloads(messages: list[Message]) -> list[bytes]:
    return [m.payload for m in messages]


def test_start_positions(service: MessagingService, clock: FakeClock) -> None:
    service.publish("ns", "t", [b"a", b"b"])
    clock.advance(10)
    service.publish("ns", "t", [b"c", b"d"])
    everything = service.fetch("ns", "t")
    assert payloads(everything) == [b"a", b"b", b"c", b"d"]
    b_id = everything[1].id
    assert payloads(service.fetch("ns", "t", start=b_id)) == [b"b", b"c", b"d"]
    assert payloads(service.fetch("ns", "t", start=b_id, inclusive=False)) == [b"c", b"d"]
    assert payloads(service.fetch("ns", "t", start=NOW + 10)) == [b"c", b"d"]
    assert payloads(service.fetch("ns", "t", start=NOW, inclusive=False)) == [b"c", b"d"]
    assert payloads(service.fetch("ns", "t", start=NOW + 10, inclusive=False)) == []
    assert payloads(service.fetch("ns", "t", start=0)) == [b"a", b"b", b"c", b"d"]
    # An id that is not stored: everything after it.
    assert payloads(service.fetch("ns", "t", start=MessageId(NOW, 1, 5, 0))) == [b"c", b"d"]
    assert payloads(service.fetch("ns", "t", start=MessageId(NOW + 5, 0))) == [b"c", b"d"]


def test_limits(service: MessagingService) -> None:
    service.publish("ns", "t", [b"%d" % i for i in range(20)])
    assert len(service.fetch("ns", "t")) == 5  # default
    assert len(service.fetch("ns", "t", limit=3)) == 3
    assert len(service.fetch("ns", "t", limit=1_000_000)) == 8  # clamped to the maximum
    for bad in [0, -1, True, 2.5, "3"]:
        with pytest.raises(BadRequest):
            service.fetch("ns", "t", limit=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("start", [-1, 2**64, 1.5, "abc", b"raw", True])
def test_bad_starts(service: MessagingService, start: object) -> None:
    with pytest.raises(BadRequest):
        service.fetch("ns", "t", start=start)  # type: ignore[arg-type]


def test_out_of_range_message_id(service: MessagingService) -> None:
    with pytest.raises(InvalidMessageId):
        service.fetch("ns", "t", start=MessageId(-1, 0))


def test_non_transactional_fetch_sees_everything(service: MessagingService) -> None:
    service.publish("ns", "t", [b"committed"], write_pointer=5)
    info = service.publish("ns", "t", [b"rolled-back"], write_pointer=6)
    assert info is not None
    service.rollback("ns", "t", info)
    service.publish("ns", "t", [b"in-progress"], write_pointer=7)
    service.publish("ns", "t", [b"plain"])
    got = service.fetch("ns", "t")
    assert [(m.payload, m.write_pointer) for m in got] == [
        (b"committed", 5),
        (b"rolled-back", -6),
        (b"in-progress", 7),
        (b"plain", None),
    ]


def test_transactional_fetch_visibility(service: MessagingService) -> None:
    service.publish("ns", "t", [b"plain1"])
    service.publish("ns", "t", [b"committed"], write_pointer=5)
    service.publish("ns", "t", [b"invalid"], write_pointer=6)
    info = service.publish("ns", "t", [b"rolled-back"], write_pointer=7)
    assert info is not None
    service.rollback("ns", "t", info)
    service.publish("ns", "t", [b"mine"], write_pointer=20)
    service.publish("ns", "t", [b"plain2"])
    service.publish("ns", "t", [b"in-progress"], write_pointer=8)
    service.publish("ns", "t", [b"after"])
    tx = Transaction(read_pointer=10, write_pointer=20, invalid=(6,), in_progress=(8,))
    got = service.fetch("ns", "t", transaction=tx)
    # Skips invalid and rolled-back entries, stops at the first in-progress one.
    assert payloads(got) == [b"plain1", b"committed", b"mine", b"plain2"]
    # Ordering over latency: a later snapshot in which 8 committed sees the rest.
    later = Transaction(read_pointer=30, write_pointer=31, invalid=(6,))
    assert payloads(
        service.fetch("ns", "t", transaction=later, start=got[-1].id, inclusive=False)
    ) == [
        b"in-progress",
        b"after",
    ]
    # A transaction begun after the snapshot (pointer above read_pointer) blocks too.
    early = Transaction(read_pointer=4, write_pointer=4)
    assert payloads(service.fetch("ns", "t", transaction=early)) == [b"plain1"]


def test_transactional_fetch_blocks_on_pointer_entry(service: MessagingService) -> None:
    service.store_payloads("ns", "t", 9, [b"x"])
    service.publish("ns", "t", [], write_pointer=9)
    service.publish("ns", "t", [b"later"])
    blocked = Transaction(read_pointer=20, write_pointer=21, in_progress=(9,))
    assert service.fetch("ns", "t", transaction=blocked) == []
    committed = Transaction(read_pointer=20, write_pointer=21)
    assert payloads(service.fetch("ns", "t", transaction=committed)) == [b"x", b"later"]


def test_expansion_resumes_exactly_after_the_last_id(service: MessagingService) -> None:
    service.publish("ns", "t", [b"first"])
    service.store_payloads("ns", "t", 3, [b"p%d" % i for i in range(12)])
    service.publish("ns", "t", [], write_pointer=3)
    service.publish("ns", "t", [b"last"])
    seen: list[bytes] = []
    start: MessageId | None = None
    while page := service.fetch("ns", "t", start=start, inclusive=False, limit=5):
        seen.extend(payloads(page))
        start = page[-1].id
    assert seen == [b"first", *[b"p%d" % i for i in range(12)], b"last"]
    # Inclusive from an id inside the expansion starts at that very message.
    p4 = service.fetch("ns", "t", limit=6)[-1]
    assert p4.payload == b"p4"
    assert payloads(service.fetch("ns", "t", start=p4.id, limit=2)) == [b"p4", b"p5"]


def _ranged_topic(service: MessagingService) -> list[Message]:
    # Three stores under one pointer; the middle one (an attempt that failed) is not
    # published. Returns every message the topic then shows.
    service.publish("ns", "t", [b"first"])
    a = service.store_payloads("ns", "t", 3, [b"a%d" % i for i in range(4)])
    service.store_payloads("ns", "t", 3, [b"failed%d" % i for i in range(3)])
    b = service.store_payloads("ns", "t", 3, [b"b%d" % i for i in range(4)])
    service.publish("ns", "t", [], write_pointer=3, payload_ranges=[a, b])
    service.publish("ns", "t", [b"last"])
    everything = service.fetch("ns", "t", limit=8) + service.fetch(
        "ns", "t", start=service.fetch("ns", "t", limit=8)[-1].id, inclusive=False, limit=8
    )
    assert payloads(everything) == [
        b"first",
        *[b"a%d" % i for i in range(4)],
        *[b"b%d" % i for i in range(4)],
        b"last",
    ]
    return everything


def test_resume_inside_a_ranged_entry(service: MessagingService) -> None:
    everything = _ranged_topic(service)
    for i, message in enumerate(everything):
        assert service.fetch("ns", "t", start=message.id, limit=8) == everything[i : i + 8]
        assert (
            service.fetch("ns", "t", start=message.id, inclusive=False, limit=8)
            == everything[i + 1 : i + 9]
        )
    # Paging by 3 (limits stop inside ranges) yields each message once, in order.
    seen: list[Message] = []
    start: MessageId | None = None
    while page := service.fetch("ns", "t", start=start, inclusive=False, limit=3):
        seen.extend(page)
        start = page[-1].id
    assert seen == everything


def test_resume_from_an_id_of_a_row_outside_the_ranges(service: MessagingService) -> None:
    everything = _ranged_topic(service)
    a3, b0 = everything[4], everything[5]
    assert (a3.payload, b0.payload) == (b"a3", b"b0")
    # An id that would name a failed attempt's row (between the ranges, same entry as
    # a): the next message is still b0, and no failed row ever shows.
    between = a3.id._replace(p_seq=a3.id.p_seq + 1)
    for inclusive in (True, False):
        page = service.fetch("ns", "t", start=between, inclusive=inclusive, limit=2)
        assert payloads(page) == [b"b0", b"b1"]
    # An id before the start of b's entry's range resumes at that range's first row.
    early = b0.id._replace(write_ts=0, p_seq=0)
    assert payloads(service.fetch("ns", "t", start=early, limit=1)) == [b"b0"]


def test_ranged_entries_under_a_transaction(service: MessagingService) -> None:
    rng = service.store_payloads("ns", "t", 3, [b"a"])
    service.store_payloads("ns", "t", 3, [b"failed"])
    service.publish("ns", "t", [], write_pointer=3, payload_ranges=[rng])
    blocked = Transaction(read_pointer=2, write_pointer=10, in_progress=(3,))
    assert service.fetch("ns", "t", transaction=blocked) == []
    done = Transaction(read_pointer=9, write_pointer=10)
    assert payloads(service.fetch("ns", "t", transaction=done)) == [b"a"]
    assert payloads(service.fetch("ns", "t")) == [b"a"]


# --- property: paging through any mix equals one big fetch --------------------------

batches = st.lists(
    st.tuples(
        st.sampled_from(["plain", "tx", "stored", "rolled-back", "ranged"]),
        st.integers(1, 6),
    ),
    min_size=1,
    max_size=8,
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches, st.integers(1, 7), st.booleans())
def test_paging_returns_every_message_once_in_order(
    shape: list[tuple[str, int]], page: int, transactional: bool
) -> None:
    store = MemoryStore()
    clock = FakeClock(NOW)
    service = MessagingService(store, clock=clock)
    service.create_topic("ns", "t")
    expected: list[bytes] = []
    for n, (kind, count) in enumerate(shape):
        batch = [b"%d-%d" % (n, i) for i in range(count)]
        wp = 100 + n
        if kind == "plain":
            service.publish("ns", "t", batch)
        elif kind == "tx":
            service.publish("ns", "t", batch, write_pointer=wp)
        elif kind == "ranged":
            # Rows of a failed attempt sit between the two ranges published.
            head = service.store_payloads("ns", "t", wp, batch[: count // 2 + 1])
            service.store_payloads("ns", "t", wp, [b"%d-failed" % n])
            tail = batch[count // 2 + 1 :]
            ranges = [head]
            if tail:
                ranges.append(service.store_payloads("ns", "t", wp, tail))
            service.publish("ns", "t", [], write_pointer=wp, payload_ranges=ranges)
        else:
            service.store_payloads("ns", "t", wp, batch[: count // 2 + 1])
            service.store_payloads("ns", "t", wp, batch[count // 2 + 1 :] or [b"%d-x" % n])
            info = service.publish("ns", "t", [], write_pointer=wp)
            batch = [*batch[: count // 2 + 1], *(batch[count // 2 + 1 :] or [b"%d-x" % n])]
            if kind == "rolled-back":
                assert info is not None
                service.rollback("ns", "t", info)
                if transactional:
                    batch = []
        expected.extend(batch)
        clock.advance(n % 2)
    tx = Transaction(read_pointer=10_000, write_pointer=10_001) if transactional else None
    everything = service.fetch("ns", "t", limit=10_000, transaction=tx)
    assert payloads(everything) == expected
    assert [m.id for m in everything] == sorted({m.id for m in everything})
    paged: list[Message] = []
    start: MessageId | None = None
    while chunk := service.fetch(
        "ns", "t", start=start, inclusive=False, limit=page, transaction=tx
    ):
        assert len(chunk) <= page
        paged.extend(chunk)
        start = chunk[-1].id
    assert paged == everything
    # Inclusive restarts at any id return the suffix from that id.
    for i in range(0, len(everything), 3):
        suffix = service.fetch("ns", "t", start=everything[i].id, limit=10_000, transaction=tx)
        assert suffix == everything[i:]


_records = st.lists(
    st.tuples(
        st.binary(max_size=40),
        st.none() | st.binary(max_size=300),  # keys on both sides of 128 bytes
        st.dictionaries(st.text(min_size=1, max_size=5), st.binary(max_size=5), max_size=2),
        st.booleans(),  # in a transaction
    ),
    min_size=1,
    max_size=12,
)


@settings(max_examples=60, deadline=None)
@given(_records, st.sampled_from([None, "committed", "snapshot"]))
def test_every_shape_of_record_reads_back_as_published(
    records: list[tuple[bytes, bytes | None, dict[str, bytes], bool]], reader: str | None
) -> None:
    # Each shape of stored value (plain, keyed, with headers, in a transaction) is read
    # by a fast path of its own or by the full decoder: all must give what was sent.
    service = MessagingService(MemoryStore(), clock=FakeClock(NOW))
    service.create_topic("ns", "t")
    for payload, key, headers, transactional in records:
        record = Record(payload, key, headers)
        service.publish("ns", "t", [record], write_pointer=7 if transactional else None)
    tx = Transaction(read_pointer=10, write_pointer=11) if reader == "snapshot" else None
    got = service.fetch("ns", "t", limit=100, transaction=tx)
    assert [(m.payload, m.key, dict(m.headers)) for m in got] == [
        (p, k, h) for p, k, h, _ in records
    ]
    assert [m.write_pointer for m in got] == [7 if t else None for *_, t in records]
    # The ids-only reads walk the same entries.
    ids = [m.id for m in got]
    assert service.fetch_ids("ns", "t", limit=100, transaction=tx) == ids
    for i in range(len(ids)):
        assert service.fetch_ids("ns", "t", start=ids[i], limit=100, transaction=tx) == ids[i:]
        suffix = service.fetch("ns", "t", start=ids[i], limit=100, transaction=tx)
        assert suffix == got[i:]
    assert service.stats("ns", "t").newest_id == ids[-1]


#: Publishes for the columnar reads' visibility test: (key or None, write pointer or None).
_tx_publishes = st.lists(
    st.tuples(
        st.none() | st.sampled_from([b"k1", b"k2", b"x" * 130]),
        st.none() | st.sampled_from([3, 5, 8, 9, 12]),
        st.integers(1, 4),  # messages in the publish
    ),
    min_size=1,
    max_size=10,
)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    _tx_publishes,
    st.sets(st.sampled_from([3, 5, 8, 9, 12])),  # rolled back
    st.sampled_from(["none", "snapshot"]),
    st.integers(1, 9),
)
def test_columnar_pages_show_transactional_rows_as_the_general_reader_does(
    publishes: list[tuple[bytes | None, int | None, int]],
    rolled_back: set[int],
    reader: str,
    page: int,
) -> None:
    # The columnar walk takes a transactional row itself once its write pointer was
    # found visible (one check per pointer, not per row): in progress (9), begun after
    # the snapshot (12), invalid (5) and rolled back pointers must be skipped or stop the
    # page exactly as the reader of Message objects does.
    service = MessagingService(MemoryStore(), clock=FakeClock(NOW))
    service.create_topic("ns", "t")
    infos = []
    for n, (key, wp, count) in enumerate(publishes):
        batch = [Record(b"%d-%d" % (n, i), key) for i in range(count)]
        info = service.publish("ns", "t", batch, write_pointer=wp)
        if wp in rolled_back and info is not None:
            infos.append(info)
    for info in infos:
        service.rollback("ns", "t", info)
    tx = None
    if reader == "snapshot":
        tx = Transaction(read_pointer=10, write_pointer=11, invalid=(5,), in_progress=(9,))
    start: MessageId | None = None
    while True:
        expected = service.fetch("ns", "t", start=start, inclusive=start is None, limit=page,
                                 transaction=tx)  # fmt: skip
        body, count, _ = service.fetch_columns(
            "ns", "t", start=start, inclusive=start is None, limit=page, transaction=tx
        )
        got = wire.decode_messages(body, COLUMNS)
        assert count == len(got)
        assert [(m.id, m.payload, m.key) for m in got] == [
            (m.id, m.payload, m.key) for m in expected
        ]
        if not got:
            break
        start = got[-1].id
