"""The columnar poll response: what is written reads back, anything damaged is refused."""

from __future__ import annotations

import struct
import tracemalloc
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.budget import examples
from tests.test_codec_wire_avro import ids
from tidings.codec import avro, columns, wire
from tidings.errors import BadRequest
from tidings.structs import NO_HEADERS, Message, MessageId


def _messages(headers: st.SearchStrategy[Any], most: int) -> st.SearchStrategy[list[Message]]:
    return st.lists(
        st.builds(
            Message,
            ids,
            st.binary(max_size=300),
            st.none() | st.binary(max_size=40),
            headers,
            write_pointer=st.none(),
            delivery_count=st.just(0),
        ),
        max_size=most,
    )


messages = _messages(
    st.just(NO_HEADERS)
    | st.dictionaries(st.text(min_size=1, max_size=8), st.binary(max_size=20), max_size=3),
    30,
)


@settings(max_examples=examples(100), deadline=None)
@given(batch=messages)
def test_round_trip_and_agreement_with_avro(batch: list[Message]) -> None:
    body = columns.write_messages(batch)
    page = columns.read_columns(body)
    assert len(page) == len(batch)
    assert page.messages() == batch
    assert list(page.iter_messages()) == batch
    if batch:
        assert (page.message_id(0), page.message_id(-1)) == (batch[0].id, batch[-1].id)
    with pytest.raises(IndexError):
        page.message_id(len(batch))
    assert [page.id_bytes(i) for i in range(len(batch))] == [m.id.to_bytes() for m in batch]
    # What a consumer iterating the page takes: the count, the first and last ids, the
    # messages.
    extended = avro.write_messages(batch, extended=True)
    for media, encoded in ((wire.COLUMNS, body), (wire.AVRO_EXT, extended)):
        rows = wire.iterate_messages(encoded, media)
        assert rows.count == len(batch)
        assert (rows.first, rows.last) == ((batch[0].id, batch[-1].id) if batch else (None, None))
        assert [m.id for m in rows.messages] == [m.id for m in batch]
    # The client reads it as it reads the extended Avro answer of the same messages.
    assert wire.decode_messages(body, wire.COLUMNS) == avro.read_messages(extended, extended=True)


# Blocks of rows without headers: keyed, keyless, or with some rows keyless.
_headerless = _messages(st.just(NO_HEADERS), 20)


def _blocks_of(batch: list[Message], keyed: bool) -> columns.ColumnBlocks:
    return columns.column_blocks(
        [m.id.to_bytes() for m in batch],
        [m.payload for m in batch],
        [m.key for m in batch] if keyed else None,
    )


@settings(max_examples=examples(80), deadline=None)
@given(st.lists(st.tuples(_headerless, st.booleans()), max_size=4), st.data())
def test_ranges_of_blocks_write_the_body_their_rows_make(
    blocks: list[tuple[list[Message], bool]], data: st.DataObject
) -> None:
    # Whatever ranges of whatever blocks (with a key column or not; rows of a block
    # without one have no key), the body is the one write_columns makes of the rows.
    parts = []
    rows: list[Message] = []
    for batch, keyed in blocks:
        laid = _blocks_of(batch, keyed)
        assert laid.count == len(batch)
        a = data.draw(st.integers(0, len(batch)))
        b = data.draw(st.integers(a, len(batch)))
        parts.append((laid, a, b))
        taken = batch[a:b] if keyed else [m._replace(key=None) for m in batch[a:b]]
        rows += taken
        assert laid.data(a, b) == sum(len(m.payload) + len(m.key or b"") for m in taken)
    body = columns.write_blocks(parts)
    keyed_rows = any(laid.keys is not None for laid, a, b in parts if b > a)
    assert body == columns.write_columns(
        [m.id.to_bytes() for m in rows],
        [m.payload for m in rows],
        [m.key for m in rows] if keyed_rows else None,
    )
    assert columns.read_columns(body).messages() == rows


@settings(max_examples=examples(80), deadline=None)
@given(_headerless, st.booleans(), st.data())
def test_a_cut_of_blocks_ends_at_the_row_that_reaches_the_budget(
    batch: list[Message], keyed: bool, data: st.DataObject
) -> None:
    laid = _blocks_of(batch, keyed)
    a = data.draw(st.integers(0, len(batch)))
    b = data.draw(st.integers(a, len(batch)))
    budget = data.draw(st.integers(1, 400))
    spent, end = 0, b
    for i in range(a, b):
        spent += len(batch[i].payload) + (len(batch[i].key or b"") if keyed else 0)
        if spent >= budget:
            end = i + 1
            break
    assert laid.cut(a, b, budget) == end


