"""The columnar poll response (``application/vnd.tidings.columns``): a page of messages
as a few fixed-width columns and one data region, for readers that decode pages in bulk.

An Avro poll response has to be walked message by message (every length is a varint),
which is most of what a Python consumer spends on a page (BENCHMARKS.md, "A columnar
poll response"). This body is laid out so that a page decodes with loops that run in C
(``struct.iter_unpack``, ``map`` over slices) and maps onto Arrow arrays without a copy:
payloads, keys, header names and values are Arrow ``binary``/``string`` layouts (int32
offsets into the body itself).

All integers are little-endian; ``n`` messages, ``E`` header entries in all::

    offset 0   b"TDC1"
           4   u32 n
           8   u32 flags: 1 = keys column present, 2 = headers column present
          12   u32 E (0 without headers)
          16   ids: n x 20 bytes (MessageId.to_bytes(), so they sort as bytes)
               payload offsets: (n + 1) x i32, absolute positions in the body
    if keys:   key offsets: (n + 1) x i32, absolute (a row without a key: length 0)
               key presence: n bytes (1: the row has a key, 0: it has none), then
               zero bytes up to a multiple of 4
    if headers: header rows: (n + 1) x i32, row i's entries are [rows[i], rows[i+1])
               name offsets: (E + 1) x i32, absolute; value offsets: (E + 1) x i32
               data: payloads, then keys, then header names (UTF-8), then values

Each offsets column starts where the previous region ended (the first at the end of
the fixed part) and the last region ends at the end of the body. Write pointers are
not carried, as in the Avro response. The server answers this medium only to a poll
whose ``Accept`` header names it (docs/api.md); requests are never in it.
"""

from __future__ import annotations

import bisect
import struct
import sys
from array import array
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from itertools import accumulate, compress, pairwise, repeat
from operator import lt, ne

from tidings.codec.values import u32_lanes
from tidings.structs import MESSAGE_ID_LAYOUT, NO_HEADERS, Message, MessageId

__all__ = [
    "CONTENT_TYPE",
    "IDS_AT",
    "ColumnBlocks",
    "ColumnPage",
    "column_blocks",
    "page_head",
    "read_columns",
    "write_blocks",
    "write_columns",
    "write_messages",
]

CONTENT_TYPE = "application/vnd.tidings.columns"
MAGIC = b"TDC1"
KEYS, HEADERS = 1, 2
_HEAD = struct.Struct("<4sIII")
_I32 = struct.Struct("<i")
#: Where the ids block starts: right after the fixed head.
IDS_AT = _HEAD.size
_ID = struct.Struct(MESSAGE_ID_LAYOUT)
_LITTLE = sys.byteorder == "little"
_new_id = partial(tuple.__new__, MessageId)
_FLIP = bytes([1, 0]) + bytes(254)  # presence byte -> 1 where a row has no key
_CONTINUATION = bytes(range(0x80, 0xC0))


def _offsets(lengths: Iterable[int], start: int) -> tuple[bytes, int]:
    """``start`` and the running sums of ``lengths`` after it, as little-endian int32s,
    and the last of them."""
    # Packed from a list in one call: array("i") from an iterator grows one item at a
    # time, and from a list it was still ~20 % slower than struct for a member's page.
    at = list(accumulate(lengths, initial=start))
    return struct.pack(f"<{len(at)}i", *at), at[-1]


def _key_column(
    keys: Sequence[bytes | None], start: int
) -> tuple[bytes | None, bytes, int, Sequence[bytes]]:
    """A key column's parts: each row's presence byte (None: every row has a key), the
    keys' positions from ``start`` and the last of them, and the keys to write."""
    if None in keys:
        present = bytes(key is not None for key in keys)
        key_at, end = _offsets((len(k) if k else 0 for k in keys), start)
        return present, key_at, end, [k for k in keys if k]
    # Every row keyed (a keyed topic's pages): no Python-level pass per row.
    key_at, end = _offsets(map(len, keys), start)  # type: ignore[arg-type]
    return None, key_at, end, keys  # type: ignore[return-value]


