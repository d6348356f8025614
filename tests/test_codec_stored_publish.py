"""Publish bodies read straight into stored values agree with the general path.

The general path: fastavro decodes the body into records, and the messaging core
encodes each record's stored value. :func:`read_stored_batch` must give the same
values (or None, leaving the body to the general path), for every body: the ones
clients send, the ones fastavro writes, and damaged ones.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.budget import examples
from tidings.codec import avro, wire
from tidings.codec.media import AVRO, AVRO_EXT
from tidings.codec.stored_publish import StoredBatch, read_stored_batch
from tidings.errors import BadRequest, TidingsError
from tidings.messaging import publishing
from tidings.structs import Record

NOW = 1_700_000_000_000

pointers = st.none() | st.integers(1, 2**63 - 1)
# Payloads past 127 and 16,383 bytes cross varint length boundaries; a short run
# repeated keeps hypothesis from drawing kilobytes byte by byte.
payloads = st.one_of(
    st.binary(max_size=200),
    st.builds(lambda n, run: (run * n)[: n * 3], st.integers(40, 6000), st.binary(min_size=3)),
)
records = st.builds(
    Record,
    payloads,
    st.none() | st.binary(max_size=150),
    st.dictionaries(st.text(max_size=12), st.binary(max_size=140), max_size=3),
    st.none(),
)
with_ttl = st.builds(Record, st.binary(max_size=20), st.none(), st.just({}), st.integers(1, 10**6))


def general(body: bytes, media: wire.Media, store: bool) -> publishing.EncodedBatch:
    request = wire.decode_publish_request(body, media)
    assert not isinstance(request.records, StoredBatch)
    return publishing.encode_batch(request.records, None if store else request.write_pointer, NOW)


def check(body: bytes, media: wire.Media) -> StoredBatch | None:
    """Both paths agree on ``body``; returns the publish's stored batch."""
    answers = []
    for store in (False, True):
        stored = read_stored_batch(body, media is AVRO_EXT, store=store)
        answers.append(stored)
        if stored is None:
            continue
        expected = general(body, media, store)  # must accept what the fast path took
        assert stored.values == expected.values
        assert stored.size == expected.size
        assert stored.write_pointer == wire.decode_publish_request(body, media).write_pointer
        assert stored.stored_pointer == (None if store else stored.write_pointer)
        decoded = wire.decode_publish_request(
            body, media, stored_for="store" if store else "publish"
        )
        if isinstance(decoded.records, StoredBatch):
            assert decoded.records.values == expected.values
    return answers[0]


@settings(max_examples=examples(100), deadline=None)
@given(pointers, st.lists(records, max_size=30))
def test_client_bodies_are_read_straight_into_the_same_values(
    write_pointer: int | None, batch: list[Record]
) -> None:
    for media in (AVRO, AVRO_EXT):
        # Plain avro/binary carries payloads only.
        sent = batch if media is AVRO_EXT else [r.payload for r in batch]
        body = wire.encode_publish_request(write_pointer, sent, media)
        stored = check(body, media)
        # Without TTLs every body a client sends takes the fast path.
        assert stored is not None
        assert len(stored) == len(batch)


@settings(max_examples=examples(80), deadline=None)
@given(pointers, st.lists(records, max_size=10), st.booleans())
def test_fastavro_bodies_agree(
    write_pointer: int | None, batch: list[Record], null_extras: bool
) -> None:
    value = {
        "transactionWritePointer": write_pointer,
        "messages": [r.payload for r in batch],
        "extras": None
        if null_extras
        else [{"key": r.key, "headers": r.headers, "ttl": None} for r in batch],
    }
    assert check(avro.write(value, avro.PUBLISH_REQUEST_EXT), AVRO_EXT) is not None


@settings(max_examples=examples(100), deadline=None)
@given(pointers, st.lists(records, max_size=5), with_ttl, st.integers(0, 5))
def test_a_ttl_leaves_the_body_to_the_general_path(
    write_pointer: int | None, batch: list[Record], expiring: Record, at: int
) -> None:
    batch.insert(min(at, len(batch)), expiring)
    body = wire.encode_publish_request(write_pointer, batch, AVRO_EXT)
    assert check(body, AVRO_EXT) is None
    assert not isinstance(
        wire.decode_publish_request(body, AVRO_EXT, stored_for="publish").records, StoredBatch
    )