def test_columns_are_written_only_when_a_row_needs_them() -> None:
    one = Message(MessageId(1, 2), b"p")
    assert struct.unpack_from("<I", columns.write_messages([one]), 8) == (0,)
    keyed = columns.write_messages([one, one._replace(key=b"")])
    assert struct.unpack_from("<I", keyed, 8) == (columns.KEYS,)
    assert columns.read_columns(keyed).messages()[1].key == b""
    headed = columns.write_messages([one._replace(headers={"h": b"v"}), one])
    assert struct.unpack_from("<II", headed, 8) == (columns.HEADERS, 1)
    assert columns.read_columns(columns.write_messages([])).messages() == []
    # Every row keyed (empty keys too) reads back as written.
    all_keyed = [one._replace(key=k) for k in (b"a", b"", b"bc")]
    page = columns.read_columns(columns.write_messages(all_keyed))
    assert [m.key for m in page.messages()] == [b"a", b"", b"bc"]


def test_columns_of_different_lengths_are_refused() -> None:
    with pytest.raises(ValueError):
        columns.write_columns([bytes(20)], [])
    with pytest.raises(ValueError):
        columns.write_columns([bytes(20)], [b"p"], [None, None])


@settings(max_examples=examples(60), deadline=None)
@given(batch=messages.filter(bool), data=st.data())
def test_damaged_bodies_are_refused_or_read_whole(
    batch: list[Message], data: st.DataObject
) -> None:
    body = bytearray(columns.write_messages(batch))
    how = data.draw(st.sampled_from(["cut", "extend", "flip"]))
    if how == "cut":
        damaged = bytes(body[: data.draw(st.integers(0, len(body) - 1))])
    elif how == "extend":
        damaged = bytes(body) + data.draw(st.binary(min_size=1, max_size=8))
    else:
        at = data.draw(st.integers(0, len(body) - 1))
        body[at] ^= data.draw(st.integers(1, 255))
        damaged = bytes(body)
    try:
        page = columns.read_columns(damaged)
    except ValueError:
        with pytest.raises(BadRequest):
            wire.decode_messages(damaged, wire.COLUMNS)
        return
    # A flip inside an id, a payload or a key reads as other bytes, never as an error
    # or a row out of place.
    assert how == "flip"
    got = page.messages()
    assert len(got) == len(batch)


def test_specific_damage_is_refused() -> None:
    good = columns.write_messages([Message(MessageId(1, 2), b"abc", b"k")])
    assert columns.read_columns(good).messages()[0].key == b"k"
    for bad in (
        b"",
        b"TDC2" + good[4:],  # another magic
        good[:8] + struct.pack("<I", 4) + good[12:],  # an unknown flag
        good[:12] + struct.pack("<I", 1) + good[16:],  # header entries without headers
        good + b"\0",  # trailing bytes
        good[:-1],
    ):
        with pytest.raises(ValueError):
            columns.read_columns(bad)
    # The presence byte of a row with a key set to 0: a key on a keyless row.
    n = 1
    present_at = 16 + 20 * n + 4 * (n + 1) * 2
    damaged = bytearray(good)
    damaged[present_at] = 0
    with pytest.raises(ValueError, match="a key on a row without one"):
        columns.read_columns(bytes(damaged))
    damaged[present_at] = 2
    with pytest.raises(ValueError, match="bad key column"):
        columns.read_columns(bytes(damaged))


def test_offsets_out_of_order_are_refused() -> None:
    # The first and last offsets as they should be, two in between swapped: each
    # slice still lies inside the body, but the rows would overlap.
    n = 3
    good = columns.write_messages(
        [Message(MessageId(1, j), b"p" * (j + 1), b"k" * (j + 1)) for j in range(n)]
    )
    assert [m.payload for m in columns.read_columns(good).messages()] == [b"p", b"pp", b"ppp"]
    payload_at = 16 + 20 * n
    key_at = payload_at + 4 * (n + 1)
    for at, what in ((payload_at, "bad payload offsets"), (key_at, "bad key column")):
        damaged = bytearray(good)
        first, second = damaged[at + 4 : at + 8], damaged[at + 8 : at + 12]
        damaged[at + 4 : at + 8], damaged[at + 8 : at + 12] = second, first
        with pytest.raises(ValueError, match=what):
            columns.read_columns(bytes(damaged))


def test_a_header_name_cut_inside_a_character_is_refused() -> None:
    good = columns.write_messages([Message(MessageId(1, 2), b"p", None, {"ab": b"1", "cd": b"2"})])
    at = good.index(b"abcd")
    # "a\xc3" and "\xa9d": together the valid "aéd", each on its own not UTF-8.
    damaged = good[:at] + b"a\xc3\xa9d" + good[at + 4 :]
    with pytest.raises(ValueError, match="not UTF-8"):
        columns.read_columns(damaged)
    assert dict(columns.read_columns(good).messages()[0].headers) == {"ab": b"1", "cd": b"2"}


def test_a_page_iterated_makes_each_message_when_it_is_taken() -> None:
    # A consumer iterating a page holds one message at a time, not the page's worth
    # (two tuples and a payload copy each) that would set the collector off.
    batch = [Message(MessageId(1, j), bytes([j % 256]) * 1024) for j in range(1000)]
    page = columns.read_columns(columns.write_messages(batch))
    tracemalloc.start()
    try:
        rest = page.iter_messages()
        first = next(rest)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert first == batch[0]
    assert peak < 100_000  # the page's payloads alone are 1 MB
    assert [first, *rest] == batch
