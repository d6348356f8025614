"""The read side: scan a topic's Message Table rows in order and expand them into messages.

Consuming: scan the Message Table in ascending order from a start id or
timestamp; a row with ``p`` is one message, a batch entry several in a row (message
``i`` at ``seq + i``); a row without ``p`` stands for the Payload
Table rows stored under its ``t`` (or, if the entry names a payload range, only those of
them inside it), which expand in place. A transactional reader skips
entries of invalid and rolled-back transactions and stops at the first entry whose
transaction is in progress (invariant 3, via :func:`tidings.tx.visibility.classify`);
entries without ``t`` are always visible. A non-transactional reader sees everything.

Retention: the scan never starts below ``now - ttl``, a
Payload Table row written before that is skipped too, and so is a message past its own
expiry, so what a reader sees does not depend on whether the cleaner has run yet.

Everything here reads one consistent :class:`~tidings.store.backend.ReadView` and does no
other I/O.
"""

from __future__ import annotations

import bisect
import struct
from collections.abc import Iterable, Mapping, Sequence
from itertools import repeat

from tidings.codec import columns as columns_codec
from tidings.codec import keys, values
from tidings.codec.values import (
    BATCH,
    BATCH_FLAGS,
    FLAG_EXPIRY,
    FLAG_HEADERS,
    FLAG_KEY,
    FLAG_P,
    FLAG_T,
    KEYED,
    KEYED_BATCH,
    PLAIN,
    TX_BATCH,
    TX_KEYED,
    TX_KEYED_BATCH,
    TX_PLAIN,
    TopicState,
    read_varint,
)
from tidings.codec.wire import AvroItems
from tidings.messaging.plain_pages import UNBOUNDED, PlainPage, append_plain
from tidings.store.backend import ReadView
from tidings.structs import (
    MESSAGE_ID_LAYOUT,
    NO_HEADERS,
    Message,
    MessageId,
    PayloadRange,
    Transaction,
)
from tidings.tx.visibility import Visibility, classify

__all__ = ["UNBOUNDED", "PageColumns", "fetch_messages", "newest_id", "retention_cutoff"]

_MESSAGES = "messages"
_PAYLOADS = "payloads"
_TAIL = struct.Struct(">QH")
_I64 = struct.Struct(">q")
_U64 = struct.Struct(">Q")
_NO_PAYLOAD_ROW = bytes(10)
_SKIP = Visibility.SKIP
_BLOCK = Visibility.BLOCK
_VISIBLE = Visibility.VISIBLE
_new = tuple.__new__
_ID = struct.Struct(MESSAGE_ID_LAYOUT)
#: The 20-byte id of a Message Table message (no Payload Table part) from ts and seq.
_ENTRY_ID = struct.Struct(">QH10x")
#: The same as an Avro item's id: its length (20, zig-zag encoded), then the id.
_AVRO_ID = struct.Struct(">BQH10x")


def retention_cutoff(state: TopicState, now: int) -> int:
    """The oldest timestamp (ms) a topic still holds: ``now - ttl``."""
    return max(now - state.ttl * 1000, 0)