@settings(max_examples=examples(150), deadline=None)
@given(
    pointers,
    st.lists(records, min_size=1, max_size=4),
    st.sampled_from([AVRO, AVRO_EXT]),
    st.data(),
)
def test_damaged_bodies_are_refused_or_read_alike(
    write_pointer: int | None, batch: list[Record], media: wire.Media, data: st.DataObject
) -> None:
    sent = batch if media is AVRO_EXT else [r.payload for r in batch]
    body = bytearray(wire.encode_publish_request(write_pointer, sent, media))
    how = data.draw(st.sampled_from(["flip", "cut", "grow"]))
    if how == "flip":
        at = data.draw(st.integers(0, len(body) - 1))
        body[at] = data.draw(st.integers(0, 255))
    elif how == "cut":
        del body[data.draw(st.integers(0, len(body) - 1)) :]
    else:
        body += data.draw(st.binary(min_size=1, max_size=3))
    refused_or_read_alike(bytes(body), media)


def refused_or_read_alike(damaged: bytes, media: wire.Media) -> None:
    """The fast path refuses ``damaged`` or reads what the general path reads."""
    for store in (False, True):
        stored = read_stored_batch(damaged, media is AVRO_EXT, store=store)
        if stored is None:
            continue
        try:
            expected = general(damaged, media, store)
        except TidingsError:
            pytest.fail("the fast path took a body the general path refuses")
        assert stored.values == expected.values


def test_a_header_named_twice_is_left_to_the_general_path() -> None:
    # One map, one block of two entries with the same name: fastavro keeps the last.
    body = (
        b"\x02"  # no write pointer
        + b"\x02\x02a\x00"  # one message, b"a"
        + b"\x02\x02"  # extras: one
        + b"\x00"  # key: null
        + b"\x04\x02h\x02x\x02h\x02y\x00"  # headers: h=x, h=y
        + b"\x00\x00"  # ttl null; end of extras
    )
    assert read_stored_batch(body, True, store=False) is None
    request = wire.decode_publish_request(body, AVRO_EXT, stored_for="publish")
    assert request.records == [Record(b"a", None, {"h": b"y"}, None)]


def test_a_header_name_that_is_not_utf8_is_refused() -> None:
    body = b"\x02\x02\x02a\x00\x02\x02\x00\x02\x02\xff\x02x\x00\x00\x00"
    assert read_stored_batch(body, True, store=False) is None
    with pytest.raises(BadRequest):
        wire.decode_publish_request(body, AVRO_EXT, stored_for="publish")


def test_values_stored_under_another_pointer_are_refused() -> None:
    body = wire.encode_publish_request(7, [Record(b"a", b"k")], AVRO_EXT)
    stored = read_stored_batch(body, True, store=False)
    assert stored is not None
    with pytest.raises(ValueError):
        publishing.encode_batch(stored, 8, NOW)


@pytest.mark.parametrize("media", [AVRO, AVRO_EXT])
@pytest.mark.parametrize("pointer", [None, 42])
def test_plain_payloads_of_a_kilobyte_are_read_straight(
    media: wire.Media, pointer: int | None
) -> None:
    # Smaller plain payloads go to fastavro (faster for them); from 1 KiB on, this path.
    small = wire.encode_publish_request(pointer, [b"s" * 100] * 50, media)
    large = wire.encode_publish_request(pointer, [bytes([i]) * 1024 for i in range(50)], media)
    assert not isinstance(
        wire.decode_publish_request(small, media, stored_for="publish").records, StoredBatch
    )
    for store in (False, True):
        request = wire.decode_publish_request(
            large, media, stored_for="store" if store else "publish"
        )
        assert isinstance(request.records, StoredBatch) and request.write_pointer == pointer
        assert request.records.values == general(large, media, store).values


