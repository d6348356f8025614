"""Pages bounded by bytes (``max_bytes``): every reader stops after the message that
brings the page to the bound, at least one message per page, and reading on from a
page's last id gives every message once, in order, whatever the bound."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tidings.clock import FakeClock
from tidings.codec import payload_frames, wire
from tidings.codec.media import AVRO_EXT, COLUMNS, JSON
from tidings.errors import BadRequest
from tidings.messaging import MessagingConfig, MessagingService
from tidings.store import MemoryStore
from tidings.structs import Message, MessageId, Record, Transaction

NOW = 1_700_000_000_000
#: What a message's stored form may add to its payload, key and headers: a flags
#: byte, a write pointer, an expiry, varint lengths (two per header).
SLACK = 1 + 8 + 8 + 4


def size(message: Message) -> int:
    """A message's payload, key and headers: at most what the bound counts for it."""
    key = len(message.key) if message.key is not None else 0
    return len(message.payload) + key + sum(len(k) + len(v) for k, v in message.headers.items())


def most(message: Message) -> int:
    """At least what the bound counts for ``message``."""
    return size(message) + SLACK + 2 * len(message.headers)


_shapes = st.lists(
    st.tuples(
        st.sampled_from(["batch", "row", "keyed", "keyed-batch", "headers", "tx", "stored"]),
        st.integers(1, 6),  # messages
        st.integers(0, 300),  # payload bytes of the first; the others vary around it
    ),
    min_size=1,
    max_size=8,
)


def _fill(shapes: list[tuple[str, int, int]]) -> MessagingService:
    clock = FakeClock(NOW)
    service = MessagingService(MemoryStore(), MessagingConfig(fetch_max_bytes=1 << 20), clock=clock)
    service.create_topic("ns", "t")
    for n, (kind, count, length) in enumerate(shapes):
        payloads = [bytes([65 + n % 26]) * (length + 7 * i) for i in range(count)]
        if kind == "batch":
            service.publish("ns", "t", payloads)
        elif kind == "row":
            for p in payloads:
                service.publish("ns", "t", [p])
        elif kind == "keyed":
            service.publish("ns", "t", [Record(payloads[0], key=b"k%d" % n)])
        elif kind == "keyed-batch":
            service.publish(
                "ns", "t", [Record(p, key=b"key-%d" % i) for i, p in enumerate(payloads)]
            )
        elif kind == "headers":
            service.publish("ns", "t", [Record(p, headers={"h": b"v" * n}) for p in payloads])
        elif kind == "tx":
            body = payload_frames.write_frames(None, payloads)
            service.publish("ns", "t", payload_frames.read_frames(body), write_pointer=100 + n)
        else:  # Payload Table rows exposed by a pointer entry
            service.store_payloads("ns", "t", 100 + n, payloads)
            service.publish("ns", "t", [], write_pointer=100 + n)
        clock.advance(1)
    return service


def _page(
    service: MessagingService, how: str, start: MessageId | None, limit: int, max_bytes: int,
    tx: Transaction | None,
) -> list[MessageId]:  # fmt: skip
    """The ids of one page read by ``how``."""
    args: dict[str, Any] = dict(
        start=start, inclusive=start is None, limit=limit, transaction=tx, max_bytes=max_bytes
    )
    if how == "messages":
        return [m.id for m in service.fetch("ns", "t", **args)]
    if how == "avro":
        body, _, _ = service.fetch_encoded("ns", "t", AVRO_EXT, **args)
        return [m.id for m in wire.decode_messages(body, AVRO_EXT)]
    if how == "json":
        body, _, _ = service.fetch_encoded("ns", "t", JSON, **args)
        return [m.id for m in wire.decode_messages(body, JSON)]
    if how == "columns":  # a plain page first, the general columns where it gives up
        body, _, _ = service.fetch_columns("ns", "t", **args)
        return [m.id for m in wire.decode_messages(body, COLUMNS)]
    columns = service.fetch_page_columns("ns", "t", **args)
    return [MessageId.from_bytes(i) for i in columns.ids]