def fetch_messages(
    view: ReadView,
    topic_id: int,
    state: TopicState,
    now: int,
    start: MessageId | int | None,
    inclusive: bool,
    limit: int,
    transaction: Transaction | None,
    avro: AvroItems | None = None,
    *,
    ids: bool = False,
    columns: PageColumns | PlainPage | None = None,
    max_bytes: int = UNBOUNDED,
) -> list[Message | bytes]:
    """At most ``limit`` messages of one topic generation, in id order, and no more
    than ``max_bytes`` of them past the message that reaches ``max_bytes``.

    With ``avro``, plain messages (the common case) come back already encoded as Avro
    poll-response items (see :func:`tidings.codec.wire.avro_messages`) rather than as
    :class:`Message`: the server then skips building and re-reading a tuple per message.
    With ``ids``, every message comes back as its 20-byte id only (for ids-only polls),
    taken from the keys without building a message. With ``columns``, the messages go
    into its columns instead (for a columnar poll response) and the list comes back
    empty; a :class:`~tidings.messaging.plain_pages.PlainPage` takes plain messages
    only, and is given up at any other.

    ``start`` is a message id, a timestamp (ms), or None for the oldest live message;
    ``inclusive`` says whether a message at exactly ``start`` is returned. A limit may
    stop inside a Payload Table expansion; fetching again exclusively from the last id
    returned resumes right after it.

    A message's bytes are its stored size: payload, key and headers, and a few bytes
    of framing (a plain message in a row of its own: its payload and one byte). The
    page stops after the message that brings it to ``max_bytes`` or past, so it holds
    at least one message; a page that stopped so says it in ``columns.cut`` (for
    ``columns``). Ids-only pages (``ids``) are not bounded by bytes.
    """
    generation = state.generation
    cutoff = retention_cutoff(state, now)
    prefix, stop = keys.generation_range(topic_id, generation)
    out: list[Message | bytes] = []
    plain_page = columns if isinstance(columns, PlainPage) else None
    reader = _Reader(
        view, topic_id, generation, cutoff, now, transaction, out, limit, ids, avro, plain_page,
        UNBOUNDED if ids else max_bytes,
    )  # fmt: skip
    if isinstance(start, MessageId):
        if start.publish_ts >= cutoff:
            first = prefix + keys.ts_seq(start.publish_ts, start.seq)
            value = view.get(_MESSAGES, first)
            # The entry the id points into: resume inside it (or just after it).
            if value is not None and not reader.entry(
                first, value, (start.write_ts, start.p_seq), inclusive
            ):
                if columns is not None:
                    columns.take(out)
                return out
            if value is None and not reader.inside_batch(prefix, first, start, inclusive):
                # Inside a transaction's batch entry that a transactional reader stops at.
                if columns is not None:
                    columns.take(out)
                return out
            scan_from = first + b"\0"
        else:
            scan_from = prefix + keys.ts_seq(cutoff, 0)
    else:
        ts = cutoff if start is None else max(start if inclusive else start + 1, cutoff)
        scan_from = prefix + keys.ts_seq(ts, 0)
    if columns is not None:
        columns.take(out)
        if reader.budget > 0:
            if isinstance(columns, PlainPage):
                if columns.complete and len(columns) < limit:
                    columns.budget = reader.budget
                    append_plain(view, scan_from, stop, columns, limit)
                    reader.budget = columns.budget
            elif len(columns.ids) < limit:
                reader.budget = _append_columns(view, scan_from, stop, out, reader, columns, limit)
        columns.cut = reader.budget <= 0
        if isinstance(columns, PageColumns):
            columns.spent = max_bytes - reader.budget
        return out
    if len(out) >= limit or reader.budget <= 0:
        return out

    # Locals, not globals, in the per-message loop: this is the consumer hot path.
    # tuple.__new__ skips the NamedTuples' Python-level __new__ (a third of the cost).
    append, new, message_cls, id_cls = out.append, tuple.__new__, Message, MessageId
    unpack_tail, unpack_i64 = _TAIL.unpack_from, _I64.unpack_from
    plain, tx_plain = PLAIN, TX_PLAIN if transaction is None else -1
    keyed = KEYED
    no_headers, no_payload_table = NO_HEADERS, (0, 0)
    if avro is not None:
        _append_avro(view, scan_from, stop, out, reader, avro, plain, tx_plain, limit)
        return out
    if ids:
        _append_ids(view, scan_from, stop, out, reader, plain, tx_plain, limit)
        return out
    budget = reader.budget
    for key, value in view.scan(_MESSAGES, scan_from, stop):
        flags = value[0]
        # Fast paths for the two common shapes; everything else goes through entry().
        if flags == plain:
            message_id = new(id_cls, unpack_tail(key, 8) + no_payload_table)
            append(new(message_cls, (message_id, value[1:], None, no_headers, None, 0)))
        elif flags == tx_plain:
            message_id = new(id_cls, unpack_tail(key, 8) + no_payload_table)
            (wp,) = unpack_i64(value, 1)
            append(new(message_cls, (message_id, value[9:], None, no_headers, wp, 0)))
        elif flags == keyed and value[1] < 0x80:
            # A key shorter than 128 bytes: its length is one varint byte.
            end = 2 + value[1]
            message_id = new(id_cls, unpack_tail(key, 8) + no_payload_table)
            append(new(message_cls, (message_id, value[end:], value[2:end], no_headers, None, 0)))
        else:
            left = reader.within(key, value, budget)
            if left is None or len(out) >= limit or left <= 0:
                break
            budget = left
            continue
        budget -= len(value)
        if len(out) >= limit or budget <= 0:
            break
    return out