def page_head(count: int) -> bytes:
    """The fixed head of a body of ``count`` messages without keys or headers."""
    return _HEAD.pack(MAGIC, count, 0, 0)


def write_columns(
    ids: Sequence[bytes],
    payloads: Sequence[bytes | memoryview],
    keys: Sequence[bytes | None] | None = None,
    headers: Sequence[Mapping[str, bytes]] | None = None,
) -> bytes:
    """A columnar body of ``len(ids)`` messages: 20-byte ids, payloads, and (if given)
    each row's key (None: no key) and headers."""
    n = len(ids)
    if len(payloads) != n or (keys is not None and len(keys) != n):
        raise ValueError("columns of different lengths")
    if headers is not None and len(headers) != n:
        raise ValueError("columns of different lengths")
    flags = (KEYS if keys is not None else 0) | (HEADERS if headers is not None else 0)
    names: list[bytes] = []
    values: list[bytes] = []
    rows: bytes | None = None
    if headers is not None:
        rows, _ = _offsets(map(len, headers), 0)
        for entry in headers:
            for name, value in entry.items():
                names.append(name.encode())
                values.append(value)
    entries = len(names)
    fixed = IDS_AT + 20 * n + 4 * (n + 1)
    if keys is not None:
        fixed += 4 * (n + 1) + (n + 3) // 4 * 4
    if headers is not None:
        fixed += 4 * (n + 1) + 8 * (entries + 1)
    payload_at, end = _offsets(map(len, payloads), fixed)
    parts: list[bytes | memoryview] = [
        _HEAD.pack(MAGIC, n, flags, entries),
        b"".join(ids),
        payload_at,
    ]
    data: list[bytes | memoryview] = list(payloads)
    if keys is not None:
        present, key_at, key_end, key_data = _key_column(keys, end)
        data += key_data
        parts += (key_at, b"\x01" * n if present is None else present, bytes(-n % 4))
        end = key_end
    if rows is not None:
        name_at, names_end = _offsets(map(len, names), end)
        value_at, _ = _offsets(map(len, values), names_end)
        parts += (rows, name_at, value_at)
        data += names
        data += values
    return b"".join(parts + data)


def write_messages(messages: Sequence[Message]) -> bytes:
    """:func:`write_columns` of messages (key and headers columns only if some need them)."""
    keys = [m.key for m in messages] if any(m.key is not None for m in messages) else None
    headers = [m.headers for m in messages] if any(m.headers for m in messages) else None
    return write_columns(
        [m.id.to_bytes() for m in messages], [m.payload for m in messages], keys, headers
    )


@dataclass(frozen=True, slots=True)
class ColumnBlocks:
    """Rows laid out as a columnar body lays them out, without its head: ids back to
    back, payloads back to back with their positions, keys the same.

    Rows ``a`` to ``b`` of a few blocks make a body with a few slices and joins and one
    addition of big integers per offsets column (:func:`write_blocks`), with no step
    per row. A group's page is laid out so once for each member's partitions, while
    the page is still in the processor's caches, and each member's answer is cut from
    it (BENCHMARKS.md, "Group pages laid out once per member").
    """

    count: int
    ids: bytes
    payloads: bytes
    #: The ``count + 1`` positions of the payloads in ``payloads`` (from 0), int32
    #: little-endian, as an offsets column holds them.
    payload_at: bytes
    #: The keys back to back (None: the rows have no key column).
    keys: bytes | None = None
    key_at: bytes = b""
    #: One byte per row (1: it has a key) where some row has none; None: all have.
    present: bytes | None = None

    def data(self, a: int, b: int) -> int:
        """The payload and key bytes of rows ``a`` to ``b`` (exclusive)."""
        total = _at(self.payload_at, b) - _at(self.payload_at, a)
        if self.keys is not None:
            total += _at(self.key_at, b) - _at(self.key_at, a)
        return total

    def cut(self, a: int, b: int, budget: int) -> int:
        """Where rows from ``a`` end within a byte ``budget``: after the row that brings
        their payloads and keys to it or past (so after row ``a`` at least), or at
        ``b``."""
        if b <= a or self.data(a, b) < budget:
            return b
        ends = range(a + 1, b + 1)
        return ends[bisect.bisect_left(ends, budget, key=partial(self.data, a))]

    @property
    def size(self) -> int:
        """Bytes held."""
        return sum(map(len, (self.ids, self.payloads, self.payload_at, self.key_at))) + len(
            self.keys or b""
        )