HOWS = ["messages", "avro", "json", "columns", "page-columns"]


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_shapes, st.integers(1, 700), st.integers(1, 12), st.booleans())
def test_pages_stop_at_the_message_that_reaches_the_bound(
    shapes: list[tuple[str, int, int]], max_bytes: int, limit: int, transactional: bool
) -> None:
    service = _fill(shapes)
    tx = Transaction(read_pointer=10_000, write_pointer=10_001) if transactional else None
    everything = service.fetch("ns", "t", limit=1_000, transaction=tx)
    by_id = {m.id: m for m in everything}
    for how in HOWS:
        read: list[MessageId] = []
        start: MessageId | None = None
        while True:
            page = _page(service, how, start, limit, max_bytes, tx)
            if not page:
                break
            messages = [by_id[i] for i in page]
            # Never past the message that reaches the bound ...
            assert sum(map(size, messages[:-1])) < max_bytes, how
            # ... and only short of the limit where the bound was reached (or the end).
            if len(page) < limit and len(read) + len(page) < len(everything):
                assert sum(map(most, messages)) >= max_bytes, how
            read += page
            start = page[-1]
        # Page after page, every message once, in order.
        assert read == [m.id for m in everything], how


_plain_shapes = st.lists(
    st.tuples(st.sampled_from(["batch", "row"]), st.integers(1, 6), st.integers(0, 300)),
    min_size=1,
    max_size=8,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(_shapes, _plain_shapes), st.integers(1, 700), st.integers(1, 12), st.data())
def test_every_reader_cuts_the_same_page(
    shapes: list[tuple[str, int, int]], max_bytes: int, limit: int, data: st.DataObject
) -> None:
    service = _fill(shapes)
    everything = service.fetch("ns", "t", limit=1_000)
    start = data.draw(st.sampled_from([None, *(m.id for m in everything)]))
    pages = [_page(service, how, start, limit, max_bytes, None) for how in HOWS]
    assert all(page == pages[0] for page in pages)


@pytest.fixture
def plain() -> Iterator[MessagingService]:
    service = MessagingService(MemoryStore(), MessagingConfig(fetch_max_bytes=1_000))
    service.create_topic("ns", "t")
    yield service
    service.close()


def test_a_batch_entry_counts_its_payloads(plain: MessagingService) -> None:
    plain.publish("ns", "t", [b"x" * 100] * 10)  # one batch entry: payloads back to back
    assert len(plain.fetch("ns", "t", max_bytes=200)) == 2
    assert len(plain.fetch("ns", "t", max_bytes=201)) == 3  # the third reaches it
    assert len(plain.fetch("ns", "t", max_bytes=1)) == 1  # at least one message
    body, count, _ = plain.fetch_columns("ns", "t", max_bytes=250)
    assert count == 3 and len(wire.decode_messages(body, COLUMNS)) == 3
    assert plain.fetch_page_columns("ns", "t", max_bytes=250).cut
    # The whole topic (1,000 bytes) within the server's bound (also 1,000): cut there.
    assert plain.fetch_page_columns("ns", "t", max_bytes=5_000).cut
    assert not plain.fetch_page_columns("ns", "t", max_bytes=5_000, limit=9).cut


def test_a_page_that_reaches_the_bound_at_an_entrys_end_stops_there(
    plain: MessagingService,
) -> None:
    plain.publish("ns", "t", [b"x" * 100] * 2)
    plain.publish("ns", "t", [b"x" * 100] * 2)
    for how in HOWS:
        assert len(_page(plain, how, None, 10, 200, None)) == 2, how
        assert len(_page(plain, how, None, 10, 201, None)) == 3, how


def test_a_row_counts_its_flags_byte(plain: MessagingService) -> None:
    for _ in range(5):
        plain.publish("ns", "t", [b"y" * 100])  # a row each: flags byte and payload
    assert len(plain.fetch("ns", "t", max_bytes=202)) == 2
    assert len(plain.fetch("ns", "t", max_bytes=203)) == 3
    assert plain.fetch_columns("ns", "t", max_bytes=202)[1] == 2  # a plain page too
    assert plain.fetch_columns("ns", "t", max_bytes=203)[1] == 3


def test_the_servers_bound_caps_and_defaults(plain: MessagingService) -> None:
    plain.publish("ns", "t", [b"z" * 100] * 30)
    assert len(plain.fetch("ns", "t")) == 10  # fetch_max_bytes 1,000
    assert len(plain.fetch("ns", "t", max_bytes=10**9)) == 10
    assert len(plain.fetch_ids("ns", "t")) == 30  # ids are not bounded by bytes


@pytest.mark.parametrize("bad", [0, -1, True, 2.5, "300"])
def test_bad_bounds_are_refused(plain: MessagingService, bad: object) -> None:
    with pytest.raises(BadRequest):
        plain.fetch("ns", "t", max_bytes=bad)  # type: ignore[arg-type]
    with pytest.raises(BadRequest):
        plain.fetch_columns("ns", "t", max_bytes=bad)  # type: ignore[arg-type]


def test_the_bound_must_be_positive() -> None:
    with pytest.raises(ValueError, match="fetch_max_bytes"):
        MessagingConfig(fetch_max_bytes=0)