def newest_id(
    view: ReadView, topic_id: int, state: TopicState, now: int, most: int
) -> bytes | None:
    """The 20-byte id of the newest message a non-transactional reader of the topic's
    live generation gets, or None: the entries from the last one back, each read
    alone, until one holds such a message (at most ``most`` ids of a pointer entry are
    read). The last entry alone is not enough: its messages may be past their own
    expiry, or its Payload Table rows past the TTL, while older ones are still live;
    so a seek per such entry, until the cleaner has taken them."""
    generation = state.generation
    cutoff = retention_cutoff(state, now)
    prefix, stop = keys.generation_range(topic_id, generation)
    floor = prefix + keys.ts_seq(cutoff, 0)
    out: list[Message | bytes] = []
    reader = _Reader(view, topic_id, generation, cutoff, now, None, out, most, ids=True)
    while True:
        last = view.last_below(_MESSAGES, stop, floor)
        if last is None:
            return None
        reader.entry(last[0], last[1], None, True)
        if out:
            found = out[-1]
            assert isinstance(found, bytes)
            return found
        stop = last[0]


def _append_avro(
    view: ReadView,
    scan_from: bytes,
    stop: bytes,
    out: list[Message | bytes],
    reader: _Reader,
    avro: AvroItems,
    plain: int,
    tx_plain: int,
    limit: int,
) -> None:
    # The same walk as the Message loop above, emitting each plain entry as its Avro
    # item: id (length byte 0x28, the key's ts|seq, ten zero bytes), payload length,
    # payload, and for the extended schema a null key and empty headers.
    append, join, suffix = out.append, b"".join, avro.suffix
    small, zigzag, id_len, zero = avro.small, avro.zigzag, b"\x28", bytes(10)
    # A key alone (under 128 bytes) is written as it is stored: the extended schema's
    # key branch, its length and bytes, and no headers; the plain schema drops it.
    keyed, extended = KEYED, bool(suffix)
    budget = reader.budget
    for key, value in view.scan(_MESSAGES, scan_from, stop):
        flags = value[0]
        if flags == plain:
            n = len(value) - 1
            payload = memoryview(value)[1:]
        elif flags == tx_plain:
            n = len(value) - 9
            payload = memoryview(value)[9:]
        elif flags == keyed and value[1] < 0x80:
            end = 2 + value[1]
            n = len(value) - end
            length = small[n] if n < 16384 else zigzag(n)
            row = memoryview(value)
            if extended:  # the key's branch, its length and bytes, no headers: one join
                append(join((id_len, key[8:18], zero, length, row[end:], b"\x02",
                             small[value[1]], row[2:end], b"\x00")))  # fmt: skip
            else:
                append(join((id_len, key[8:18], zero, length, row[end:])))
            budget -= len(value)
            if len(out) >= limit or budget <= 0:
                return
            continue
        else:
            left = reader.within(key, value, budget)
            if left is None or len(out) >= limit or left <= 0:
                return
            budget = left
            continue
        length = small[n] if n < 16384 else zigzag(n)
        append(join((id_len, key[8:18], zero, length, payload, suffix)))
        budget -= len(value)
        if len(out) >= limit or budget <= 0:
            return