def _at(positions: bytes, index: int) -> int:
    at = 4 * index
    return int.from_bytes(positions[at : at + 4], "little")


def column_blocks(
    ids: Sequence[bytes],
    payloads: Sequence[bytes | memoryview],
    keys: Sequence[bytes | None] | None = None,
) -> ColumnBlocks:
    """The blocks of ``len(ids)`` rows: 20-byte ids, payloads, and (if given) each
    row's key (None: no key)."""
    n = len(ids)
    if len(payloads) != n or (keys is not None and len(keys) != n):
        raise ValueError("columns of different lengths")
    payload_at, _ = _offsets(map(len, payloads), 0)
    if keys is None:
        return ColumnBlocks(n, b"".join(ids), b"".join(payloads), payload_at)
    present, key_at, _, key_data = _key_column(keys, 0)
    return ColumnBlocks(
        n, b"".join(ids), b"".join(payloads), payload_at, b"".join(key_data), key_at, present
    )


def _moved(positions: bytes, a: int, b: int, to: int) -> tuple[bytes, int, int]:
    """Positions ``a`` to ``b`` (exclusive) of ``positions`` moved so that position
    ``a`` becomes ``to``, in one addition (every moved position stays in 0..2**31, so
    no lane carries into the next); and positions ``a`` and ``b`` as they were."""
    first, last = _at(positions, a), _at(positions, b)
    n = b - a
    raw = positions[4 * a : 4 * b]
    moved = (int.from_bytes(raw, "little") + (to - first) * u32_lanes(n)).to_bytes(4 * n, "little")
    return moved, first, last


def write_blocks(parts: Sequence[tuple[ColumnBlocks, int, int]]) -> bytes:
    """A columnar body of rows ``a`` to ``b`` (exclusive) of each ``(blocks, a, b)``
    of ``parts`` in turn: what :func:`write_columns` writes for those rows (a key
    column if any of the blocks has one; no headers)."""
    parts = [(blocks, a, b) for blocks, a, b in parts if b > a]
    n = sum(b - a for _, a, b in parts)
    keyed = any(blocks.keys is not None for blocks, _, _ in parts)
    at = IDS_AT + 20 * n + 4 * (n + 1)
    if keyed:
        at += 4 * (n + 1) + (n + 3) // 4 * 4
    out: list[bytes] = [_HEAD.pack(MAGIC, n, KEYS if keyed else 0, 0)]
    out += [blocks.ids[20 * a : 20 * b] for blocks, a, b in parts]
    data: list[bytes] = []
    for blocks, a, b in parts:
        moved, first, last = _moved(blocks.payload_at, a, b, at)
        out.append(moved)
        data.append(blocks.payloads[first:last])
        at += last - first
    out.append(_I32.pack(at))
    if keyed:
        present: list[bytes] = []
        for blocks, a, b in parts:
            if blocks.keys is None:
                out.append(_I32.pack(at) * (b - a))
                present.append(bytes(b - a))
                continue
            moved, first, last = _moved(blocks.key_at, a, b, at)
            out.append(moved)
            data.append(blocks.keys[first:last])
            at += last - first
            present.append(b"\x01" * (b - a) if blocks.present is None else blocks.present[a:b])
        out.append(_I32.pack(at))
        out += present
        out.append(bytes(-n % 4))
    return b"".join(out + data)


