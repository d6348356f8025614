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

_payloads = st.lists(st.binary(max_size=200), max_size=30)
_pointers = st.none() | st.integers(1, 2**63 - 1)


@given(_payloads, _pointers)
def test_a_body_reads_back_as_written(payloads: list[bytes], write_pointer: int | None) -> None:
    frames = read_frames(write_frames(write_pointer, payloads))
    assert frames.write_pointer == write_pointer
    assert len(frames) == len(payloads)
    assert frames.payloads() == payloads
    assert frames.size == sum(map(len, payloads))


@given(st.lists(st.binary(max_size=200), min_size=2, max_size=30))
def test_its_batch_entry_is_the_one_a_list_of_the_payloads_makes(payloads: list[bytes]) -> None:
    frames = read_frames(write_frames(None, payloads))
    entry = values.encode_plain_batch_in(frames.body, payload_frames.POSITIONS_AT, len(frames))
    assert entry == values.encode_plain_batch(payloads)


def _body(
    count: int, write_pointer: int, positions: list[int], data: bytes, flags: int = 0
) -> bytes:
    head = struct.pack("<4sIIq", b"TDP1", count, flags, write_pointer)
    return head + struct.pack(f"<{len(positions)}I", *positions) + data


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (b"", "shorter than its head"),
        (b"TDP1" + bytes(19), "shorter than its head"),
        (_body(0, 0, [24], b"").replace(b"TDP1", b"TDC1"), "starts"),
        (_body(0, 0, [24], b"", flags=1), "no flag is defined"),
        (_body(1, -5, [28, 29], b"a"), "positive"),
        (_body(1000, 0, [24], b""), "1000 payloads need"),
        (_body(2**32 - 1, 0, [24], b""), "payloads need"),
        (_body(1, 0, [27, 29], b"a"), "from the end of their column"),
        (_body(1, 0, [28, 30], b"a"), "to the body's end"),
        (_body(2, 0, [32, 34, 33], b"ab"), "from the end"),
        (_body(3, 0, [36, 38, 37, 38], b"ab"), "decrease"),
    ],
)
def test_a_malformed_body_is_a_bad_request(body: bytes, why: str) -> None:
    with pytest.raises(BadRequest, match=why):
        read_frames(body)


@given(st.binary(max_size=80))
def test_any_bytes_read_or_are_refused(body: bytes) -> None:
    try:
        frames = read_frames(body)
    except BadRequest:
        return
    assert sum(map(len, frames.payloads())) == frames.size == len(body) - frames.positions[0]


def test_the_content_type_is_named_in_any_case_and_with_parameters() -> None:
    names = payload_frames.names_frames
    assert names("application/vnd.tidings.payloads")
    assert names("Application/VND.Tidings.Payloads; charset=binary")
    assert not names(None)
    assert not names("avro/binary")
    assert not names("application/vnd.tidings.columns")
