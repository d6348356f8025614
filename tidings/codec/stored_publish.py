"""An Avro publish or store body read straight into the values the topic stores.

The general path decodes a ``PublishRequestExt`` with fastavro into a dict per message's
extras, builds a :class:`~tidings.structs.Record` from each, and encodes each into its
stored value (:func:`tidings.codec.values.encode_value`): 8-13 us per message with a
header, most of a Spark sink's store on the server (BENCHMARKS.md, "Stores read straight
into stored values"). This reads the body once and writes each stored value as it goes.

It covers the bodies producers send: messages with or without extras, keys, headers,
no per-message TTL, each value in one block. Anything else -- a TTL, a map naming a
header twice, a block with its byte size, a malformed body -- answers None, and the
caller takes the general path, which stores the same values or raises the same error.
``tests/test_codec_stored_publish.py`` checks that both paths agree.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tidings.codec.avro import read_long
from tidings.codec.values import FLAG_HEADERS, FLAG_KEY, FLAG_T, payload_header, write_varint

__all__ = ["StoredBatch", "read_stored_batch"]

_INT64_MAX = (1 << 63) - 1
#: A key's length as its stored varint, for keys under 128 bytes.
_KEY_LENGTHS = [bytes((n,)) for n in range(0x80)]


@dataclass(frozen=True, slots=True)
class StoredBatch:
    """A publish body's messages as stored values.

    ``write_pointer`` is the body's; ``stored_pointer`` the one written into each value
    (a publish's, or None for a store: Payload Table rows carry theirs in the key)."""

    write_pointer: int | None
    stored_pointer: int | None
    values: list[bytes]
    size: int  # payload bytes, as the general path counts them

    def __len__(self) -> int:
        return len(self.values)

    def under(self, write_pointer: int) -> StoredBatch:
        """These values, read from a body without a write pointer, as published under
        ``write_pointer`` (a one-request transaction's, known only once it began)."""
        if self.stored_pointer is not None:
            raise ValueError(f"values already stored under {self.stored_pointer}")
        # The pointer follows the flags byte, as in payload_header(); a publish body read
        # here carries no expiry, which would sit between them.
        pointer = payload_header(write_pointer)[1:]
        heads: dict[int, bytes] = {}
        values: list[bytes] = []
        add = values.append
        for value in self.values:
            flags = value[0]
            head = heads.get(flags)
            if head is None:
                head = heads[flags] = bytes((flags | FLAG_T,)) + pointer
            add(head + value[1:])
        return StoredBatch(write_pointer, write_pointer, values, self.size)


def _field(body: bytes, pos: int, end: int) -> tuple[int, bytes, int]:
    """The Avro ``bytes``/``string`` at ``pos``: (its length, its bytes, next position);
    ValueError if it runs past ``end``."""
    size, pos = read_long(body, pos)
    stop = pos + size
    if size < 0 or stop > end:
        raise ValueError("field runs past the body")
    return size, body[pos:stop], stop


def _one_header_rows(
    body: bytes, pos: int, flags: int, after_flags: bytes, payloads: list[memoryview]
) -> list[bytes] | None:
    """The stored values of extras that repeat one row's layout: no key, the same one
    header name, values of one length under 64 bytes, no TTL -- a Spark sink's rows,
    each with its ``source-id`` header --, or None. One regular expression finds every
    row's value: ``count`` matches of ``stride`` bytes in ``count * stride`` bytes tile
    them exactly, so every row has the first one's bytes around its value."""
    count = len(payloads)
    if not count or body[pos] != 0 or body[pos + 1] != 2:
        return None
    size = body[pos + 2]
    if size >= 0x80 or size & 1:
        return None
    name_end = pos + 3 + (size >> 1)
    size = body[name_end]
    if size >= 0x80 or size & 1:
        return None
    width = size >> 1
    stride = name_end + 1 + width + 2 - pos
    stop = pos + count * stride
    if stop + 1 != len(body) or body[stop] != 0:
        return None
    lead = body[pos : name_end + 1]
    values = re.compile(re.escape(lead) + b"(.{%d})\x00\x00" % width, re.DOTALL).findall(
        body, pos, stop
    )
    if len(values) != count:
        return None
    head = _one_header_head(flags, after_flags, body[pos + 3 : name_end]) + _KEY_LENGTHS[width]
    return [head + v + p for v, p in zip(values, payloads, strict=True)]


def _one_header_head(flags: int, after_flags: bytes, name: bytes) -> bytes:
    """A stored value's bytes up to its one header's value length: the same for every
    row with no key and that one header name (under 128 bytes)."""
    name.decode()  # a header name is a string: UTF-8, as fastavro checks
    return (
        bytes((flags | FLAG_HEADERS,))
        + after_flags
        + _KEY_LENGTHS[1]
        + _KEY_LENGTHS[len(name)]
        + name
    )


def _small_extras(
    body: bytes, pos: int, flags: int, after_flags: bytes, names_seen: set[bytes]
) -> tuple[bytes, int] | None:
    # A message's extras when its key (if any) and every header name and value are
    # under 64 bytes, in one block, with no TTL -- what a Spark sink's rows carry (a
    # ``source-id`` header): each Avro length is one zig-zag byte (2n) and its stored
    # varint one byte (n), so the stored value's head is built without a call per
    # field. Returns (the stored value without its payload, the next position), or
    # None for the general loop.
    lengths = _KEY_LENGTHS
    parts: list[bytes] = [b"", after_flags]
    which = flags
    if body[pos] == 2:
        size = body[pos + 1]
        if size >= 0x80 or size & 1:
            return None
        stop = pos + 2 + (size >> 1)
        parts += (lengths[size >> 1], body[pos + 2 : stop])
        which |= FLAG_KEY
        pos = stop
    else:
        pos += 1  # the null branch (the caller saw 0 or 2)
    pairs = body[pos]
    if pairs >= 0x80 or pairs & 1:
        return None
    pairs >>= 1
    pos += 1
    if pairs:
        parts.append(lengths[pairs])
        names = []
        for _ in range(pairs):
            size = body[pos]
            if size >= 0x80 or size & 1:
                return None
            stop = pos + 1 + (size >> 1)
            name = body[pos + 1 : stop]
            if name not in names_seen:
                name.decode()  # a header name is a string: UTF-8, as fastavro checks
                names_seen.add(name)
            names.append(name)
            size = body[stop]
            if size >= 0x80 or size & 1:
                return None
            pos = stop + 1 + (size >> 1)
            parts += (lengths[len(name)], name, lengths[size >> 1], body[stop + 1 : pos])
        if body[pos] != 0 or (pairs > 1 and len(set(names)) != pairs):
            return None  # a second block, or a name twice (the last one wins there)
        pos += 1
        which |= FLAG_HEADERS
    if body[pos] != 0:  # a TTL
        return None
    if pos >= len(body):
        return None  # a field ran past the end (slices stop there silently)
    parts[0] = bytes((which,))
    return b"".join(parts), pos + 1


#: Per stored value head (flags and pointer), that head followed by each key length
#: under 64 bytes: a keyed row's value is one of these, its key and its payload.
_KEYED_HEADS: dict[bytes, list[bytes]] = {}


def _keyed_rows(
    body: bytes, pos: int, head: bytes, payloads: list[memoryview]
) -> tuple[list[bytes], int]:
    """The stored values of the extras rows from ``pos`` on that hold a key under 64
    bytes and nothing else, up to the first row that does not (or the last), and the
    position after them. BENCHMARKS.md, "Keyed rows in a loop of their own": a batch of
    500 such rows read in ~9 % less time than through the general loop's checks."""
    heads = _KEYED_HEADS.get(head)
    if heads is None:
        if len(_KEYED_HEADS) >= 64:  # heads with pointers come and go
            _KEYED_HEADS.clear()
        heads = _KEYED_HEADS[head] = [head + n for n in _KEY_LENGTHS[:64]]
    values: list[bytes] = []
    add = values.append
    for payload in payloads:
        size = body[pos + 1]
        end = pos + 2 + (size >> 1)
        # The key's branch; its length a one-byte varint that is not negative (so
        # the key is under 64 bytes); then an empty headers map and a null TTL.
        if body[pos] != 2 or size & 0x81 or body[end] or body[end + 1]:
            break
        add(heads[size >> 1] + body[pos + 2 : end] + payload)
        pos = end + 2
    return values, pos


def read_stored_batch(body: bytes, extended: bool, *, store: bool) -> StoredBatch | None:
    """The stored values of a ``PublishRequest`` (``extended``: ``PublishRequestExt``)
    body -- for the Payload Table if ``store`` --, or None when the general path must
    read it (see the module docstring)."""
    try:
        return _read(body, extended, store)
    except (IndexError, ValueError):
        return None  # malformed: the general path names what is wrong


def _read(body: bytes, extended: bool, store: bool) -> StoredBatch | None:
    read = read_long
    end = len(body)
    branch = body[0]
    if branch == 0:
        write_pointer: int | None
        write_pointer, pos = read(body, 1)
        if not -_INT64_MAX <= write_pointer <= _INT64_MAX:
            return None
    elif branch == 2:
        write_pointer, pos = None, 1
    else:
        return None
    # Views, not slices: each payload is copied once, into its stored value.
    view = memoryview(body)
    payloads: list[memoryview] = []
    count, pos = read(body, pos)
    if count < 0:
        return None
    if count:
        add = payloads.append
        for _ in range(count):
            # Lengths under 8 KiB inline (one or two varint bytes), the rest by read().
            first = body[pos]
            if first < 0x80:
                size, pos = first, pos + 1
            elif body[pos + 1] < 0x80:
                size, pos = (first & 0x7F) | (body[pos + 1] << 7), pos + 2
            else:
                size, pos = read(body, pos)
                size = size << 1 if size >= 0 else 1  # zig-zag again, as the two above
            if size & 1:  # negative
                return None
            stop = pos + (size >> 1)
            if stop > end:
                return None
            add(view[pos:stop])
            pos = stop
        if body[pos] != 0:  # a second block
            return None
        pos += 1
    total = sum(map(len, payloads))
    stored_pointer = None if store else write_pointer
    plain = payload_header(stored_pointer)
    if not extended or body[pos] == 0:  # no extras: the union's null branch
        if extended:
            pos += 1
        if pos != end:
            return None
        return StoredBatch(write_pointer, stored_pointer, [plain + p for p in payloads], total)
    if body[pos] != 2:
        return None
    count, pos = read(body, pos + 1)
    if count != len(payloads):
        return None
    flags, after_flags = plain[0], plain[1:]
    tiled = _one_header_rows(body, pos, flags, after_flags, payloads)
    if tiled is not None:
        return StoredBatch(write_pointer, stored_pointer, tiled, total)
    keyed_head = bytes((flags | FLAG_KEY,)) + after_flags
    # Rows with a short key and nothing else (a keyed producer's, a copier's) in a loop
    # of their own; the loop below goes on from the first row of another kind.
    values, pos = _keyed_rows(body, pos, keyed_head, payloads)
    rest = payloads[len(values) :] if values else payloads
    key_lengths = _KEY_LENGTHS
    names_seen: set[bytes] = set()  # header names already checked to be UTF-8
    add_value = values.append
    length = write_varint
    one_header: dict[bytes, bytes] = {}  # a header name -> the stored value's head
    for payload in rest:
        branch = body[pos]
        if branch == 0 and body[pos + 1] == 2:
            # No key and one header, both lengths under 64 bytes, no TTL: a Spark sink's
            # rows (a ``source-id`` header). The head up to the value is the same for
            # every row with this name, so it is made once.
            size = body[pos + 2]
            if size < 0x80 and not size & 1:
                name_end = pos + 3 + (size >> 1)
                size = body[name_end]
                value_end = name_end + 1 + (size >> 1)
                if (
                    size < 0x80
                    and not size & 1
                    and value_end + 1 < end
                    and body[value_end] == 0
                    and body[value_end + 1] == 0
                ):
                    name = body[pos + 3 : name_end]
                    head = one_header.get(name)
                    if head is None:
                        head = one_header[name] = _one_header_head(flags, after_flags, name)
                    add_value(
                        head + key_lengths[size >> 1] + body[name_end + 1 : value_end] + payload
                    )
                    pos = value_end + 2
                    continue
        if branch == 2:
            size = body[pos + 1]
            if size < 0x80 and not size & 1:
                # A key under 64 bytes and nothing else (a keyed producer's usual
                # message): its stored value in one concatenation.
                key_end = pos + 2 + (size >> 1)
                if key_end + 1 < end and body[key_end] == 0 and body[key_end + 1] == 0:
                    add_value(
                        keyed_head + key_lengths[size >> 1] + body[pos + 2 : key_end] + payload
                    )
                    pos = key_end + 2
                    continue
        if branch == 2 or (branch == 0 and body[pos + 1] != 0):  # a key or headers
            small = _small_extras(body, pos, flags, after_flags, names_seen)
            if small is not None:
                value_head, pos = small
                add_value(value_head + payload)
                continue
        parts: list[bytes | memoryview] = [b"", after_flags]
        which = flags
        pos += 1
        if branch == 2:
            size, key, pos = _field(body, pos, end)
            parts += (length(size), key)
            which |= FLAG_KEY
        elif branch != 0:
            return None
        pairs, pos = read(body, pos)
        if pairs:
            if pairs < 0:
                return None
            parts.append(length(pairs))
            names: list[bytes] = []
            for _ in range(pairs):
                size, name, pos = _field(body, pos, end)
                name.decode()  # a header name is a string: UTF-8, as fastavro checks
                names.append(name)
                parts += (length(size), name)
                size, value, pos = _field(body, pos, end)
                parts += (length(size), value)
            if body[pos] != 0 or (pairs > 1 and len(set(names)) != pairs):
                return None  # a second block, or a name twice (the last one wins there)
            pos += 1
            which |= FLAG_HEADERS
        if body[pos] != 0:  # a TTL: its expiry depends on the clock
            return None
        pos += 1
        parts[0] = bytes((which,))
        parts.append(payload)
        add_value(b"".join(parts))
    if count and body[pos] != 0:
        return None
    if count:
        pos += 1
    if pos != end:
        return None
    return StoredBatch(write_pointer, stored_pointer, values, total)