@dataclass(frozen=True, slots=True)
class ColumnPage:
    """A columnar body checked and located: where each column lies in ``body``.

    The ``*_at`` fields are byte positions in ``body`` of each offsets column (None
    where the column is absent), so that a reader can hand those regions to Arrow as
    they are. Use :meth:`messages` for :class:`Message` objects.
    """

    body: bytes
    count: int
    entries: int
    payload_at: int
    key_at: int | None
    present_at: int | None
    rows_at: int | None
    name_at: int | None
    value_at: int | None
    #: The payload and key offsets as :func:`read_columns` checked them (None: read
    #: from the body when asked): made into ints once, for the check and the slices.
    payload_offsets: list[int] | None = field(default=None, repr=False, compare=False)
    key_offsets: list[int] | None = field(default=None, repr=False, compare=False)

    def __len__(self) -> int:
        return self.count

    def id_bytes(self, index: int) -> bytes:
        """The 20-byte id of row ``index``."""
        at = IDS_AT + 20 * index
        return self.body[at : at + 20]

    def offsets(self, at: int, count: int) -> Sequence[int]:
        """``count`` int32 values starting at byte ``at`` of the body."""
        return _int32s(self.body, at, count)

    def messages(self) -> list[Message]:
        """The page's messages, oldest first."""
        return list(self.iter_messages()) if self.count else []

    def iter_messages(self) -> Iterator[Message]:
        """The page's messages, oldest first, each made when it is asked for.

        A consumer that lets each message go before taking the next then holds one
        at a time: the collector's young generation stays small, where a list of the
        page's messages (two tuples each) set off a collection walking all of them
        (BENCHMARKS.md, "Messages made as they are read").
        """
        n, body = self.count, self.body
        if not n:
            return iter(())
        # map() over two iterables calls tuple.__new__ itself: through a partial each
        # object cost ~15 ns more (455 against 392 ns per 100 B message, whole page).
        new = tuple.__new__
        ids = map(
            new, repeat(MessageId), _ID.iter_unpack(memoryview(body)[IDS_AT : IDS_AT + 20 * n])
        )
        at: Sequence[int] | None = self.payload_offsets
        if at is None:
            at = self.offsets(self.payload_at, n + 1)
        payloads = map(body.__getitem__, map(slice, at, at[1:]))
        keys: Iterable[bytes | None] = repeat(None)
        if self.key_at is not None and self.present_at is not None:
            at = self.key_offsets
            if at is None:
                at = self.offsets(self.key_at, n + 1)
            present = body[self.present_at : self.present_at + n]
            if 0 in present:
                keys = [
                    body[a:b] if has else None
                    for a, b, has in zip(at, at[1:], present, strict=False)
                ]
            else:  # every row keyed (a keyed topic's pages): no Python step per row
                keys = map(body.__getitem__, map(slice, at, at[1:]))
        headers: Sequence[Mapping[str, bytes]] | repeat[Mapping[str, bytes]] = repeat(NO_HEADERS)
        if self.rows_at is not None:
            headers = self._headers()
        rows = zip(ids, payloads, keys, headers, repeat(None), repeat(0))
        return map(new, repeat(Message), rows)

    def message_id(self, index: int) -> MessageId:
        """The id of row ``index`` (negative: from the end)."""
        if not -self.count <= index < self.count:
            raise IndexError("row out of range")
        return _new_id(_ID.unpack(self.id_bytes(index % self.count)))

    def _headers(self) -> list[Mapping[str, bytes]]:
        assert self.rows_at is not None and self.name_at is not None
        assert self.value_at is not None
        n, e, body = self.count, self.entries, self.body
        rows = self.offsets(self.rows_at, n + 1)
        name_at = self.offsets(self.name_at, e + 1)
        value_at = self.offsets(self.value_at, e + 1)
        names = [body[a:b].decode() for a, b in pairwise(name_at)]
        values = [body[a:b] for a, b in pairwise(value_at)]
        out: list[Mapping[str, bytes]] = []
        for a, b in pairwise(rows):
            out.append(dict(zip(names[a:b], values[a:b], strict=True)) if b > a else NO_HEADERS)
        return out