class PageColumns:
    """The columns of a page being fetched (see :mod:`tidings.codec.columns`): ids,
    payloads, keys from the first row that has one, and the rows that have headers;
    ``cut`` once the fetch stopped at its byte bound."""

    __slots__ = ("cut", "headers", "ids", "keys", "payloads", "spent")

    def __init__(self) -> None:
        self.cut = False
        #: What the fetch counted against its byte bound (the rows' stored sizes: at
        #: least their payloads and keys); 0 where it did not say.
        self.spent = 0
        self.ids: list[bytes] = []
        self.payloads: list[bytes] = []
        self.keys: list[bytes | None] | None = None
        self.headers: dict[int, Mapping[str, bytes]] = {}

    def __len__(self) -> int:
        return len(self.ids)

    def take(self, messages: list[Message | bytes]) -> None:
        """Move messages the general reader appended into the columns."""
        for m in messages:
            assert isinstance(m, Message)
            if m.headers:
                self.headers[len(self.ids)] = m.headers
            if m.key is not None or self.keys is not None:
                self.key_column().append(m.key)
            self.ids.append(m.id.to_bytes())
            self.payloads.append(m.payload)
        messages.clear()

    def key_column(self) -> list[bytes | None]:
        """The keys, kept row by row from the first row that has one (the rows before
        it filled in then), before that row's id is added."""
        if self.keys is None:
            self.keys = [None] * len(self.ids)
        return self.keys

    def extend_rows(self, other: PageColumns, rows: Sequence[int]) -> None:
        """Append rows ``rows`` (ascending indices) of ``other``."""
        if isinstance(rows, range) and rows.step == 1:
            # A run of rows (a member that owns every partition): list slices.
            self._extend_run(other, rows.start, rows.stop)
            return
        if other.keys is not None or self.keys is not None:
            added = self.key_column()  # before the ids: it fills in the rows so far
            if other.keys is not None:
                added.extend(map(other.keys.__getitem__, rows))
            else:
                added.extend(repeat(None, len(rows)))
        if other.headers:
            base, headers = len(self.ids), other.headers
            for j, i in enumerate(rows):
                entry = headers.get(i)
                if entry:
                    self.headers[base + j] = entry
        self.ids.extend(map(other.ids.__getitem__, rows))
        self.payloads.extend(map(other.payloads.__getitem__, rows))

    def _extend_run(self, other: PageColumns, start: int, stop: int) -> None:
        if other.keys is not None or self.keys is not None:
            added = self.key_column()  # before the ids: it fills in the rows so far
            if other.keys is not None:
                added += other.keys[start:stop]
            else:
                added.extend(repeat(None, len(range(start, stop))))
        if other.headers:
            base = len(self.ids) - start
            for i, entry in other.headers.items():
                if start <= i < stop:
                    self.headers[base + i] = entry
        self.ids += other.ids[start:stop]
        self.payloads += other.payloads[start:stop]

    def messages(self) -> list[Message]:
        """The rows as messages (without write pointers, as a columnar answer has
        none)."""
        new, id_cls, unpack = tuple.__new__, MessageId, _ID.unpack
        keys: Iterable[bytes | None] = self.keys if self.keys is not None else repeat(None)
        headers = self.headers
        return [
            new(Message, (new(id_cls, unpack(i)), p, k, headers.get(n, NO_HEADERS), None, 0))
            for n, (i, p, k) in enumerate(zip(self.ids, self.payloads, keys, strict=False))
        ]

    def encode(self) -> bytes:
        """The columnar poll response of the page."""
        headers: list[Mapping[str, bytes]] | None = None
        if self.headers:
            headers = [NO_HEADERS] * len(self.ids)
            for row, entry in self.headers.items():
                headers[row] = entry
        return columns_codec.write_columns(self.ids, self.payloads, self.keys, headers)


class _SeenPointer:
    """Whether a transactional row is visible to a reader, remembering the last write
    pointer found visible: a transaction's rows come together, so a page of them needs
    one visibility check, not one per row. A reader without a snapshot sees every row
    (rolled-back ones too, as CDAP TMS readers do)."""

    __slots__ = ("last", "tx")

    def __init__(self, tx: Transaction | None) -> None:
        self.tx = tx
        self.last = b""  # the raw ``t`` (8 bytes) of the pointer last found visible

    def __call__(self, value: bytes) -> bool:
        raw = value[1:9]
        if raw == self.last:
            return True
        tx = self.tx
        if tx is not None and classify(tx, _I64.unpack(raw)[0]) != _VISIBLE:
            return False  # skipped or blocking: the general reader says which
        self.last = raw
        return True


