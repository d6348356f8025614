"""Arrow record batches straight to and from the bodies of ``store`` and ``poll``.

Spark hands a Python data source Arrow batches and takes Arrow batches back. Going
through :class:`~tidings.structs.Record` and :class:`~tidings.structs.Message` objects
costs a Python object (and for headers a dict) per row on each side; these functions
make each section of a ``store`` body for a whole batch at once with Arrow's compute
kernels and numpy (varint lengths, keys, header maps), with no Python step per row, and
build the read columns from the response body, with the id-derived columns (hex id,
publish time) computed over the whole page with numpy. The layouts are those of
:mod:`tidings.codec.avro` (``avro/binary; schema=tidings``): ``PublishRequestExt`` and
``MessagesExt``; and for poll answers the columnar medium (:mod:`tidings.codec.columns`),
whose columns are Arrow layouts already, so its batches are views of the body with no
per-row work.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeAlias

import numpy as np

from tidings.codec.avro import read_long, varint
from tidings.codec.columns import IDS_AT, ColumnPage, read_columns, write_columns
from tidings.spark.schema import WriteColumns
from tidings.structs import MessageId

if TYPE_CHECKING:
    import pyarrow as pa  # type: ignore[import-untyped,unused-ignore]

__all__ = [
    "ColumnIds",
    "ColumnarPoll",
    "PollColumns",
    "PollRows",
    "StoreBody",
    "poll_batch",
    "read_column_body",
    "read_poll_body",
    "store_bodies",
]

#: Per-row bytes counted against ``storeBatchBytes`` besides the payload (the old
#: per-record estimate, kept so the option means what it meant).
_ROW_OVERHEAD = 64

# Two hex digits per byte value, as a (256, 2) table of ASCII codes.
_HEX = np.frombuffer(b"".join(b"%02x" % i for i in range(256)), dtype=np.uint8).reshape(256, 2)


# --- writing: Arrow -> PublishRequestExt ---


@dataclass(frozen=True, slots=True)
class StoreBody:
    """One ``store`` request body for ``topic``: ``rows`` rows of one batch."""

    topic: str
    rows: int
    body: bytes


def _binary(array: pa.Array) -> pa.Array:
    """A binary or string array as ``binary`` (string data is UTF-8 bytes already)."""
    import pyarrow as pa

    if array.type == pa.binary():
        return array
    if pa.types.is_string(array.type):
        return array.view(pa.binary())
    return array.cast(pa.binary())


def _varints(values: np.ndarray[Any, Any], *, skip_zero: bool = False) -> pa.Array:
    """Avro's zig-zag varint of each of ``values`` (non-negative, below 2**31) as a
    binary array; with ``skip_zero``, a zero is no bytes at all (a map's empty block)."""
    import pyarrow as pa

    n = len(values)
    zigzag = values.astype(np.uint64) << np.uint64(1)
    widths = np.ones(n, dtype=np.int32)
    for k in (7, 14, 21, 28):
        more = zigzag >= np.uint64(1 << k)
        if not more.any():
            break
        widths += more
    if skip_zero:
        widths[values == 0] = 0
    width = int(widths.max()) if n else 0
    places = np.arange(width, dtype=np.int32)
    digits = (
        (zigzag[:, None] >> (places.astype(np.uint64) * np.uint64(7))) & np.uint64(0x7F)
    ).astype(np.uint8)
    digits[places[None, :] < widths[:, None] - 1] |= 0x80
    data = digits[places[None, :] < widths[:, None]]
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(widths, out=offsets[1:])
    return pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def _lengths(array: pa.Array) -> np.ndarray[Any, Any]:
    """Each value's length in bytes (0 for a null) of a binary array."""
    import pyarrow.compute as pc

    lengths: np.ndarray[Any, Any] = (
        pc.fill_null(pc.binary_length(array), 0).to_numpy(zero_copy_only=False).astype(np.int64)
    )
    return lengths


def _prefixed(array: pa.Array) -> pa.Array:
    """Each value after its varint length (an Avro ``bytes``/``string``); null stays null."""
    import pyarrow.compute as pc

    return pc.binary_join_element_wise(_varints(_lengths(array)), array, b"")


def _key_parts(keys: pa.Array) -> pa.Array:
    """Each row's key as the ``["null", "bytes"]`` union: 0, or 2 and the bytes."""
    import pyarrow.compute as pc

    return pc.fill_null(pc.binary_join_element_wise(b"\x02", _prefixed(keys), b""), b"\x00")


def _header_parts(array: pa.Array, as_map: bool) -> pa.Array | None:
    """Each row's headers as the blocks of an Avro map before its end (no bytes for a
    row without any), or None when no row has a header. Null lists and null entries
    count as no header; a null value is an empty one; a null name is refused."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if array.null_count == len(array):
        return None
    if as_map:
        names, items = array.keys, array.items
        entry_valid = None
    else:
        entries = array.values
        names, items = entries.field("key"), entries.field("value")
        entry_valid = entries.is_valid() if entries.null_count else None
    offsets = array.offsets.to_numpy().astype(np.int64)
    first, stop = int(offsets[0]), int(offsets[-1])
    if stop == first:
        return None
    names, items = (
        _binary(names.slice(first, stop - first)),
        _binary(items.slice(first, stop - first)),
    )
    kept = np.ones(stop - first, dtype=bool)
    if entry_valid is not None:
        kept &= entry_valid.slice(first, stop - first).to_numpy(zero_copy_only=False)
    if array.null_count:
        row_valid = array.is_valid().to_numpy(zero_copy_only=False)
        kept &= np.repeat(row_valid, np.diff(offsets))
    if names.null_count and kept[names.is_null().to_numpy(zero_copy_only=False)].any():
        raise ValueError("a header key must not be null")
    encoded = pc.binary_join_element_wise(
        _prefixed(names), _prefixed(pc.fill_null(items, b"")), b""
    )
    counted = np.zeros(len(kept) + 1, dtype=np.int64)
    np.cumsum(kept, out=counted[1:])
    if not kept.all():
        encoded = encoded.filter(pa.array(kept))
    bounds = counted[offsets - first]
    joined = pc.binary_join(
        pa.ListArray.from_arrays(pa.array(bounds.astype(np.int32)), encoded), b""
    )
    return pc.binary_join_element_wise(_varints(np.diff(bounds), skip_zero=True), joined, b"")


def _rows_by_topic(
    batch: pa.RecordBatch, columns: WriteColumns, topic_option: str | None
) -> Iterator[tuple[str, pa.RecordBatch]]:
    """``batch`` split by target topic, each part in row order."""
    import pyarrow.compute as pc  # type: ignore[import-untyped,unused-ignore]

    if not columns.topic:
        if topic_option is None:
            raise ValueError("column topic is null and no topic option was given")
        yield topic_option, batch
        return
    topics = batch.column("topic")
    names = topics.unique().to_pylist()
    if len(names) == 1:
        yield names[0], batch
        return
    for name in names:
        yield name, batch.filter(pc.equal(topics, name))


def _first_invalid(batch: pa.RecordBatch, columns: WriteColumns) -> tuple[int, str] | None:
    """The first row that cannot be written and why, or None."""
    checks = [("value", "column value must not be null (a Tidings message has a payload)")]
    if columns.topic:
        checks.append(("topic", "column topic is null and no topic option was given"))
    first: tuple[int, str] | None = None
    for name, why in checks:
        array = batch.column(name)
        if array.null_count:
            row = int(np.argmax(array.is_null().to_numpy(zero_copy_only=False)))
            if first is None or row < first[0]:
                first = (row, why)
    return first


def store_bodies(
    batch: pa.RecordBatch,
    columns: WriteColumns,
    topic_option: str | None,
    write_pointer: int,
    *,
    max_records: int,
    max_bytes: int,
) -> Iterator[StoreBody]:
    """The ``store`` bodies (``PublishRequestExt``) for the rows of one Arrow batch:
    per topic in row order, cut at ``max_records`` rows or ``max_bytes`` bytes. A row
    that cannot be written (a null value or topic) raises ValueError after the bodies
    of the rows before it, as storing row by row would."""
    invalid = _first_invalid(batch, columns)
    if invalid is not None:
        row, why = invalid
        yield from _valid_bodies(
            batch.slice(0, row), columns, topic_option, write_pointer, max_records, max_bytes
        )
        raise ValueError(why)
    yield from _valid_bodies(batch, columns, topic_option, write_pointer, max_records, max_bytes)


def _valid_bodies(
    batch: pa.RecordBatch,
    columns: WriteColumns,
    topic_option: str | None,
    write_pointer: int,
    max_records: int,
    max_bytes: int,
) -> Iterator[StoreBody]:
    import pyarrow.compute as pc

    pointer = b"\x00" + varint(write_pointer)
    for topic, part in _rows_by_topic(batch, columns, topic_option):
        n = part.num_rows
        if n == 0:
            continue
        # Each section of a body is one slice of a column made for the whole part:
        # payloads after their lengths, and each row's extras (key, headers, TTL).
        values = _binary(part.column("value"))
        lengths = _lengths(values)
        payloads = _Section(pc.binary_join_element_wise(_varints(lengths), values, b""))
        keys = _binary(part.column("key")) if columns.key else None
        if keys is not None and keys.null_count == n:
            keys = None
        headers = (
            _header_parts(part.column("headers"), columns.headers_map) if columns.headers else None
        )
        extras = None
        if keys is not None or headers is not None:
            extras = _Section(
                pc.binary_join_element_wise(
                    b"\x00" if keys is None else _key_parts(keys),
                    b"" if headers is None else headers,
                    b"\x00\x00",  # the headers map's end; ttl: null
                    b"",
                )
            )
        # Cut at max_records rows, or where the rows so far reach max_bytes.
        sizes = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(lengths + _ROW_OVERHEAD, out=sizes[1:])
        first = 0
        while first < n:
            fits = int(np.searchsorted(sizes, sizes[first] + max_bytes, side="left")) - first
            last = first + max(1, min(max_records, fits, n - first))
            count = varint(last - first)
            parts: list[Any] = [pointer, count, payloads.rows(first, last), b"\x00"]
            if extras is None:
                parts.append(b"\x00")  # extras: null
            else:
                parts += (b"\x02", count, extras.rows(first, last), b"\x00")
            yield StoreBody(topic, last - first, b"".join(parts))
            first = last


class _Section:
    """A binary array's data, sliced by rows without a copy."""

    __slots__ = ("_data", "_offsets")

    def __init__(self, array: pa.Array) -> None:
        buffers = array.buffers()
        self._offsets = np.frombuffer(
            buffers[1], dtype=np.int32, count=len(array) + 1, offset=4 * array.offset
        )
        self._data = memoryview(buffers[2] if buffers[2] is not None else b"")

    def rows(self, first: int, last: int) -> memoryview:
        """The bytes of rows ``first`` to ``last`` (exclusive), one after the other."""
        return self._data[int(self._offsets[first]) : int(self._offsets[last])]


# --- reading: MessagesExt -> Arrow ---


@dataclass(slots=True)
class PollColumns:
    """A poll response read into columns: ids (20 bytes each), payloads, keys, and
    headers as per-row offsets into flat name and value lists."""

    ids: list[bytes]
    payloads: list[bytes]
    keys: list[bytes | None]
    header_offsets: list[int]
    header_names: list[str]
    header_values: list[bytes]

    def __len__(self) -> int:
        return len(self.ids)

    def cut(self, end: MessageId, before_ts: int | None) -> int:
        """How many leading rows have an id at most ``end`` and (if given) a publish
        time before ``before_ts``."""
        return _cut(self.ids, end, before_ts)


def _cut(ids: list[bytes] | ColumnIds, end: MessageId, before_ts: int | None) -> int:
    # Ids sort as their bytes do (the publish time comes first, big-endian), so a
    # bisection finds the cut.
    n = bisect.bisect_right(ids, end.to_bytes())
    if before_ts is not None:
        n = min(n, bisect.bisect_left(ids, before_ts.to_bytes(8, "big")))
    return n


def read_poll_body(body: bytes) -> PollColumns:
    """The columns of a ``MessagesExt`` poll response; ValueError, IndexError on a
    malformed body."""
    ids: list[bytes] = []
    payloads: list[bytes] = []
    # Most pages have no keys or headers: these two columns are only kept row by row
    # from the first row that has one (the rows before it filled in then).
    keys: list[bytes | None] | None = None
    offsets: list[int] = []
    names: list[str] = []
    values: list[bytes] = []
    add_id, add_payload = ids.append, payloads.append
    read = read_long
    end = len(body)
    pos = 0
    headers = 0
    while True:
        count, pos = read(body, pos)
        if count == 0:
            break
        if count < 0:  # a block with its size in bytes, which is not needed
            count = -count
            _, pos = read(body, pos)
        for _ in range(count):
            if body[pos] != 0x28:  # the id's length, always 20
                raise ValueError("message id is not 20 bytes")
            at = pos + 21
            add_id(body[pos + 1 : at])
            # The payload's length: one or two varint bytes for payloads under 8 KiB.
            low = body[at]
            if low < 0x80:
                size, pos = (low >> 1) ^ -(low & 1), at + 1
            elif body[at + 1] < 0x80:
                zigzag = (low & 0x7F) | (body[at + 1] << 7)
                size, pos = (zigzag >> 1) ^ -(zigzag & 1), at + 2
            else:
                size, pos = read(body, at)
            if size < 0 or pos + size > end:
                raise ValueError("bad payload length")
            add_payload(body[pos : pos + size])
            pos += size
            if body[pos] == 0 and body[pos + 1] == 0:  # no key, no headers: the usual case
                pos += 2
                if keys is not None:
                    keys.append(None)
                    offsets.append(headers)
                continue
            if keys is None:
                keys, offsets = [None] * (len(ids) - 1), [0] * len(ids)
            branch = body[pos]
            pos += 1
            key = None
            if branch == 2:
                size, pos = read(body, pos)
                if size < 0 or pos + size > end:
                    raise ValueError("bad key length")
                key = body[pos : pos + size]
                pos += size
            elif branch != 0:
                raise ValueError("bad key union branch")
            pairs, pos = read(body, pos)
            while pairs:
                if pairs < 0:
                    pairs = -pairs
                    _, pos = read(body, pos)
                for _ in range(pairs):
                    size, pos = read(body, pos)
                    if size < 0 or pos + size > end:
                        raise ValueError("bad header name length")
                    names.append(body[pos : pos + size].decode())
                    pos += size
                    size, pos = read(body, pos)
                    if size < 0 or pos + size > end:
                        raise ValueError("bad header value length")
                    values.append(body[pos : pos + size])
                    pos += size
                    headers += 1
                pairs, pos = read(body, pos)
            keys.append(key)
            offsets.append(headers)
    if pos != end:
        raise ValueError("trailing bytes")
    if keys is None:
        keys, offsets = [None] * len(ids), [0] * (len(ids) + 1)
    return PollColumns(ids, payloads, keys, offsets, names, values)


# --- reading: the columnar poll response -> Arrow ---


class ColumnIds:
    """The 20-byte ids of a columnar page, each sliced out only when asked for: enough
    of a sequence for :mod:`bisect` and ``ids[-1]``, without a list per page."""

    __slots__ = ("_page",)

    def __init__(self, page: ColumnPage) -> None:
        self._page = page

    def __len__(self) -> int:
        return self._page.count

    def __getitem__(self, index: int) -> bytes:
        count = self._page.count
        if index < 0:
            index += count
        if not 0 <= index < count:
            raise IndexError("id index out of range")
        return self._page.id_bytes(index)


@dataclass(frozen=True, slots=True)
class ColumnarPoll:
    """A columnar poll response, checked and located (:mod:`tidings.codec.columns`)."""

    page: ColumnPage
    ids: ColumnIds

    def __len__(self) -> int:
        return self.page.count

    def cut(self, end: MessageId, before_ts: int | None) -> int:
        """How many leading rows have an id at most ``end`` and (if given) a publish
        time before ``before_ts``."""
        return _cut(self.ids, end, before_ts)


#: A poll response of no messages may come as an empty body, whatever its medium.
_NO_COLUMNS = write_columns([], [])


def read_column_body(body: bytes) -> ColumnarPoll:
    """A columnar poll response (an empty body: no rows); ValueError on a malformed
    body. The checks leave every offset inside the body and in order, which is what
    makes the Arrow arrays :func:`poll_batch` lays over it safe to read."""
    page = read_columns(body or _NO_COLUMNS)
    return ColumnarPoll(page, ColumnIds(page))


#: Either kind of read poll response; :func:`poll_batch` takes both.
PollRows: TypeAlias = PollColumns | ColumnarPoll


def _column_arrays(
    page: ColumnPage, rows: int, headers_type: pa.DataType
) -> tuple[pa.Array, pa.Array, pa.Array]:
    """Key, payload and headers arrays of the first ``rows`` rows: views of the body
    (only the keys' validity bitmap is new), as its offsets are absolute positions in
    it and int32 little-endian like Arrow's own."""
    import pyarrow as pa

    data = pa.py_buffer(page.body)

    def offsets(at: int, count: int) -> pa.Buffer:
        return data.slice(at, 4 * (count + 1))

    payloads = pa.Array.from_buffers(
        pa.binary(), rows, [None, offsets(page.payload_at, rows), data]
    )
    if page.key_at is None or page.present_at is None:
        keys = pa.nulls(rows, pa.binary())
    else:
        present = np.frombuffer(page.body, dtype=np.uint8, count=rows, offset=page.present_at)
        missing = rows - int(np.count_nonzero(present))
        validity = pa.py_buffer(np.packbits(present, bitorder="little")) if missing else None
        keys = pa.Array.from_buffers(
            pa.binary(), rows, [validity, offsets(page.key_at, rows), data], null_count=missing
        )
    entry_type = headers_type.value_type
    if page.rows_at is None or page.name_at is None or page.value_at is None:
        entries = pa.array([], type=entry_type)
        starts = pa.py_buffer(np.zeros(rows + 1, dtype=np.int32))
    else:
        e = page.entries
        names = pa.Array.from_buffers(pa.string(), e, [None, offsets(page.name_at, e), data])
        values = pa.Array.from_buffers(pa.binary(), e, [None, offsets(page.value_at, e), data])
        entries = pa.Array.from_buffers(entry_type, e, [None], children=[names, values])
        starts = offsets(page.rows_at, rows)
    headers = pa.Array.from_buffers(headers_type, rows, [None, starts], children=[entries])
    return keys, payloads, headers


def _avro_arrays(
    page: PollColumns, rows: int, headers_type: pa.DataType
) -> tuple[pa.Array, pa.Array, pa.Array]:
    """Key, payload and headers arrays of the first ``rows`` rows of a read Avro body."""
    import pyarrow as pa

    heads = page.header_offsets[: rows + 1]
    used = heads[-1]
    entries = pa.StructArray.from_arrays(
        [
            pa.array(page.header_names[:used], type=pa.string()),
            pa.array(page.header_values[:used], type=pa.binary()),
        ],
        names=["key", "value"],
    )
    headers = pa.ListArray.from_arrays(pa.array(heads, type=pa.int32()), entries).cast(headers_type)
    keys = pa.array(page.keys[:rows], type=pa.binary())
    return keys, pa.array(page.payloads[:rows], type=pa.binary()), headers


def poll_batch(
    page: PollRows, rows: int, topic: str, namespace: str, schema: pa.Schema
) -> pa.RecordBatch:
    """The read rows (``schema``: :func:`tidings.spark.schema.arrow_read_schema`) of the
    first ``rows`` messages of ``page``."""
    import pyarrow as pa

    # Arrays over a columnar body read whatever ``rows`` says: past the page they
    # would read past the checked offsets.
    if not 0 <= rows <= len(page):
        raise ValueError(f"{rows} rows asked of a page of {len(page)}")
    headers_type = schema.field("headers").type
    if isinstance(page, ColumnarPoll):
        body = page.page.body
        raw = np.frombuffer(body, dtype=np.uint8, count=20 * rows, offset=IDS_AT).reshape(rows, 20)
        keys, payloads, headers = _column_arrays(page.page, rows, headers_type)
    else:
        raw = np.frombuffer(b"".join(page.ids[:rows]), dtype=np.uint8).reshape(rows, 20)
        keys, payloads, headers = _avro_arrays(page, rows, headers_type)
    # messageId: 40 hex characters per id, as one string buffer with fixed offsets.
    # np.take, not _HEX[raw]: the same gather, ~9x faster for a page (0.4 against
    # 3.7 ms for 10,000 ids, measured), as fancy indexing takes a general path.
    hex_ids = np.take(_HEX, raw, axis=0).reshape(-1)
    id_offsets = np.arange(0, 40 * rows + 1, 40, dtype=np.int32)
    message_ids = pa.Array.from_buffers(
        pa.string(), rows, [None, pa.py_buffer(id_offsets), pa.py_buffer(hex_ids)]
    )
    # publishTime: the id's first 8 bytes, big-endian milliseconds.
    millis = raw[:, :8].copy().view(">u8").reshape(rows).astype(np.int64)
    publish = pa.array(millis * 1000, type=pa.int64()).cast(schema.field("publishTime").type)
    columns: list[Any] = [
        keys,
        payloads,
        pa.repeat(pa.scalar(topic, type=pa.string()), rows),
        pa.repeat(pa.scalar(namespace, type=pa.string()), rows),
        message_ids,
        publish,
        headers,
    ]
    return pa.RecordBatch.from_arrays(columns, schema=schema)
