"""The Arrow <-> body paths (Avro and columnar) agree with the row-by-row ones they replace."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DataType,
    MapType,
    StringType,
    StructField,
    StructType,
)

from tidings.codec import avro, columns, wire
from tidings.codec.media import AVRO_EXT
from tidings.spark.bodies import poll_batch, read_column_body, read_poll_body, store_bodies
from tidings.spark.schema import (
    arrow_read_schema,
    messages_to_batch,
    records_from_batch,
    write_columns,
)
from tidings.structs import Message, MessageId, Record

pytestmark = pytest.mark.spark


def _header_type(as_map: bool) -> DataType:
    """A written ``headers`` column's type: a map, or a list of key/value structs."""
    if as_map:
        return MapType(StringType(), BinaryType())
    pair = StructType([StructField("key", StringType()), StructField("value", BinaryType())])
    return ArrayType(pair)


def _messages(n: int) -> list[Message]:
    out = []
    for i in range(n):
        mid = MessageId(1_700_000_000_000 + i // 3, i % 3, 1_700_000_000_000 + i, i)
        key = None if i % 4 else b"k%d" % i
        headers = {} if i % 3 == 0 else ({"a": b"x" * i, "bb": b""} if i % 2 else {"h": b"1"})
        out.append(Message(mid, b"p" * (i * 7), key, headers, None, 0))
    return out


def test_a_poll_body_reads_into_the_same_batch_as_messages() -> None:
    messages = _messages(50)
    page = read_poll_body(avro.write_messages(messages, extended=True))
    schema = arrow_read_schema()
    got = poll_batch(page, 40, "t", "ns", schema)
    assert got.equals(messages_to_batch(messages[:40], "t", "ns", schema))
    assert page.cut(messages[10].id, None) == 11
    assert page.cut(messages[49].id, messages[30].id.publish_ts) == 30


# Payload lengths of one, two and three varint bytes (63, 8,191 bytes are the edges).
_payload_sizes = st.sampled_from([0, 1, 63, 64, 1024, 8191, 8192, 20_000])
_poll_messages = st.lists(
    st.builds(
        Message,
        st.builds(
            MessageId,
            st.integers(0, 2**63 - 1),
            st.integers(0, 2**16 - 1),
            st.integers(0, 2**63 - 1),
            st.integers(0, 2**16 - 1),
        ),
        st.builds(lambda n, b: b * n, _payload_sizes, st.binary(min_size=1, max_size=1)),
        st.none() | st.binary(max_size=70),
        st.dictionaries(st.text(max_size=6), st.binary(max_size=70), max_size=3),
    ),
    max_size=25,
)


@settings(max_examples=150, deadline=None)
@given(_poll_messages)
def test_a_poll_body_reads_into_the_columns_of_its_messages(messages: list[Message]) -> None:
    page = read_poll_body(avro.write_messages(messages, extended=True))
    assert page.ids == [m.id.to_bytes() for m in messages]
    assert page.payloads == [m.payload for m in messages]
    assert page.keys == [m.key for m in messages]
    offsets = [0]
    for m in messages:
        offsets.append(offsets[-1] + len(m.headers))
    assert page.header_offsets == offsets
    assert page.header_names == [name for m in messages for name in m.headers]
    assert page.header_values == [value for m in messages for value in m.headers.values()]


# Publish times up to the year 2248, so that they fit a timestamp in microseconds.
_ids = st.lists(
    st.builds(
        MessageId,
        st.integers(0, 2**43),
        st.integers(0, 2**16 - 1),
        st.integers(0, 2**43),
        st.integers(0, 2**16 - 1),
    ),
    unique=True,
    max_size=30,
).map(sorted)


@st.composite
def _column_pages(draw: st.DrawFn) -> list[Message]:
    """Messages in id order; a page may have no key or no header in any row, so that
    bodies with and without those columns both come up."""
    ids = draw(_ids)
    with_keys, with_headers = draw(st.booleans()), draw(st.booleans())
    keys = st.none() | st.just(b"") | st.binary(min_size=1, max_size=40)
    headers = st.dictionaries(st.text(max_size=8), st.binary(max_size=40), max_size=4)
    return [
        Message(
            mid,
            draw(st.binary(max_size=200)),
            draw(keys) if with_keys else None,
            draw(headers) if with_headers else {},
            None,
            0,
        )
        for mid in ids
    ]


@settings(max_examples=200, deadline=None)
@given(_column_pages(), st.data())
def test_a_columnar_body_makes_the_batch_its_avro_body_makes(
    messages: list[Message], data: st.DataObject
) -> None:
    schema = arrow_read_schema()
    columnar = read_column_body(columns.write_messages(messages))
    page = read_poll_body(avro.write_messages(messages, extended=True))
    n = len(messages)
    assert len(columnar) == n
    for rows in (n, data.draw(st.integers(0, n), label="rows")):
        got = poll_batch(columnar, rows, "t", "ns", schema)
        got.validate(full=True)
        assert got.equals(poll_batch(page, rows, "t", "ns", schema))
        assert got.equals(messages_to_batch(messages[:rows], "t", "ns", schema))
    if messages:
        assert columnar.ids[-1] == page.ids[-1]
        end = data.draw(st.sampled_from(messages), label="end").id
        before = data.draw(st.none() | st.integers(0, 2**43 + 1), label="before_ts")
        assert columnar.cut(end, before) == page.cut(end, before)


def test_an_empty_columnar_body_is_a_page_of_no_rows() -> None:
    page = read_column_body(b"")
    assert len(page) == 0
    assert poll_batch(page, 0, "t", "ns", arrow_read_schema()).num_rows == 0


def test_a_columnar_page_gives_no_more_rows_than_it_has() -> None:
    page = read_column_body(columns.write_messages(_messages(3)))
    with pytest.raises(ValueError, match="rows"):
        poll_batch(page, 4, "t", "ns", arrow_read_schema())
    with pytest.raises(IndexError):
        page.ids[3]


@pytest.mark.parametrize("as_map", [False, True])
def test_store_bodies_carry_the_rows_records_from_batch_makes(as_map: bool) -> None:
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema

    header_type = _header_type(as_map)
    schema = StructType(
        [
            StructField("key", BinaryType()),
            StructField("value", StringType()),
            StructField("headers", header_type),
            StructField("topic", StringType()),
        ]
    )
    rows: list[dict[str, Any]] = []
    for i in range(30):
        headers: Any = None
        if i % 5:
            headers = (
                [("a", b"v%d" % i), ("z", None)]
                if as_map
                else [{"key": "a", "value": b"v%d" % i}, None, {"key": "z", "value": None}]
            )
        rows.append(
            {
                "key": None if i % 2 else b"k",
                "value": f"val{i}",
                "headers": headers,
                "topic": f"t{i % 2}",
            }
        )
    batch = pa.RecordBatch.from_pylist(rows, schema=to_arrow_schema(schema))
    columns = write_columns(schema, None)
    expected: dict[str, list[Record]] = {}
    for topic, record in records_from_batch(batch, columns, None):
        expected.setdefault(topic, []).append(record)
    bodies = list(store_bodies(batch, columns, None, 77, max_records=4, max_bytes=1 << 20))
    assert all(b.rows <= 4 for b in bodies)
    for topic, records in expected.items():
        got: list[Record] = []
        for body in bodies:
            if body.topic == topic:
                request = wire.decode_publish_request(body.body, AVRO_EXT)
                assert request.write_pointer == 77
                assert len(request.records) == body.rows
                got.extend(r if isinstance(r, Record) else Record(r) for r in request.records)
        assert [(r.payload, r.key, dict(r.headers)) for r in got] == [
            (r.payload, r.key, dict(r.headers)) for r in records
        ]


def test_store_bodies_cover_the_rows_before_a_null_value_then_refuse() -> None:
    import pyarrow as pa

    schema = StructType([StructField("value", BinaryType())])
    batch = pa.record_batch([pa.array([b"a", b"b", b"c", None, b"e"], pa.binary())], ["value"])
    made = store_bodies(batch, write_columns(schema, "t"), "t", 5, max_records=2, max_bytes=1 << 20)
    assert next(made).rows == 2
    assert next(made).rows == 1
    with pytest.raises(ValueError, match="must not be null"):
        next(made)


def _header_entry(as_map: bool) -> st.SearchStrategy[Any]:
    value = st.one_of(st.none(), st.binary(max_size=300))
    name = st.sampled_from(["a", "bb", "source-id", "n" * 70])
    if as_map:
        return st.tuples(name, value)
    return st.one_of(st.none(), st.fixed_dictionaries({"key": name, "value": value}))


@st.composite
def _write_batches(draw: st.DrawFn) -> tuple[Any, Any, int, int]:
    """A batch to write (keys, headers as a list or a map with null rows, entries and
    values, payloads whose lengths take one to three varint bytes), possibly a slice of
    a larger one, and the two limits that cut it into bodies."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema

    as_map = draw(st.booleans())
    header_type = _header_type(as_map)
    value_type = draw(st.sampled_from([StringType(), BinaryType()]))
    schema = StructType(
        [
            StructField("key", BinaryType()),
            StructField("value", value_type),
            StructField("headers", header_type),
            StructField("topic", StringType()),
        ]
    )
    lengths = st.one_of(st.integers(0, 70), st.sampled_from([8191, 8192, 20_000]))
    rows = []
    for _ in range(draw(st.integers(0, 25))):
        entries = draw(st.one_of(st.none(), st.lists(_header_entry(as_map), max_size=3)))
        if as_map and entries is not None:
            entries = list(dict(entries).items())  # a map's names are distinct
        size = draw(lengths)
        rows.append(
            {
                "key": draw(st.one_of(st.none(), st.binary(max_size=100))),
                "value": "v" * size if value_type == StringType() else b"v" * size,
                "headers": entries,
                "topic": draw(st.sampled_from(["t0", "t1"])),
            }
        )
    batch = pa.RecordBatch.from_pylist(rows, schema=to_arrow_schema(schema))
    first = draw(st.integers(0, len(rows)))
    batch = batch.slice(first, draw(st.integers(0, len(rows) - first)))
    max_records = draw(st.sampled_from([1, 3, 10_000]))
    max_bytes = draw(st.sampled_from([1, 500, 1 << 20]))
    return schema, batch, max_records, max_bytes


@settings(max_examples=150, deadline=None)
@given(_write_batches())
def test_store_bodies_of_any_batch_decode_to_its_rows(case: tuple[Any, Any, int, int]) -> None:
    schema, batch, max_records, max_bytes = case
    columns = write_columns(schema, None)
    expected: dict[str, list[tuple[bytes, bytes | None, dict[str, bytes]]]] = {}
    for topic, record in records_from_batch(batch, columns, None):
        expected.setdefault(topic, []).append((record.payload, record.key, dict(record.headers)))
    got: dict[str, list[tuple[bytes, bytes | None, dict[str, bytes]]]] = {}
    for body in store_bodies(batch, columns, None, 9, max_records=max_records, max_bytes=max_bytes):
        assert 1 <= body.rows <= max_records
        request = wire.decode_publish_request(body.body, AVRO_EXT)
        assert request.write_pointer == 9
        assert len(request.records) == body.rows
        records = [r if isinstance(r, Record) else Record(r) for r in request.records]
        # A body goes past max_bytes only by its last row.
        assert sum(len(r.payload) + 64 for r in records[:-1]) < max_bytes
        got.setdefault(body.topic, []).extend((r.payload, r.key, dict(r.headers)) for r in records)
    assert got == expected


def test_store_bodies_refuse_a_header_without_a_name() -> None:
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema

    schema = StructType(
        [StructField("value", BinaryType()), StructField("headers", _header_type(False))]
    )
    rows = [
        {"value": b"a", "headers": [{"key": "h", "value": b"1"}]},
        {"value": b"b", "headers": [{"key": None, "value": b"2"}]},
    ]
    batch = pa.RecordBatch.from_pylist(rows, schema=to_arrow_schema(schema))
    with pytest.raises(ValueError, match="header key must not be null"):
        list(
            store_bodies(
                batch, write_columns(schema, "t"), "t", 5, max_records=10, max_bytes=1 << 20
            )
        )
    # A null name under a null list or a null entry is no header at all.
    rows[1]["headers"] = None
    batch = pa.RecordBatch.from_pylist(rows, schema=to_arrow_schema(schema))
    (body,) = store_bodies(
        batch, write_columns(schema, "t"), "t", 5, max_records=10, max_bytes=1 << 20
    )
    assert body.rows == 2