def _monotone(at: list[int], first: int, last: int) -> bool:
    # Sorting a sorted list is one pass of C comparisons: 2.5x faster than comparing
    # each neighbour pair through map() (167 against 410 us for 10,001 offsets).
    return at[0] == first and at[-1] <= last and at == sorted(at)


def _int32s(body: bytes, at: int, count: int) -> memoryview | array[int]:
    view = memoryview(body)[at : at + 4 * count]
    if _LITTLE:
        return view.cast("i")
    values = array("i", view)  # pragma: no cover
    values.byteswap()  # pragma: no cover
    return values  # pragma: no cover


def _ints(body: bytes, at: int, count: int) -> list[int]:
    """:func:`_int32s` as a list (made once, for a check and for slicing)."""
    values: list[int] = _int32s(body, at, count).tolist()
    return values


def read_columns(body: bytes) -> ColumnPage:
    """Check a columnar body and locate its columns; ValueError if it is malformed
    (wrong magic, columns that do not fit, offsets out of order or out of the body,
    a key on a row marked keyless, header names that are not UTF-8)."""
    size = len(body)
    if size < IDS_AT:
        raise ValueError("columnar body too short")
    magic, n, flags, entries = _HEAD.unpack_from(body)
    if magic != MAGIC or flags & ~(KEYS | HEADERS) or (entries and not flags & HEADERS):
        raise ValueError("not a columnar poll response")
    pos = IDS_AT + 20 * n
    payload_at, pos = pos, pos + 4 * (n + 1)
    key_at = present_at = rows_at = name_at = value_at = None
    if flags & KEYS:
        key_at, pos = pos, pos + 4 * (n + 1)
        present_at, pos = pos, pos + (n + 3) // 4 * 4
    if flags & HEADERS:
        rows_at, pos = pos, pos + 4 * (n + 1)
        name_at, pos = pos, pos + 4 * (entries + 1)
        value_at, pos = pos, pos + 4 * (entries + 1)
    if pos > size:
        raise ValueError("columnar body too short for its columns")
    payload_offsets = at = _ints(body, payload_at, n + 1)
    if not _monotone(at, pos, size):
        raise ValueError("bad payload offsets")
    end = at[-1]
    key_offsets: list[int] | None = None
    if key_at is not None and present_at is not None:
        key_offsets = at = _ints(body, key_at, n + 1)
        present = body[present_at : present_at + n]
        if not _monotone(at, end, size) or present.translate(None, b"\x00\x01"):
            raise ValueError("bad key column")
        # A row marked keyless has a key of length 0 (its two offsets equal).
        if 0 in present:
            absent = present.translate(_FLIP)
            if any(map(ne, compress(at, absent), compress(at[1:], absent))):
                raise ValueError("a key on a row without one")
        end = at[-1]
    if rows_at is not None and name_at is not None and value_at is not None:
        rows = _ints(body, rows_at, n + 1)
        if not _monotone(rows, 0, entries) or rows[-1] != entries:
            raise ValueError("bad header rows")
        at = _ints(body, name_at, entries + 1)
        if not _monotone(at, end, size):
            raise ValueError("bad header names")
        # The names region is UTF-8 as a whole, and no name starts inside a character
        # (on a continuation byte): then each name is UTF-8 on its own.
        try:
            body[at[0] : at[-1]].decode()
        except UnicodeDecodeError:
            raise ValueError("a header name is not UTF-8") from None
        firsts = bytes(map(body.__getitem__, compress(at[:-1], map(lt, at[:-1], at[1:]))))
        if firsts.translate(None, _CONTINUATION) != firsts:
            raise ValueError("a header name is not UTF-8")
        at = _ints(body, value_at, entries + 1)
        if not _monotone(at, at[0], size) or at[0] != _int32s(body, name_at, entries + 1)[-1]:
            raise ValueError("bad header values")
        end = at[-1]
    if end != size:
        raise ValueError("trailing bytes")
    # The offsets already made into ints go with the page, for its slices.
    return ColumnPage(
        body, n, entries, payload_at, key_at, present_at, rows_at, name_at, value_at,
        payload_offsets, key_offsets,
    )  # fmt: skip