def _append_columns(
    view: ReadView,
    scan_from: bytes,
    stop: bytes,
    out: list[Message | bytes],
    reader: _Reader,
    columns: PageColumns,
    limit: int,
) -> int:
    # The Message loop's walk again, each plain or short-keyed entry (a transactional
    # one once its write pointer is found visible) straight into the columns; any other
    # entry goes through the general reader, then into the columns. Returns the byte
    # budget left.
    ids, payloads = columns.ids, columns.payloads
    add_id, add_payload, zero = ids.append, payloads.append, _NO_PAYLOAD_ROW
    plain, keyed, batch, keyed_batch = PLAIN, KEYED, BATCH, KEYED_BATCH
    tx_batches = (TX_BATCH, TX_KEYED_BATCH)
    tx_plain, tx_keyed, visible = TX_PLAIN, TX_KEYED, _SeenPointer(reader.tx)
    rows = iter(view.scan(_MESSAGES, scan_from, stop))
    budget = reader.budget
    if columns.keys is None:
        # Until the page's first keyed row, plain rows need no key column: the walk
        # of a plain topic's page, with nothing per row but the row itself.
        room = limit - len(ids)
        for key, value in rows:
            flags = value[0]
            if flags == plain:
                add_id(key[8:18] + zero)
                add_payload(value[1:])
            elif flags == tx_plain and (value[1:9] == visible.last or visible(value)):
                add_id(key[8:18] + zero)
                add_payload(value[9:])
            elif (
                flags == tx_keyed
                and value[9] < 0x80
                and (value[1:9] == visible.last or visible(value))
            ):
                end = 10 + value[9]
                columns.key_column().append(value[10:end])  # before the id: see there
                add_id(key[8:18] + zero)
                add_payload(value[end:])
                room -= 1
                budget -= len(value)
                if not room or budget <= 0:
                    return budget
                break  # the page has a key column from here on
            elif flags in (batch, keyed_batch) or (
                flags in tx_batches and (value[1:9] == visible.last or visible(value))
            ):
                n, spent = _take_batch(key, value, columns, room, budget)
                room -= n
                budget -= spent
                if room <= 0 or budget <= 0:
                    return budget
                if columns.keys is not None:
                    break
                continue
            else:
                left = _append_entry(key, value, columns, reader, out, limit, budget)
                if left is None:
                    return budget  # stopped before the entry: nothing of it taken
                budget = left
                if len(ids) >= limit or budget <= 0:
                    return budget
                if columns.keys is not None:
                    break
                room = limit - len(ids)
                continue
            room -= 1
            budget -= len(value)
            if not room or budget <= 0:
                return budget
    keys = columns.keys
    if keys is None:
        return budget  # the loop above took every row
    # The page has a key column: one key (or None) per row, appended in step.
    add_key = keys.append
    room = limit - len(ids)
    for key, value in rows:
        flags = value[0]
        if flags == plain:
            add_id(key[8:18] + zero)
            add_payload(value[1:])
            add_key(None)
        elif flags == keyed and value[1] < 0x80:
            end = 2 + value[1]
            add_key(value[2:end])
            add_id(key[8:18] + zero)
            add_payload(value[end:])
        elif (
            flags == tx_keyed and value[9] < 0x80 and (value[1:9] == visible.last or visible(value))
        ):
            end = 10 + value[9]
            add_key(value[10:end])
            add_id(key[8:18] + zero)
            add_payload(value[end:])
        elif flags == tx_plain and (value[1:9] == visible.last or visible(value)):
            add_id(key[8:18] + zero)
            add_payload(value[9:])
            add_key(None)
        elif flags in (batch, keyed_batch) or (
            flags in tx_batches and (value[1:9] == visible.last or visible(value))
        ):
            n, spent = _take_batch(key, value, columns, room, budget)
            room -= n
            budget -= spent
            if room <= 0 or budget <= 0:
                return budget
            continue
        else:
            # Its keys go to the same list.
            left = _append_entry(key, value, columns, reader, out, limit, budget)
            if left is None:
                return budget  # stopped before the entry: nothing of it taken
            budget = left
            room = limit - len(ids)
            if room <= 0 or budget <= 0:
                return budget
            continue
        room -= 1
        budget -= len(value)
        if not room or budget <= 0:
            return budget
    return budget


def _bytes_stop(ends: Sequence[int], first: int, stop: int, budget: int) -> int:
    """Where a batch entry's messages ``first`` to ``stop`` (exclusive) end within a
    byte ``budget``: after the message that brings them to it or past (so after
    ``first`` at least), or at ``stop``; ``ends`` as :func:`values.batch_layout`
    gives them."""
    if ends[stop] - ends[first] < budget:
        return stop
    return bisect.bisect_left(ends, ends[first] + budget, first + 1, stop)


def _take_batch(
    key: bytes, value: bytes, columns: PageColumns, room: int, budget: int
) -> tuple[int, int]:
    """A batch entry's first ``room`` messages, or fewer within a byte ``budget``
    (:func:`_bytes_stop`), into the columns, keys too where the page has a key column
    (made here for a keyed entry); returns how many, and their bytes."""
    count, ends, starts = values.batch_layout(value)
    n = _bytes_stop(ends, 0, count if count <= room else room, budget)
    if value[0] & FLAG_KEY:
        key_column = columns.key_column()  # before the ids: it fills in the rows so far
        at = values.batch_key_starts(value, n)
        key_column.extend(map(value.__getitem__, map(slice, at, starts)))
    elif columns.keys is not None:
        columns.keys.extend(repeat(None, n))
    ts, seq = _TAIL.unpack_from(key, 8)
    columns.ids.extend(map(_ENTRY_ID.pack, repeat(ts, n), range(seq, seq + n)))
    columns.payloads.extend(map(value.__getitem__, map(slice, starts[:n], ends[1 : n + 1])))
    return n, ends[n] - ends[0]


