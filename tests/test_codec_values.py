"""Stored values: every encoding round-trips; rollback flips ``t`` in place."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidings.codec import values
from tidings.codec.values import TopicState

payloads = st.binary(max_size=300)
pointers = st.none() | st.integers(-(2**63), 2**63 - 1)
header_maps = st.dictionaries(st.text(max_size=20), st.binary(max_size=50), max_size=5)
expiries = st.none() | st.integers(0, 2**64 - 1)

# Modest example counts: the suite shares two cores. No deadline: timing is not a property.
PROPERTY = settings(max_examples=60, deadline=None)


@PROPERTY
@given(payloads, pointers, st.none() | st.binary(max_size=200), header_maps, expiries)
def test_value_round_trips(
    payload: bytes,
    wp: int | None,
    key: bytes | None,
    headers: dict[str, bytes],
    expires_at: int | None,
) -> None:
    raw = values.encode_value(payload, wp, key, headers, expires_at)
    decoded = values.decode_value(raw)
    assert decoded == (wp, payload, key, headers, expires_at)
    assert raw.endswith(payload)  # payload last: a slice of the stored value
    assert values.read_write_pointer(raw) == wp


@PROPERTY
@given(st.integers(1, 2**63 - 1), payloads)
def test_rollback_flips_only_t(wp: int, payload: bytes) -> None:
    raw = values.encode_value(payload, wp, key=b"k", headers={"h": b"v"}, expires_at=9)
    flipped = values.with_write_pointer(raw, -wp)
    assert len(flipped) == len(raw)
    assert values.decode_value(flipped) == (-wp, payload, b"k", {"h": b"v"}, 9)
    assert values.with_write_pointer(flipped, wp) == raw


@PROPERTY
@given(pointers, payloads)
def test_payload_header_equals_full_encoding(wp: int | None, payload: bytes) -> None:
    assert values.payload_header(wp) + payload == values.encode_value(payload, wp)


@PROPERTY
@given(st.integers(-(2**63), 2**63 - 1))
def test_pointer_entry_holds_only_t(wp: int) -> None:
    raw = values.encode_value(None, wp)
    assert raw[0] == values.POINTER
    assert len(raw) == 9
    assert values.decode_value(raw) == (wp, None, None, {}, None)


def test_common_shapes_have_fixed_flags() -> None:
    assert values.encode_value(b"x")[0] == values.PLAIN
    assert values.encode_value(b"x", 5)[0] == values.TX_PLAIN
    assert values.encode_value(b"", None) == bytes([values.PLAIN])


def test_bad_values_are_rejected() -> None:
    with pytest.raises(ValueError):
        values.encode_value(None, None)
    with pytest.raises(ValueError):
        values.decode_value(b"")
    with pytest.raises(ValueError):
        values.decode_value(bytes([0x42]))  # version 2
    with pytest.raises(ValueError):
        values.with_write_pointer(values.encode_value(b"x"), 3)
    truncated = values.encode_value(b"", key=b"0123456789")[:-3]
    with pytest.raises(ValueError):
        values.decode_value(truncated)


@PROPERTY
@given(
    st.integers(-(2**31), 2**31 - 1),
    st.integers(1, 2**63),
    st.integers(0, 2**64 - 1),
    st.integers(0, 0xFFFF),
    st.integers(0, 2**64 - 1),
    st.integers(0, 0xFFFF),
)
def test_state_round_trips(gen: int, ttl: int, ts: int, seq: int, wts: int, pseq: int) -> None:
    state = TopicState(gen, ttl, ts, seq, wts, pseq)
    assert values.decode_state(values.encode_state(state)) == state


@PROPERTY
@given(
    st.integers(0, 2**32 - 1),
    st.dictionaries(st.text(min_size=1, max_size=10), st.text(max_size=10), max_size=5),
)
def test_topic_record_round_trips(topic_id: int, properties: dict[str, str]) -> None:
    raw = values.encode_topic_record(topic_id, properties)
    assert values.decode_topic_record(raw) == (topic_id, properties)


def test_next_topic_id_round_trips() -> None:
    assert values.decode_next_topic_id(values.encode_next_topic_id(42)) == 42


@given(
    st.lists(st.tuples(st.binary(max_size=300), st.binary(max_size=127)), min_size=2, max_size=40),
    st.booleans(),
    st.none() | st.integers(1, 2**62),
    st.data(),
)
def test_batch_entries_hold_each_message_as_given(
    messages: list[tuple[bytes, bytes]], keyed: bool, write_pointer: int | None, data: st.DataObject
) -> None:
    if keyed:
        header = values.keyed_header(write_pointer)
        stored = [header + bytes([len(k)]) + k + p for p, k in messages]
    else:
        stored = [values.payload_header(write_pointer) + p for p, _ in messages]
    entry = values.encode_batch(stored, keyed, write_pointer)
    if write_pointer is None:
        assert entry[0] == (values.KEYED_BATCH if keyed else values.BATCH)
    count, ends, starts = values.batch_layout(entry)
    assert count == len(messages)
    assert [entry[ends[i] : ends[i + 1]] for i in range(count)] == stored
    assert [entry[starts[i] : ends[i + 1]] for i in range(count)] == [p for p, _ in messages]
    if keyed:
        skip = values.batch_key_skip(entry[0])
        assert [entry[ends[i] + skip : starts[i]] for i in range(count)] == [k for _, k in messages]
        # Where the first n keys start, all in one addition.
        n = data.draw(st.integers(0, count))
        assert list(values.batch_key_starts(entry, n)) == [ends[i] + skip for i in range(n)]
    assert values.batch_counts(entry) == (count, sum(len(p) for p, _ in messages))
    # Older readers refuse it rather than take it for one message.
    with pytest.raises(ValueError):
        values.decode_value(entry)
    with pytest.raises(ValueError):
        values.batch_layout(entry[:-1])


@given(st.lists(st.binary(max_size=300), min_size=2, max_size=40))
def test_plain_batch_entries_hold_bare_payloads_read_as_the_flagged_form(
    payloads: list[bytes],
) -> None:
    entry = values.encode_plain_batch(payloads)
    assert entry[0] == values.BATCH
    count, ends, starts = values.batch_layout(entry)
    assert count == len(payloads)
    # Each message is its payload alone: it starts where its bytes start.
    assert list(starts) == list(ends[:count])
    assert [entry[starts[i] : ends[i + 1]] for i in range(count)] == payloads
    assert values.batch_counts(entry) == (count, sum(map(len, payloads)))
    # The same messages in the first form (a flags byte each) count and read the same.
    flagged = values.encode_batch([values.payload_header() + p for p in payloads])
    assert values.batch_counts(flagged) == values.batch_counts(entry)
    with pytest.raises(ValueError):
        values.decode_value(entry)
    with pytest.raises(ValueError):
        values.encode_plain_batch(payloads[:1])


@given(
    st.lists(st.tuples(st.binary(max_size=300), st.binary(max_size=130)), min_size=2, max_size=40),
    st.booleans(),
    st.integers(1, 2**63 - 1),
)
def test_a_transactions_entry_from_a_payloads_body_is_the_one_its_stored_values_make(
    messages: list[tuple[bytes, bytes]], keyed: bool, wp: int
) -> None:
    # A payloads body's layout: the payloads back to back, then the keys, with their
    # positions (the entry builder reads only these).
    body = b"head" + b"".join(p for p, _ in messages) + b"".join(k for _, k in messages)
    positions = [4]
    for p, _ in messages:
        positions.append(positions[-1] + len(p))
    key_positions = [positions[-1]]
    for _, k in messages:
        key_positions.append(key_positions[-1] + len(k))
    made = values.encode_tx_batch_in(body, positions, key_positions if keyed else None, wp)
    if keyed and max(len(k) for _, k in messages) >= 0x80:
        assert made is None  # a long key: rows of their own
        return
    if keyed:
        stored = [values.encode_value(p, wp, k) for p, k in messages]
    else:
        stored = [values.encode_value(p, wp) for p, _ in messages]
    assert made == values.encode_batch(stored, keyed, wp)
    assert made is not None and values.read_write_pointer(made) == wp
