"""The payloads request body: what a writer sends is what the server reads, and any
body that is not exactly that layout is refused with a BadRequest naming why."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidings.codec import payload_frames, values
from tidings.codec.payload_frames import read_frames, write_frames
from tidings.errors import BadRequest
from tidings.structs import Record

_payloads = st.lists(st.binary(max_size=200), max_size=30)
_pointers = st.none() | st.integers(1, 2**63 - 1)
#: Messages with or without a key (a key may be empty, or long).
_messages = st.lists(
    st.binary(max_size=60)
    | st.tuples(st.binary(max_size=60), st.binary(max_size=140)).map(lambda pk: Record(*pk)),
    max_size=30,
)


@given(_payloads, _pointers)
def test_a_body_reads_back_as_written(payloads: list[bytes], write_pointer: int | None) -> None:
    frames = read_frames(write_frames(write_pointer, payloads))
    assert frames.write_pointer == write_pointer
    assert len(frames) == len(payloads)
    assert frames.payloads() == payloads
    assert frames.records() == payloads
    assert frames.size == sum(map(len, payloads))
    assert frames.key_positions is None and not frames.all_keyed


@given(_messages, _pointers)
def test_keyed_messages_read_back_as_written(
    messages: list[Record | bytes], write_pointer: int | None
) -> None:
    frames = read_frames(write_frames(write_pointer, messages))
    assert frames.write_pointer == write_pointer
    assert frames.records() == messages
    keyed = [m for m in messages if isinstance(m, Record)]
    assert frames.all_keyed == (len(keyed) == len(messages) and bool(messages))
    if frames.all_keyed and len(messages) > 1 and frames.key_positions is not None:
        # A keyed batch entry holds them unless a key is too long for one.
        entry = values.encode_keyed_batch_in(frames.body, frames.positions, frames.key_positions)
        assert (entry is None) == any(len(r.key or b"") >= 128 for r in keyed)


@given(st.lists(st.binary(max_size=200), min_size=2, max_size=30))
def test_its_batch_entry_is_the_one_a_list_of_the_payloads_makes(payloads: list[bytes]) -> None:
    frames = read_frames(write_frames(None, payloads))
    entry = values.encode_plain_batch_in(frames.body, payload_frames.POSITIONS_AT, len(frames))
    assert entry == values.encode_plain_batch(payloads)


@given(st.lists(st.tuples(st.binary(max_size=100), st.binary(max_size=127)), min_size=2))
def test_its_keyed_batch_entry_is_the_one_of_their_stored_values(
    messages: list[tuple[bytes, bytes]],
) -> None:
    frames = read_frames(write_frames(None, [Record(p, k) for p, k in messages]))
    assert frames.key_positions is not None and frames.all_keyed
    entry = values.encode_keyed_batch_in(frames.body, frames.positions, frames.key_positions)
    stored = [values.keyed_header() + bytes([len(k)]) + k + p for p, k in messages]
    assert entry == values.encode_batch(stored, keyed=True)


def test_headers_and_ttls_are_not_carried() -> None:
    with pytest.raises(ValueError, match="keys only"):
        write_frames(None, [Record(b"p", b"k", {"h": b"v"})])
    with pytest.raises(ValueError, match="keys only"):
        write_frames(None, [b"a", Record(b"p", ttl=5)])


def _body(
    count: int, write_pointer: int, positions: list[int], data: bytes, flags: int = 0
) -> bytes:
    head = struct.pack("<4sIIq", b"TDP1", count, flags, write_pointer)
    return head + struct.pack(f"<{len(positions)}I", *positions) + data


def _keyed(payloads: list[int], keys: list[int], presence: bytes, data: bytes) -> bytes:
    """A keyed body of ``len(presence)`` messages with these columns (padding added)."""
    n = len(presence)
    columns = struct.pack(f"<{len(keys)}I", *keys) + presence + bytes(-n % 4)
    return _body(n, 0, payloads, columns + data, flags=payload_frames.KEYS)


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (b"", "shorter than its head"),
        (b"TDP1" + bytes(19), "shorter than its head"),
        (_body(0, 0, [24], b"").replace(b"TDP1", b"TDC1"), "starts"),
        (_body(0, 0, [24], b"", flags=2), "only 1 \\(keys\\) is defined"),
        (_body(1, -5, [28, 29], b"a"), "positive"),
        (_body(1000, 0, [24], b""), "1000 messages need"),
        (_body(2**32 - 1, 0, [24], b""), "messages need"),
        (_body(1, 0, [27, 29], b"a"), "payload positions must run from 28 to 29"),
        (_body(1, 0, [28, 30], b"a"), "must run from 28 to 29"),
        (_body(2, 0, [32, 34, 33], b"ab"), "must run from"),
        (_body(3, 0, [36, 38, 37, 38], b"ab"), "payload positions decrease"),
        # Keyed: 2 messages, payloads from 48 (after 20 + 12 + 12 + 4), keys after them.
        (_keyed([48, 49, 50], [50, 51, 52], b"\x01\x01", b"abkl"), None),
        (_keyed([48, 49, 50], [50, 51, 52], b"\x01\x02", b"abkl"), "neither 0 nor 1"),
        (_keyed([48, 49, 50], [50, 51, 52], b"\x01\x00", b"abkl"), "without a key has key"),
        (_keyed([48, 49, 50], [50, 52, 51], b"\x01\x01", b"abkl"), "key positions"),
        (_keyed([48, 49, 50], [50, 51, 53], b"\x01\x01", b"abkl"), "key positions must run"),
        (_keyed([48, 51, 50], [50, 51, 52], b"\x01\x01", b"abkl"), "payload positions decrease"),
        (_keyed([48, 49, 50], [50, 51, 52], b"\x01\x01", b"abkl")[:-1], "must run"),
    ],
)
def test_a_malformed_body_is_a_bad_request(body: bytes, why: str | None) -> None:
    if why is None:  # the well-formed one the keyed cases below it break
        assert read_frames(body).records() == [Record(b"a", b"k"), Record(b"b", b"l")]
        return
    with pytest.raises(BadRequest, match=why):
        read_frames(body)


def test_the_presence_bytes_padding_must_be_zero() -> None:
    good = _keyed([48, 49, 50], [50, 51, 52], b"\x01\x01", b"abkl")
    bad = good[:46] + b"\x01" + good[47:]  # a padding byte after the two presence bytes
    assert read_frames(good).all_keyed
    with pytest.raises(BadRequest, match="padding"):
        read_frames(bad)


@given(st.binary(max_size=80), st.booleans())
def test_any_bytes_read_or_are_refused(tail: bytes, keyed: bool) -> None:
    body = struct.pack("<4sI", b"TDP1", len(tail) // 12) + struct.pack("<I", keyed) + tail
    try:
        frames = read_frames(body)
    except BadRequest:
        return
    assert sum(map(len, frames.payloads())) == frames.size
    assert len(frames.records()) == len(frames)


def test_the_content_type_is_named_in_any_case_and_with_parameters() -> None:
    names = payload_frames.names_frames
    assert names("application/vnd.tidings.payloads")
    assert names("Application/VND.Tidings.Payloads; charset=binary")
    assert not names(None)
    assert not names("avro/binary")
    assert not names("application/vnd.tidings.columns")