def _append_entry(
    key: bytes,
    value: bytes,
    columns: PageColumns,
    reader: _Reader,
    out: list[Message | bytes],
    limit: int,
    budget: int,
) -> int | None:
    """One entry that is not a plain row into the columns, as the loop of
    :func:`_append_columns` takes it: the byte ``budget`` left after it, or None
    where a transactional reader must stop (before it)."""
    if value[0] == KEYED and value[1] < 0x80:
        end = 2 + value[1]
        columns.key_column().append(value[2:end])
        columns.ids.append(key[8:18] + _NO_PAYLOAD_ROW)
        columns.payloads.append(value[end:])
        return budget - len(value)
    reader.limit = limit - len(columns.ids)
    left = reader.within(key, value, budget)
    columns.take(out)
    return left


def _append_ids(
    view: ReadView,
    scan_from: bytes,
    stop: bytes,
    out: list[Message | bytes],
    reader: _Reader,
    plain: int,
    tx_plain: int,
    limit: int,
) -> None:
    # The Message loop's walk again; a plain entry's id is its key's ts|seq and ten zero
    # bytes (no Payload Table part), so its value is never copied.
    append, zero = out.append, _NO_PAYLOAD_ROW
    for key, value in view.scan(_MESSAGES, scan_from, stop):
        flags = value[0]
        if flags in (plain, tx_plain):
            append(key[8:18] + zero)
        elif not reader.entry(key, value, None, True):
            return
        if len(out) >= limit:
            return