@settings(max_examples=examples(100), deadline=None)
@given(
    pointers,
    st.lists(payloads, min_size=1, max_size=30),
    st.sampled_from(["source-id", "h", "n" * 63]),
    st.integers(0, 63),
    st.data(),
)
def test_rows_with_one_header_of_one_layout_are_read_alike(
    write_pointer: int | None,
    batch: list[bytes],
    name: str,
    width: int,
    data: st.DataObject,
) -> None:
    # A Spark sink's rows: every row the same header name and a value of one length
    # (read by one pattern over all rows), and the same with one row that differs.
    records = [
        Record(p, None, {name: data.draw(st.binary(min_size=width, max_size=width))}, None)
        for p in batch
    ]
    odd = data.draw(
        st.sampled_from(["none", "longer", "shorter", "key", "two", "other", "no header", "ttl"])
    )
    row = data.draw(st.integers(0, len(records) - 1))
    payload, header = records[row].payload, records[row].headers
    value = header[name]
    if odd == "longer":
        records[row] = Record(payload, None, {name: value + b"x"}, None)
    elif odd == "shorter" and width:
        records[row] = Record(payload, None, {name: value[:-1]}, None)
    elif odd == "key":
        records[row] = Record(payload, b"k", header, None)
    elif odd == "two":
        records[row] = Record(payload, None, {**header, name + "2": b""}, None)
    elif odd == "other":
        records[row] = Record(payload, None, {name[:-1] + "Z": value}, None)
    elif odd == "no header":
        records[row] = Record(payload, None, {}, None)
    elif odd == "ttl":
        records[row] = Record(payload, None, header, 1000)
    body = wire.encode_publish_request(write_pointer, records, AVRO_EXT)
    stored = check(body, AVRO_EXT)
    assert (stored is None) == (odd == "ttl")
    for damaged in (body + b"\x00", body[:-1], body[:-2] + b"\x01" + body[-1:]):
        refused_or_read_alike(damaged, AVRO_EXT)


@settings(max_examples=examples(100), deadline=None)
@given(
    pointers,
    st.lists(
        st.tuples(payloads, st.binary(max_size=63) | st.binary(min_size=64, max_size=70)),
        min_size=1,
        max_size=30,
    ),
    st.data(),
)
def test_keyed_rows_are_read_alike(
    write_pointer: int | None, keyed: list[tuple[bytes, bytes]], data: st.DataObject
) -> None:
    # A keyed producer's rows: a key and nothing else (read in a loop of their own up to
    # the first row of another kind), and the same with one row that differs.
    records = [Record(p, k) for p, k in keyed]
    odd = data.draw(st.sampled_from(["none", "no key", "header", "long key", "ttl"]))
    row = data.draw(st.integers(0, len(records) - 1))
    payload, key = records[row].payload, records[row].key
    if odd == "no key":
        records[row] = Record(payload)
    elif odd == "header":
        records[row] = Record(payload, key, {"h": b"v"})
    elif odd == "long key":
        records[row] = Record(payload, b"k" * 200)
    elif odd == "ttl":
        records[row] = Record(payload, key, ttl=1000)
    body = wire.encode_publish_request(write_pointer, records, AVRO_EXT)
    stored = check(body, AVRO_EXT)
    assert (stored is None) == (odd == "ttl")
    for damaged in (body + b"\x00", body[:-1], body[:-2] + b"\x01" + body[-1:]):
        refused_or_read_alike(damaged, AVRO_EXT)
    at = data.draw(st.integers(0, len(body) - 1))
    flipped = bytearray(body)
    flipped[at] = data.draw(st.integers(0, 255))
    refused_or_read_alike(bytes(flipped), AVRO_EXT)
    first = records[0]
    if first.key is not None and len(first.key) < 64 and not first.headers:
        # The first key's length made odd: a negative length, refused by both paths.
        plain = avro.write_publish(write_pointer, [r.payload for r in records], extended=False)
        at = len(plain) + 1 + len(avro.varint(len(records))) + 1
        negative = bytearray(body)
        negative[at] |= 1
        refused_or_read_alike(bytes(negative), AVRO_EXT)
