"""The queue codecs: stored records and the JSON bodies round-trip; keys keep order."""

from __future__ import annotations

import base64

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidings.codec import queue_bodies, queues
from tidings.errors import BadRequest
from tidings.structs import MessageId

ids = st.builds(
    MessageId,
    st.integers(0, 2**63 - 1),
    st.integers(0, 2**16 - 1),
    st.integers(0, 2**63 - 1),
    st.integers(0, 2**16 - 1),
)
names = st.from_regex(r"[A-Za-z0-9_-]{1,128}", fullmatch=True)
consumers = st.from_regex(r"[A-Za-z0-9]{1,64}", fullmatch=True)


@given(
    consumers | st.just(""),
    st.integers(0, 2**63 - 1),
    st.integers(0, 2**63 - 1),
    st.lists(st.tuples(ids, st.integers(0, 2**16 - 1)), max_size=50),
)
def test_lease_records_round_trip(owner: str, deadline: int, wp: int, entries: list) -> None:
    record = queues.LeaseRecord(owner, deadline, wp, tuple(entries))
    assert queues.decode_lease(queues.encode_lease(record)) == record


@given(st.integers(1, 1000), names, st.sampled_from(["earliest", "latest"]), st.none() | ids)
def test_queue_records_round_trip(
    max_deliveries: int, dlq: str, start: str, read: MessageId | None
) -> None:
    record = queues.QueueRecord(max_deliveries, dlq, start, read)
    assert queues.decode_queue(queues.encode_queue(record)) == record


@given(st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1), names, st.integers(0, 2**64 - 1))
def test_lease_keys_sort_by_lease_inside_the_queue_range(
    topic_id: int, generation: int, queue: str, lease: int
) -> None:
    key = queues.lease_key(topic_id, generation, queue, lease)
    start, stop = queues.leases_range(topic_id, generation, queue)
    assert start <= key < stop
    assert queues.lease_no_of(key) == lease
    other = queues.lease_key(topic_id, generation, queue + "x", 0)
    assert not start <= other < stop  # a longer name is another queue


@given(consumers, st.lists(ids, min_size=1, max_size=20), st.none() | st.integers(1, 2**63 - 1))
def test_ack_bodies_round_trip(consumer: str, message_ids: list, wp: int | None) -> None:
    body = queue_bodies.ack_request(consumer, message_ids, wp)
    assert queue_bodies.read_ack_request(body) == (consumer, message_ids, wp)


@given(
    consumers,
    st.integers(1, 10_000),
    st.none() | st.integers(1, 2**31),
    st.none() | st.integers(1, 1000),
    st.none() | names,
    st.sampled_from(["earliest", "latest"]),
    st.lists(ids, max_size=20),
)
def test_pop_bodies_round_trip(
    consumer: str,
    max_messages: int,
    timeout: int | None,
    max_deliveries: int | None,
    dlq: str | None,
    start: str,
    acks: list[MessageId],
) -> None:
    body = queue_bodies.pop_request(
        consumer, max_messages, timeout, max_deliveries, dlq, start, acks
    )
    assert ("ackIds" in body) == bool(acks)
    assert queue_bodies.read_pop_request(body) == queue_bodies.PopRequest(
        consumer, max_messages, timeout, max_deliveries, dlq, start, acks
    )


junk = st.one_of(
    st.text(max_size=40),
    st.binary(max_size=30).map(lambda b: base64.b64encode(b).decode()),
    st.integers(),
    st.none(),
    st.lists(st.integers(), max_size=2),
)


@given(
    st.lists(st.one_of(ids.map(lambda i: ("id", i)), junk.map(lambda j: ("junk", j))), min_size=1)
)
def test_ack_bodies_with_malformed_ids_name_each_and_only_those(values: list) -> None:
    # Junk that happens to be 20 bytes of base64 is an id like any other.
    def as_id(value: object) -> MessageId | None:
        try:
            raw = base64.b64decode(value, validate=True) if isinstance(value, str) else b""
        except ValueError:
            return None
        return MessageId.from_bytes(raw) if len(raw) == 20 else None

    raw = [base64.b64encode(v.to_bytes()).decode() if kind == "id" else v for kind, v in values]
    parsed = [v if kind == "id" else as_id(v) for kind, v in values]
    bad = [v for v, p in zip(raw, parsed, strict=True) if p is None]
    body = {"consumerId": "c1", "ids": raw}
    if not bad:
        assert queue_bodies.read_ack_request(body)[1] == parsed
        return
    with pytest.raises(BadRequest, match=rf"^{len(bad)} id\(s\) are not message ids"):
        queue_bodies.read_ack_request(body)


@given(st.lists(st.integers(1, 1000), max_size=30))
def test_delivery_counts_header_round_trips(counts: list[int]) -> None:
    header = queue_bodies.delivery_counts(counts)
    assert queue_bodies.read_delivery_counts(header, len(counts)) == counts


@pytest.mark.parametrize(
    "body",
    [
        {"consumerId": "é", "ids": ["AAAAAAAAAAAAAAAAAAAAAAAAAAA="]},
        {"consumerId": "ok", "ids": "AAAA"},
        {"consumerId": "ok", "ids": ["AAAA"]},
        {"consumerId": "ok", "ids": ["AAAAAAAAAAAAAAAAAAAAAAAAAAA="], "transactionWritePointer": 0},
    ],
)
def test_bad_ack_bodies_are_bad_requests(body: dict) -> None:
    with pytest.raises(BadRequest):
        queue_bodies.read_ack_request(body)
