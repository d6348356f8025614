"""Row keys and message ids: byte order is numeric order, ranges never overlap."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidings.codec import keys
from tidings.structs import MessageId

# Modest example counts: the suite shares two cores. No deadline: timing is not a property.
PROPERTY = settings(max_examples=60, deadline=None)


u16 = st.integers(0, 0xFFFF)
u64 = st.integers(0, 2**64 - 1)
ts = st.integers(0, 2**63 - 1)
topic_ids = st.integers(0, keys.MAX_TOPIC_ID)
generations = st.integers(1, keys.MAX_GENERATION - 1)
write_pointers = st.integers(-(2**63), 2**63 - 1)
id_fields = st.tuples(ts, u16, ts, u16)


@PROPERTY
@given(topic_ids, generations, ts, u16)
def test_message_key_round_trips(topic_id: int, gen: int, publish_ts: int, seq: int) -> None:
    key = keys.message_key(topic_id, gen, publish_ts, seq)
    assert len(key) == keys.MESSAGE_KEY_SIZE
    assert keys.parse_message_key(key) == (topic_id, gen, publish_ts, seq)


@PROPERTY
@given(topic_ids, generations, write_pointers, ts, u16)
def test_payload_key_round_trips(topic_id: int, gen: int, wp: int, write_ts: int, p: int) -> None:
    key = keys.payload_key(topic_id, gen, wp, write_ts, p)
    assert len(key) == keys.PAYLOAD_KEY_SIZE
    assert keys.parse_payload_key(key) == (topic_id, gen, wp, write_ts, p)


@PROPERTY
@given(st.tuples(topic_ids, generations, ts, u16), st.tuples(topic_ids, generations, ts, u16))
def test_message_key_order_is_numeric_order(
    a: tuple[int, int, int, int], b: tuple[int, int, int, int]
) -> None:
    ka, kb = keys.message_key(*a), keys.message_key(*b)
    assert (ka < kb) == (a < b)
    assert (ka == kb) == (a == b)


@PROPERTY
@given(
    st.tuples(topic_ids, generations, write_pointers, ts, u16),
    st.tuples(topic_ids, generations, write_pointers, ts, u16),
)
def test_payload_key_order_is_numeric_order_with_signed_pointers(
    a: tuple[int, int, int, int, int], b: tuple[int, int, int, int, int]
) -> None:
    ka, kb = keys.payload_key(*a), keys.payload_key(*b)
    assert (ka < kb) == (a < b)


@PROPERTY
@given(id_fields, id_fields)
def test_message_id_byte_order_is_numeric_order(
    a: tuple[int, int, int, int], b: tuple[int, int, int, int]
) -> None:
    ia, ib = MessageId(*a), MessageId(*b)
    assert (ia.to_bytes() < ib.to_bytes()) == (a < b) == (ia < ib)
    assert MessageId.from_bytes(ia.to_bytes()) == ia
    assert MessageId.from_hex(ia.hex) == ia
    assert len(ia.hex) == 40


@PROPERTY
@given(topic_ids, generations, ts, u16, write_pointers, ts, u16)
def test_message_id_is_made_of_key_slices(
    topic_id: int, gen: int, publish_ts: int, seq: int, wp: int, write_ts: int, p_seq: int
) -> None:
    row = keys.message_key(topic_id, gen, publish_ts, seq)
    payload_row = keys.payload_key(topic_id, gen, wp, write_ts, p_seq)
    assert keys.message_id_bytes(row) == MessageId(publish_ts, seq).to_bytes()
    assert (
        keys.message_id_bytes(row, payload_row)
        == MessageId(publish_ts, seq, write_ts, p_seq).to_bytes()
    )


@PROPERTY
@given(topic_ids, topic_ids, generations, generations, ts, u16)
def test_no_topic_range_overlaps_another(
    a: int, b: int, gen_a: int, gen_b: int, publish_ts: int, seq: int
) -> None:
    """A key of topic a never falls in any generation range of topic b != a."""
    key = keys.message_key(a, gen_a, publish_ts, seq)
    start, stop = keys.generation_range(b, gen_b)
    old_start, old_stop = keys.older_generations_range(b, gen_b)
    inside = start <= key < stop or old_start <= key < old_stop
    assert inside == (a == b and (gen_a == gen_b or gen_a < gen_b))
    pkey = keys.payload_key(a, gen_a, 7, publish_ts, seq)
    assert (start <= pkey < stop) == (a == b and gen_a == gen_b)


@PROPERTY
@given(topic_ids, generations, generations, ts, u16)
def test_generations_separate_ranges(
    topic_id: int, gen: int, other: int, publish_ts: int, seq: int
) -> None:
    key = keys.message_key(topic_id, other, publish_ts, seq)
    start, stop = keys.generation_range(topic_id, gen)
    assert (start <= key < stop) == (gen == other)
    old_start, old_stop = keys.older_generations_range(topic_id, gen)
    assert (old_start <= key < old_stop) == (other < gen)


@PROPERTY
@given(topic_ids, generations, write_pointers, write_pointers, ts, u16)
def test_write_pointer_ranges_are_disjoint(
    topic_id: int, gen: int, wp: int, other: int, write_ts: int, p_seq: int
) -> None:
    key = keys.payload_key(topic_id, gen, other, write_ts, p_seq)
    start, stop = keys.write_pointer_range(topic_id, gen, wp)
    assert (start <= key < stop) == (wp == other)
    assert key.startswith(keys.write_pointer_prefix(topic_id, gen, other))


@settings(max_examples=15, deadline=None)
@given(topic_ids, generations, ts, u16, st.integers(1, 3 * 0xFFFF))
def test_message_keys_are_consecutive_and_roll_over(
    topic_id: int, gen: int, publish_ts: int, seq: int, count: int
) -> None:
    batch = keys.message_keys(topic_id, gen, publish_ts, seq, count)
    assert len(batch) == count
    assert batch == sorted(set(batch))
    assert batch[0] == keys.message_key(topic_id, gen, publish_ts, seq)
    last = seq + count - 1
    assert keys.parse_message_key(batch[-1]) == (
        topic_id,
        gen,
        publish_ts + last // 0x10000,
        last % 0x10000,
    )


def test_payload_keys_sit_under_their_pointer() -> None:
    batch = keys.payload_keys(3, 2, -5, 100, 0xFFFE, 3)
    assert [keys.parse_payload_key(k)[2:] for k in batch] == [
        (-5, 100, 0xFFFE),
        (-5, 100, 0xFFFF),
        (-5, 101, 0),
    ]


def test_metadata_keys() -> None:
    assert keys.topic_record_key("ns", "t") == b"msg.topic/ns/t"
    start, stop = keys.topic_records_range("ns")
    assert start <= keys.topic_record_key("ns", "zz") < stop
    assert not start <= keys.topic_record_key("ns2", "a") < stop
    assert not start <= keys.topic_record_key("n", "s") < stop
    assert keys.parse_state_key(keys.state_key(77)) == 77
    row = keys.message_key(1, 1, 5, 6)
    entry = keys.expiry_key(123, "messages", row)
    assert keys.parse_expiry_key(entry) == (123, "messages", row)
    assert keys.expiry_key(1, "payloads", row) < keys.expiry_key(2, "messages", row)


def test_parse_rejects_wrong_sizes() -> None:
    with pytest.raises(ValueError):
        keys.parse_message_key(b"short")
    with pytest.raises(ValueError):
        keys.parse_payload_key(bytes(18))
