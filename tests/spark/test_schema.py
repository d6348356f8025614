"""Rows read and written: Arrow batches and column checks (no Spark session needed)."""

from __future__ import annotations

import pyarrow as pa
import pytest
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    MapType,
    StringType,
    StructField,
    StructType,
)

from tidings.spark.schema import (
    READ_SCHEMA,
    arrow_read_schema,
    check_read_schema,
    messages_to_batch,
    records_from_batch,
    write_columns,
)
from tidings.structs import Message, MessageId, Record

pytestmark = pytest.mark.spark


def test_read_batch_matches_what_spark_expects() -> None:
    schema = arrow_read_schema()
    messages = [
        Message(MessageId(1_700_000_000_123, 0), b"v1", b"k1", {"h": b"x", "g": b""}),
        Message(MessageId(1_700_000_000_124, 1, 9, 3), b"v2"),
    ]
    batch = messages_to_batch(messages, "t", "ns", schema)
    assert batch.schema.equals(schema)
    rows = batch.to_pylist()
    assert rows[0]["key"] == b"k1" and rows[0]["value"] == b"v1"
    assert rows[0]["topic"] == "t" and rows[0]["namespace"] == "ns"
    assert rows[0]["messageId"] == messages[0].id.hex
    assert rows[0]["publishTime"].timestamp() == 1_700_000_000.123
    assert rows[0]["headers"] == [{"key": "h", "value": b"x"}, {"key": "g", "value": b""}]
    assert rows[1]["key"] is None and rows[1]["headers"] == []


def test_user_schema_must_be_the_read_schema() -> None:
    assert check_read_schema(None) is READ_SCHEMA
    assert check_read_schema(READ_SCHEMA) is READ_SCHEMA
    with pytest.raises(ValueError, match="fixed schema"):
        check_read_schema(StructType([StructField("value", StringType())]))


def _schema(**fields: object) -> StructType:
    return StructType([StructField(n, t) for n, t in fields.items()])  # type: ignore[arg-type]


def test_write_columns_checks() -> None:
    cols = write_columns(_schema(value=BinaryType(), topic=StringType(), x=IntegerType()), None)
    assert cols.topic and not cols.key and not cols.headers
    # the topic option wins over a topic column (as in Spark's Kafka sink)
    assert not write_columns(_schema(value=StringType(), topic=StringType()), "out").topic
    with pytest.raises(ValueError, match="value column"):
        write_columns(_schema(key=BinaryType()), "t")
    with pytest.raises(ValueError, match="topic option or a topic column"):
        write_columns(_schema(value=BinaryType()), None)
    with pytest.raises(ValueError, match="column value"):
        write_columns(_schema(value=IntegerType()), "t")
    with pytest.raises(ValueError, match="column headers"):
        write_columns(_schema(value=BinaryType(), headers=StringType()), "t")
    assert write_columns(
        _schema(value=BinaryType(), headers=MapType(StringType(), StringType())), "t"
    ).headers_map
    header = StructType([StructField("key", StringType()), StructField("value", BinaryType())])
    assert write_columns(_schema(value=BinaryType(), headers=ArrayType(header)), "t").headers


def test_records_from_arrow_rows() -> None:
    batch = pa.RecordBatch.from_pydict(
        {
            "value": pa.array([b"a", b"b"]),
            "key": pa.array([None, "k"], type=pa.string()),
            "topic": pa.array(["t1", "t2"]),
            "headers": pa.array(
                [[{"key": "h", "value": b"1"}], None],
                type=pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())])),
            ),
        }
    )
    schema = _schema(
        value=BinaryType(),
        key=StringType(),
        topic=StringType(),
        headers=ArrayType(
            StructType([StructField("key", StringType()), StructField("value", BinaryType())])
        ),
    )
    rows = list(records_from_batch(batch, write_columns(schema, None), None))
    assert rows == [("t1", Record(b"a", None, {"h": b"1"})), ("t2", Record(b"b", b"k", {}))]
    rows = list(records_from_batch(batch, write_columns(schema, "out"), "out"))
    assert [t for t, _ in rows] == ["out", "out"]


def test_null_values_are_refused() -> None:
    batch = pa.RecordBatch.from_pydict({"value": pa.array([None], type=pa.binary())})
    cols = write_columns(_schema(value=BinaryType()), "t")
    with pytest.raises(ValueError, match="must not be null"):
        list(records_from_batch(batch, cols, "t"))
