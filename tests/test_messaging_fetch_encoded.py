"""The pre-encoded poll paths (Avro items, columns) answer byte for byte what encoding
fetch()'s messages does, and the ids-only fetch answers exactly those messages' ids."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from hypothesis import given, settings
from hypothesis import strategies as st

from tidings.clock import FakeClock
from tidings.codec import wire
from tidings.messaging import MessagingService
from tidings.store import MemoryStore
from tidings.structs import Record, Transaction

# One op: (kind, payload size, write pointer); kinds cover every entry shape.
ops = st.lists(
    st.tuples(
        st.sampled_from(
            [
                "plain",
                "big",
                "keyed",
                "key-only",
                "big-key-only",
                "tx",
                "stored",
                "stored-extras",
                "stored-ranges",
                "rolled-back",
            ]
        ),
        st.integers(0, 40),
        st.integers(1, 4),
    ),
    min_size=1,
    max_size=12,
)


@contextmanager
def fresh_service() -> Iterator[MessagingService]:
    s = MessagingService(MemoryStore(), clock=FakeClock(1_700_000_000_000))
    try:
        yield s
    finally:
        s.close()


def _fill(service: MessagingService, topic: str, steps: list[tuple[str, int, int]]) -> None:
    service.create_topic("ns", topic)
    next_wp = 10
    for kind, size, count in steps:
        payloads = [bytes([i]) * size for i in range(count)]
        if kind == "plain":
            service.publish("ns", topic, payloads)
        elif kind == "big":
            service.publish("ns", topic, [b"x" * 20_000])
        elif kind == "keyed":
            service.publish(
                "ns", topic, [Record(p, key=b"k", headers={"h": b"v"}) for p in payloads]
            )
        elif kind == "key-only":
            # Keys of 0 to 160 bytes: on both sides of the one-byte length.
            service.publish("ns", topic, [Record(p, key=b"k" * (size * 4)) for p in payloads])
        elif kind == "big-key-only":
            service.publish("ns", topic, [Record(b"y" * 20_000, key=b"k" * size)])
        elif kind == "tx":
            service.publish("ns", topic, payloads, write_pointer=next_wp)
        elif kind == "stored":
            service.store_payloads("ns", topic, next_wp, payloads)
            service.publish("ns", topic, [], write_pointer=next_wp)
        elif kind == "stored-extras":
            # What a Spark sink stores: keys (past one varint byte too), headers, and
            # TTLs of one second, expired by the time of the reads (see _check).
            records = [
                Record(
                    p,
                    key=None if i % 3 == 0 else b"k" * (size * 5),
                    headers={} if i % 2 else {"source-id": b"h" * size, "n": bytes([i])},
                    ttl=1 if i == 2 else None,
                )
                for i, p in enumerate(payloads)
            ]
            service.store_payloads("ns", topic, next_wp, records)
            service.publish("ns", topic, [], write_pointer=next_wp)
        elif kind == "stored-ranges":
            # A pointer publish naming ranges, as the Spark sink's commit makes.
            first = service.store_payloads("ns", topic, next_wp, payloads)
            second = service.store_payloads("ns", topic, next_wp, [Record(b"r", key=b"k")])
            service.publish("ns", topic, [], write_pointer=next_wp, payload_ranges=[second, first])
        else:
            info = service.publish("ns", topic, payloads, write_pointer=next_wp)
            assert info is not None
            service.rollback("ns", topic, info)
        next_wp += 1


@settings(max_examples=60, deadline=None)
@given(steps=ops, limit=st.integers(1, 30), snapshot=st.booleans(), data=st.data())
def test_encoded_fetch_matches_message_fetch(
    steps: list[tuple[str, int, int]],
    limit: int,
    snapshot: bool,
    data: st.DataObject,
) -> None:
    with fresh_service() as service:
        _check(service, steps, limit, snapshot, data)


def _check(
    service: MessagingService,
    steps: list[tuple[str, int, int]],
    limit: int,
    snapshot: bool,
    data: st.DataObject,
) -> None:
    topic = "t"
    _fill(service, topic, steps)
    clock = service._clock
    assert isinstance(clock, FakeClock)
    clock.advance(1_500)  # past the one-second TTLs of "stored-extras"
    # Pointers 10.. are committed, except one that stays in progress when drawn.
    in_progress = data.draw(st.sampled_from([(), (12,)]))
    tx = Transaction(read_pointer=100, write_pointer=2**63 - 1, in_progress=in_progress)
    transaction = tx if snapshot else None
    everything = service.fetch("ns", topic, limit=10_000)
    start = data.draw(st.none() | st.sampled_from([m.id for m in everything] or [None]))
    inclusive = data.draw(st.booleans())
    for media in (wire.AVRO, wire.AVRO_EXT, wire.JSON):
        kwargs = {
            "start": start,
            "inclusive": inclusive,
            "limit": limit,
            "transaction": transaction,
        }
        messages = service.fetch("ns", topic, **kwargs)  # type: ignore[arg-type]
        ids = [m.id for m in messages]
        assert service.fetch_ids("ns", topic, **kwargs) == ids  # type: ignore[arg-type]
        ids_body, ids_count, ids_last = service.fetch_ids_encoded("ns", topic, media, **kwargs)  # type: ignore[arg-type]
        assert ids_body == wire.encode_message_ids(ids, media)
        assert (ids_count, ids_last) == (len(ids), ids[-1] if ids else None)
        body, count, last = service.fetch_encoded("ns", topic, media, **kwargs)  # type: ignore[arg-type]
        assert count == len(messages)
        assert last == (messages[-1].id if messages else None)
        assert body == wire.encode_messages(messages, media)
    # The columnar answer (write pointers are not in it, as in the Avro answers).
    body, count, last = service.fetch_columns("ns", topic, **kwargs)  # type: ignore[arg-type]
    assert (count, last) == (len(messages), messages[-1].id if messages else None)
    assert body == wire.encode_messages(messages, wire.COLUMNS)
    plain = [m._replace(write_pointer=None) for m in messages]
    assert wire.decode_messages(body, wire.COLUMNS) == plain