class _Reader:
    """Expands one Message Table entry at a time into the output list."""

    __slots__ = (
        "avro", "budget", "cutoff", "generation", "ids", "limit", "now", "out", "plain",
        "topic_id", "tx", "view",
    )  # fmt: skip

    def __init__(
        self,
        view: ReadView,
        topic_id: int,
        generation: int,
        cutoff: int,
        now: int,
        tx: Transaction | None,
        out: list[Message | bytes],
        limit: int,
        ids: bool = False,
        avro: AvroItems | None = None,
        plain: PlainPage | None = None,
        budget: int = UNBOUNDED,
    ) -> None:
        self.view = view
        self.plain = plain  # a plain page being fetched: plain batch entries go there
        self.ids = ids  # append 20-byte ids instead of messages
        self.avro = avro  # append Payload Table rows as poll-response items
        self.topic_id = topic_id
        self.generation = generation
        self.cutoff = cutoff
        self.now = now
        self.tx = tx
        self.out = out
        self.limit = limit
        #: Bytes the page may still take (see :func:`fetch_messages`).
        self.budget = budget

    def entry(
        self, key: bytes, value: bytes, resume: tuple[int, int] | None, inclusive: bool
    ) -> bool:
        """Append the messages of one entry (their bytes taken from :attr:`budget`);
        False if a transactional reader must stop.

        ``resume`` is the ``(write_ts, p_seq)`` of a start id inside this entry: only
        messages at (``inclusive``) or after it are appended.
        """
        flags = value[0]
        wp = None
        if flags & FLAG_T:
            (wp,) = _I64.unpack_from(value, 1)
            if self.tx is not None:
                visibility = classify(self.tx, wp)
                if visibility == _SKIP:
                    return True
                if visibility == _BLOCK:
                    return False
        ts, seq = _TAIL.unpack_from(key, 8)
        if flags in BATCH_FLAGS:
            # A start id on the entry's key is its first message (or just after it).
            first = 0 if resume is None or (resume == (0, 0) and inclusive) else 1
            self.batch(ts, seq, value, first, wp)
            return True
        if flags & FLAG_P:
            if resume is not None and (resume != (0, 0) or not inclusive):
                return True  # the start id is at or after this entry's single message
            self.budget -= len(value)
            if self.ids and flags in (PLAIN, TX_PLAIN):
                self.out.append(key[8:18] + _NO_PAYLOAD_ROW)
                return True
            if flags in (PLAIN, TX_PLAIN):
                self.out.append(
                    Message(MessageId(ts, seq), value[1 if wp is None else 9 :], write_pointer=wp)
                )
                return True
            if flags in (KEYED, TX_KEYED) and not self.ids:
                at = 1 if wp is None else 9
                if value[at] < 0x80:  # a key shorter than 128 bytes, as most are
                    end = at + 1 + value[at]
                    # tuple.__new__: the NamedTuples' own __new__ is a third of the cost.
                    self.out.append(
                        _new(
                            Message,
                            (_new(MessageId, (ts, seq, 0, 0)), value[end:], value[at + 1 : end],
                             NO_HEADERS, wp, 0),
                        )
                    )  # fmt: skip
                    return True
            stored = values.decode_value(value)
            if stored.expires_at is not None and stored.expires_at <= self.now:
                self.budget += len(value)  # not on the page after all
                return True
            if self.ids:
                self.out.append(key[8:18] + _NO_PAYLOAD_ROW)
                return True
            payload = stored.payload if stored.payload is not None else b""
            self.out.append(Message(MessageId(ts, seq), payload, stored.key, stored.headers, wp))
            return True
        if wp is not None:
            self._expand(ts, seq, wp, values.read_payload_range(value), resume, inclusive)
        return True

    def within(self, key: bytes, value: bytes, budget: int) -> int | None:
        """:meth:`entry` (from its start) for a walk that keeps the byte budget itself:
        the budget left after it, or None where a transactional reader must stop."""
        self.budget = budget
        return self.budget if self.entry(key, value, None, True) else None

    def inside_batch(self, prefix: bytes, key: bytes, start: MessageId, inclusive: bool) -> bool:
        """Append the messages at or after ``start`` (``inclusive``) of the batch entry
        holding it, if ``key`` (its ``ts | seq``, not an entry's key) lies in one; False
        if it is a transaction's that a transactional reader must stop at."""
        below = self.view.last_below(_MESSAGES, key, prefix)
        if below is None or below[1][0] not in BATCH_FLAGS:
            return True
        entry_key, value = below
        ts, seq = _TAIL.unpack_from(entry_key, 8)
        count = values.batch_count(value)
        if ts != start.publish_ts or not seq < start.seq < seq + count:
            return True
        wp = values.read_write_pointer(value)
        if wp is not None and self.tx is not None:
            visibility = classify(self.tx, wp)
            if visibility != _VISIBLE:
                return visibility != _BLOCK  # skipped: the scan goes on after it
        exact = inclusive and start.write_ts == 0 and start.p_seq == 0
        self.batch(ts, seq, value, start.seq - seq + (0 if exact else 1), wp)
        return True

    def batch(self, ts: int, seq: int, value: bytes, first: int, wp: int | None = None) -> None:
        """Append the messages of a batch entry from its ``first`` on (up to the limit),
        a transaction's with its write pointer ``wp``. Its messages are all plain, or
        all short-keyed, without anything else."""
        out = self.out
        plain = self.plain
        if plain is not None and value[0] == BATCH and not out:
            # A plain page resuming inside an entry: from there on, as a block.
            plain.budget = self.budget
            plain.add_entry(ts, seq, value, first, self.limit - len(plain))
            self.budget = plain.budget
            return
        if self.ids:  # from the key and the count alone
            stop = min(values.batch_count(value), first + self.limit - len(out))
            ids = range(seq + first, seq + stop)
            out.extend(map(_ENTRY_ID.pack, repeat(ts, len(ids)), ids))
            return
        count, ends, starts = values.batch_layout(value)
        stop = _bytes_stop(ends, first, min(count, first + self.limit - len(out)), self.budget)
        self.budget -= ends[stop] - ends[first]
        row = memoryview(value)
        keyed = bool(value[0] & FLAG_KEY)
        skip = values.batch_key_skip(value[0])  # where a key starts in its stored value
        avro = self.avro
        if avro is None:
            for i in range(first, stop):
                at, start, end = ends[i], starts[i], ends[i + 1]
                message_id = _new(MessageId, (ts, seq + i, 0, 0))
                key = value[at + skip : start] if keyed else None
                out.append(_new(Message, (message_id, value[start:end], key, NO_HEADERS, wp, 0)))
            return
        # As Avro poll-response items, as the scan writes a plain or short-keyed row's:
        # the id, the payload's length and bytes, and for the extended schema the key
        # (or none) and no headers.
        small, zigzag, suffix, join = avro.small, avro.zigzag, avro.suffix, b"".join
        keyed = keyed and bool(suffix)
        for i in range(first, stop):
            at, start, end = ends[i], starts[i], ends[i + 1]
            size = end - start
            length = small[size] if size < 16384 else zigzag(size)
            item_id = _AVRO_ID.pack(0x28, ts, seq + i)
            if keyed:
                key_length = small[start - at - skip]
                out.append(join((item_id, length, row[start:end], b"\x02", key_length,
                                 row[at + skip : start], b"\x00")))  # fmt: skip
            else:
                out.append(join((item_id, length, row[start:end], suffix)))

    def _expand(
        self,
        ts: int,
        seq: int,
        wp: int,
        rng: PayloadRange | None,
        resume: tuple[int, int] | None,
        inclusive: bool,
    ) -> None:
        # Payload rows are keyed by the positive pointer; a rolled-back entry (-t) still
        # expands for non-transactional readers (repeatable reads).
        prefix, stop = keys.write_pointer_range(self.topic_id, self.generation, abs(wp))
        start = prefix
        if rng is not None:
            # Only the rows of the range: payload keys are fixed-width, so the last key
            # + b"\0" is the first key after it.
            start = prefix + keys.ts_seq(rng.first_ts, rng.first_seq)
            stop = prefix + keys.ts_seq(rng.last_ts, rng.last_seq) + b"\0"
        skip = None
        if resume is not None:
            resume_key = prefix + keys.ts_seq(*resume)
            start = max(start, resume_key)
            skip = None if inclusive else resume_key
        out, cutoff, now, limit, ids = self.out, self.cutoff, self.now, self.limit, self.ids
        entry_part = keys.ts_seq(ts, seq) if ids else b""
        avro = None if ids else self.avro
        item_id = b"\x28" + keys.ts_seq(ts, seq)  # an item's id: length 20, entry part
        for pkey, pvalue in self.view.scan(_PAYLOADS, start, stop):
            if pkey == skip:
                continue
            write_ts, p_seq = _TAIL.unpack_from(pkey, 16)
            if write_ts < cutoff:
                continue
            self.budget -= len(pvalue)
            if avro is not None:
                # What a Spark sink or any store wrote: each row straight into its item.
                item = _row_item(item_id + pkey[16:26], pvalue, avro, now)
                if item is None:
                    self.budget += len(pvalue)  # expired: not on the page
                    continue
                out.append(item)
                if len(out) >= limit or self.budget <= 0:
                    return
                continue
            if ids:
                if pvalue[0] != PLAIN:
                    stored = values.decode_value(pvalue)
                    if stored.expires_at is not None and stored.expires_at <= now:
                        continue
                out.append(entry_part + pkey[16:26])
                if len(out) >= limit:
                    return
                continue
            message_id = MessageId(ts, seq, write_ts, p_seq)
            if pvalue[0] == PLAIN:
                out.append(Message(message_id, pvalue[1:], write_pointer=wp))
            else:
                stored = values.decode_value(pvalue)
                if stored.expires_at is not None and stored.expires_at <= now:
                    self.budget += len(pvalue)  # expired: not on the page
                    continue
                payload = stored.payload if stored.payload is not None else b""
                out.append(Message(message_id, payload, stored.key, stored.headers, wp))
            if len(out) >= limit or self.budget <= 0:
                return


