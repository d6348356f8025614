"""The rows the connector reads and writes, modelled on Spark's Kafka source.

Reading yields ``key binary, value binary, topic string, namespace string,
messageId string (40 hex), publishTime timestamp, headers array<struct<key, value>>``,
built as Arrow record batches (one per poll) rather than Python tuples: Spark takes
Arrow as it is, while tuples would be converted value by value.

Writing takes ``value`` (required), ``key``, ``headers`` and ``topic`` columns -- binary
or string for ``key``/``value``, headers as ``array<struct<key string, value
binary|string>>`` or ``map<string, binary|string>`` -- and ignores any other column, so
rows read from Tidings can be written back unchanged.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DataType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from tidings.structs import Message, Record

if TYPE_CHECKING:
    import pyarrow as pa  # type: ignore[import-untyped,unused-ignore]

__all__ = [
    "READ_SCHEMA",
    "WriteColumns",
    "arrow_read_schema",
    "check_read_schema",
    "messages_to_batch",
    "records_from_batch",
    "write_columns",
]

_HEADER = StructType([StructField("key", StringType()), StructField("value", BinaryType())])

#: The schema of every DataFrame read from Tidings.
READ_SCHEMA = StructType(
    [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("namespace", StringType()),
        StructField("messageId", StringType()),
        StructField("publishTime", TimestampType()),
        StructField("headers", ArrayType(_HEADER)),
    ]
)


def check_read_schema(schema: StructType | None) -> StructType:
    """The read schema; a user-given schema must be exactly it (ValueError otherwise)."""
    if schema is not None and schema.simpleString() != READ_SCHEMA.simpleString():
        raise ValueError(
            "the tidings source has a fixed schema; leave .schema() out "
            f"(expected {READ_SCHEMA.simpleString()}, got {schema.simpleString()})"
        )
    return READ_SCHEMA


def arrow_read_schema() -> pa.Schema:
    """The Arrow schema Spark expects for :data:`READ_SCHEMA` (timestamps in UTC)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    schema: pa.Schema = to_arrow_schema(READ_SCHEMA, timezone="UTC")
    return schema


def messages_to_batch(
    messages: Sequence[Message], topic: str, namespace: str, schema: pa.Schema
) -> pa.RecordBatch:
    """One Arrow record batch of read rows for ``messages`` of ``topic``."""
    import pyarrow as pa  # type: ignore[import-untyped,unused-ignore]

    n = len(messages)
    columns = [
        pa.array([m.key for m in messages], type=pa.binary()),
        pa.array([m.payload for m in messages], type=pa.binary()),
        pa.array([topic] * n, type=pa.string()),
        pa.array([namespace] * n, type=pa.string()),
        pa.array([m.id.hex for m in messages], type=pa.string()),
        pa.array([m.id.publish_ts * 1000 for m in messages], type=pa.int64()).cast(
            schema.field("publishTime").type
        ),
        pa.array(
            [[{"key": k, "value": v} for k, v in m.headers.items()] for m in messages],
            type=schema.field("headers").type,
        ),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=schema)


# --- writing ---


@dataclass(frozen=True, slots=True)
class WriteColumns:
    """Which of the written columns exist, and whether ``headers`` is a map."""

    key: bool
    headers: bool
    headers_map: bool
    topic: bool


def _binary_or_string(data_type: DataType) -> bool:
    return isinstance(data_type, BinaryType | StringType)


def write_columns(schema: StructType, topic_option: str | None) -> WriteColumns:
    """Check the columns of a DataFrame being written; ValueError says what is wrong."""
    fields = {f.name: f.dataType for f in schema.fields}
    value = fields.get("value")
    if value is None:
        raise ValueError("writing to tidings needs a value column (binary or string)")
    if not _binary_or_string(value):
        raise ValueError(f"column value must be binary or string, not {value.simpleString()}")
    key = fields.get("key")
    if key is not None and not _binary_or_string(key):
        raise ValueError(f"column key must be binary or string, not {key.simpleString()}")
    topic = fields.get("topic")
    if topic is not None and not isinstance(topic, StringType):
        raise ValueError(f"column topic must be a string, not {topic.simpleString()}")
    if topic is None and topic_option is None:
        raise ValueError("writing to tidings needs a topic option or a topic column")
    headers = fields.get("headers")
    headers_map = False
    if headers is not None:
        if isinstance(headers, MapType):
            ok = isinstance(headers.keyType, StringType) and _binary_or_string(headers.valueType)
            headers_map = True
        elif isinstance(headers, ArrayType) and isinstance(headers.elementType, StructType):
            inner = {f.name: f.dataType for f in headers.elementType.fields}
            ok = (
                set(inner) == {"key", "value"}
                and isinstance(inner["key"], StringType)
                and _binary_or_string(inner["value"])
            )
        else:
            ok = False
        if not ok:
            raise ValueError(
                "column headers must be array<struct<key:string,value:binary>> or "
                f"map<string,binary> (string values allowed), not {headers.simpleString()}"
            )
    return WriteColumns(
        key=key is not None,
        headers=headers is not None,
        headers_map=headers_map,
        topic=topic is not None and topic_option is None,
    )


def _bytes(value: Any, what: str) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    raise ValueError(f"{what} must be binary or string, got {type(value).__name__}")


def _headers(value: Any, as_map: bool) -> dict[str, bytes]:
    if value is None:
        return {}
    out: dict[str, bytes] = {}
    if as_map:
        pairs = value.items() if isinstance(value, dict) else value  # Arrow gives tuples
        for k, v in pairs:
            out[str(k)] = b"" if v is None else _bytes(v, "a header value")
        return out
    for item in value:
        if item is None:
            continue
        k, v = item["key"], item["value"]
        if k is None:
            raise ValueError("a header key must not be null")
        out[str(k)] = b"" if v is None else _bytes(v, "a header value")
    return out


def records_from_batch(
    batch: pa.RecordBatch, columns: WriteColumns, topic_option: str | None
) -> Iterator[tuple[str, Record]]:
    """``(topic, record)`` for every row of an Arrow batch being written, in row order."""
    n = batch.num_rows
    values = batch.column("value").to_pylist()
    keys = batch.column("key").to_pylist() if columns.key else [None] * n
    headers = batch.column("headers").to_pylist() if columns.headers else [None] * n
    topics = batch.column("topic").to_pylist() if columns.topic else [topic_option] * n
    for i in range(n):
        value = values[i]
        if value is None:
            raise ValueError("column value must not be null (a Tidings message has a payload)")
        topic = topics[i]
        if topic is None:
            raise ValueError("column topic is null and no topic option was given")
        key = keys[i]
        yield (
            topic,
            Record(
                payload=_bytes(value, "column value"),
                key=None if key is None else _bytes(key, "column key"),
                headers=_headers(headers[i], columns.headers_map),
            ),
        )
