"""Columnar pages of plain messages built a batch entry at a time: byte for byte the
body the general columnar reader writes, from any start and for any page size, and
given up (to that reader) at the first message that is not plain."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tidings.clock import FakeClock
from tidings.codec import payload_frames, values, wire
from tidings.codec.media import COLUMNS
from tidings.codec.stored_publish import StoredBatch
from tidings.messaging import MessagingService
from tidings.messaging.plain_pages import PlainPage
from tidings.store import MemoryStore
from tidings.structs import MessageId, Record, Transaction

NOW = 1_700_000_000_000

_plain_publishes = st.lists(
    st.tuples(
        # "list": a batch entry of payloads alone (a row of its own for one message);
        # "body": the same from a payloads request body; "stored": an entry of the
        # first form, a flags byte before each payload (given up, read the general way)
        st.sampled_from(["list", "list", "body", "stored"]),
        st.integers(1, 9),
        st.integers(0, 1),  # milliseconds until the next publish
    ),
    min_size=1,
    max_size=6,
)


def _fill(publishes: list[tuple[str, int, int]]) -> MessagingService:
    clock = FakeClock(NOW)
    service = MessagingService(MemoryStore(), clock=clock)
    service.create_topic("ns", "t")
    for n, (kind, count, pause) in enumerate(publishes):
        batch = [b"%d-%d" % (n, i) * (i + 1) for i in range(count)]
        if kind == "body":
            body = payload_frames.write_frames(None, batch)
            service.publish("ns", "t", payload_frames.read_frames(body))
        elif kind == "stored":
            stored = [values.payload_header() + p for p in batch]
            service.publish("ns", "t", StoredBatch(None, None, stored, sum(map(len, batch))))
        else:
            service.publish("ns", "t", batch)
        clock.advance(pause)
    return service


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_plain_publishes, st.integers(1, 12), st.booleans(), st.data())
def test_a_plain_page_is_the_body_the_general_reader_writes(
    publishes: list[tuple[str, int, int]], limit: int, transactional: bool, data: st.DataObject
) -> None:
    service = _fill(publishes)
    everything = service.fetch("ns", "t", limit=1_000)
    tx = Transaction(read_pointer=10_000, write_pointer=10_001) if transactional else None
    i = data.draw(st.integers(0, len(everything) - 1))
    at = everything[i].id
    starts: list[tuple[MessageId | int | None, bool]] = [
        (None, True),
        (at, True),
        (at, False),
        (MessageId(at.publish_ts, at.seq, 0, 1), True),  # between two messages
        (data.draw(st.integers(NOW - 1, NOW + len(publishes))), True),
    ]
    for start, inclusive in starts:
        body, count, last = service.fetch_columns(
            "ns", "t", start=start, inclusive=inclusive, limit=limit, transaction=tx
        )
        general = service.fetch_page_columns(
            "ns", "t", start=start, inclusive=inclusive, limit=limit, transaction=tx
        )
        assert body == general.encode()
        assert count == len(general.ids)
        assert last == (MessageId.from_bytes(general.ids[-1]) if general.ids else None)
        decoded = wire.decode_messages(body, COLUMNS)
        assert [m.id for m in decoded] == [MessageId.from_bytes(i) for i in general.ids]


def test_a_page_of_batch_entries_is_not_built_message_by_message(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    service = _fill([("list", 500, 1), ("body", 300, 0), ("list", 1, 1), ("list", 200, 0)])

    def general(*args: object, **kwargs: object) -> object:
        raise AssertionError("the page went the general way")

    monkeypatch.setattr(service, "fetch_page_columns", general)
    body, count, last = service.fetch_columns("ns", "t", limit=10_000)
    assert count == 1_001
    messages = wire.decode_messages(body, COLUMNS)
    assert [m.payload for m in messages[498:502]] == [
        b"0-498" * 499,
        b"0-499" * 500,
        b"1-0",
        b"1-1" * 2,
    ]
    assert last == messages[-1].id and messages[-1].payload == b"3-199" * 200
    # A page that ends inside an entry, and the next one resuming there.
    body, count, last = service.fetch_columns("ns", "t", limit=250)
    assert count == 250
    body, count, _ = service.fetch_columns("ns", "t", start=last, inclusive=False, limit=600)
    assert [m.payload[:5] for m in wire.decode_messages(body, COLUMNS)][:2] == [b"0-250", b"0-251"]
    assert count == 600


@pytest.mark.parametrize(
    "other",
    [
        Record(b"keyed", b"k"),
        Record(b"with headers", headers={"h": b"v"}),
        Record(b"expiring", ttl=60),
    ],
    ids=["key", "headers", "ttl"],
)
def test_a_page_meeting_another_shape_is_read_the_general_way(other: Record) -> None:
    service = _fill([("list", 5, 1)])
    service.publish("ns", "t", [other])
    service.publish("ns", "t", [b"after-1", b"after-2"])
    body, count, _ = service.fetch_columns("ns", "t", limit=100)
    messages = wire.decode_messages(body, COLUMNS)
    assert count == 8
    assert messages[5].payload == other.payload
    assert messages[5].key == other.key and dict(messages[5].headers) == dict(other.headers)
    assert [m.payload for m in messages[6:]] == [b"after-1", b"after-2"]
    # Counted once, though the plain walk was given up and the page read again.
    assert service.stats("ns", "t").fetches == 1


def test_a_transactions_messages_are_read_the_general_way() -> None:
    service = _fill([("list", 3, 1)])
    service.publish("ns", "t", [b"in-tx-1", b"in-tx-2"], write_pointer=5)
    open_tx = Transaction(read_pointer=4, write_pointer=6, in_progress=(5,))
    _, count, _ = service.fetch_columns("ns", "t", limit=100, transaction=open_tx)
    assert count == 3  # stops at the open transaction's entry
    _, count, _ = service.fetch_columns("ns", "t", limit=100)
    assert count == 5


def test_after_a_page_given_up_the_topics_next_pages_go_the_general_way(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tidings.messaging import service as service_module

    service = _fill([("list", 3, 1)])
    service.publish("ns", "t", [Record(b"keyed", b"k")])
    tried: list[int] = []

    class Counted(PlainPage):
        def __init__(self) -> None:
            super().__init__()
            tried.append(1)

    monkeypatch.setattr(service_module, "PlainPage", Counted)
    for _ in range(1 + 16 + 1):
        _, count, _ = service.fetch_columns("ns", "t", limit=100)
        assert count == 4
    # Given up once, then 16 pages the general way, then tried again.
    assert len(tried) == 2
    # Another topic is not affected.
    service.create_topic("ns", "other")
    service.publish("ns", "other", [b"a", b"b"])
    service.fetch_columns("ns", "other", limit=100)
    assert len(tried) == 3