def _row_item(item_id: bytes, value: bytes, avro: AvroItems, now: int) -> bytes | None:
    """A Payload Table row as a poll-response item (None once it expired): the id
    (``item_id``, 21 bytes with its length), the payload and, for the extended schema,
    the key and headers, re-encoded from the stored varints to Avro's."""
    small, zigzag = avro.small, avro.zigzag
    flags = value[0]
    if flags == PLAIN:
        n = len(value) - 1
        length = small[n] if n < 16384 else zigzag(n)
        return b"".join((item_id, length, memoryview(value)[1:], avro.suffix))
    pos = 9 if flags & FLAG_T else 1
    if flags & FLAG_EXPIRY:
        if _U64.unpack_from(value, pos)[0] <= now:
            return None
        pos += 8
    extras: list[bytes] = []
    if flags & FLAG_KEY:
        n, pos = read_varint(value, pos)
        extras += (b"\x02", small[n] if n < 16384 else zigzag(n), value[pos : pos + n])
        pos += n
    else:
        extras.append(b"\x00")
    if flags & FLAG_HEADERS:
        count, pos = read_varint(value, pos)
        if count:
            extras.append(small[count] if count < 16384 else zigzag(count))
        for _ in range(2 * count):  # a name, then its value
            n, pos = read_varint(value, pos)
            extras += (small[n] if n < 16384 else zigzag(n), value[pos : pos + n])
            pos += n
    extras.append(b"\x00")  # end of the headers map
    n = len(value) - pos if flags & FLAG_P else 0
    length = small[n] if n < 16384 else zigzag(n)
    parts = [item_id, length, memoryview(value)[pos:] if n else b""]
    if avro.suffix:  # the extended schema; the plain one has no key or headers
        parts += extras
    return b"".join(parts)
