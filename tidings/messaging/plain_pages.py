"""Columnar pages of plain messages, built a batch entry at a time.

A page of a topic whose messages have neither key, headers, expiry nor transaction (the
common shape of a consumed topic) needs nothing per message from the server: a plain
batch entry stores its payloads back to back with their positions
(:mod:`tidings.codec.values`), and the columnar poll response wants the same payloads
back to back with their positions (:mod:`tidings.codec.columns`). So such an entry goes
into the page as one block of payloads, its positions moved by one addition of two big
integers whose 32-bit lanes are the positions, and its ids made the same way from its
first id. Per message that is about 0.05 us against about 0.5 us through
:class:`~tidings.messaging.fetching.PageColumns` (a slice and an id per message, then
lengths summed again).

A poll that resumes inside an entry takes the rest of it as a block too. A page that
meets anything else (a key, a transaction's entry, a pointer, an expiry, an entry of
the first batch form whose payloads each follow a flags byte) is given up:
:attr:`PlainPage.complete` turns False and the caller fetches the page the general way.
The walk up to there is lost; so that a topic that is not plain does not pay it on
every page, the service then reads that topic's next pages the general way for a while
(``MessagingService.fetch_columns``).
"""

from __future__ import annotations

import bisect
import struct
from functools import lru_cache

from tidings.codec import columns as columns_codec
from tidings.codec.keys import MAX_SEQ
from tidings.codec.values import BATCH, BATCH_ENDS_AT, PLAIN, batch_layout, u32_lanes
from tidings.store.backend import ReadView
from tidings.structs import Message, MessageId

__all__ = ["UNBOUNDED", "PlainPage", "append_plain"]

_MESSAGES = "messages"
_U32 = struct.Struct("<I")
_TAIL = struct.Struct(">QH")
_ENTRY_ID = struct.Struct(">QH10x")
_SEQ_ONLY = struct.Struct(">8xH10x")
_NO_PAYLOAD_ROW = bytes(10)
#: Positions in a columnar body are int32.
_MAX_POSITION = (1 << 31) - 1
#: A byte bound that never binds (the server's own scans, ids-only pages).
UNBOUNDED = 1 << 62


@lru_cache(maxsize=16)
def _seq_steps(count: int) -> int:
    """``0, 1, ..., count - 1`` in the seq field of ``count`` 20-byte ids, as one
    big-endian integer: added to ``count`` copies of an entry's first id, each id."""
    return int.from_bytes(b"".join(map(_SEQ_ONLY.pack, range(count))), "big")


class PlainPage:
    """A columnar page of plain messages being fetched: its ids, its payloads'
    positions (counted from the start of the payloads, moved into place by
    :meth:`encode`) and its payloads, as blocks; ``budget``, the bytes it may still
    take (as :func:`~tidings.messaging.fetching.fetch_messages` counts them), and
    ``cut`` once it stopped there."""

    __slots__ = ("budget", "complete", "count", "cut", "data", "ids", "last", "positions", "size")

    def __init__(self) -> None:
        self.budget = UNBOUNDED
        self.cut = False
        self.complete = True
        self.count = 0
        self.size = 0  # payload bytes so far: where the next payload starts
        self.ids: list[bytes] = []
        self.positions: list[bytes] = []  # little-endian u32s, one per message
        self.data: list[bytes | memoryview] = []
        self.last = b""  # the 20-byte id of the last message

    def __len__(self) -> int:
        return self.count

    def take(self, messages: list[Message | bytes]) -> None:
        """Move messages a general reader appended into the page (a poll that resumed
        inside an entry); any that is not plain gives the page up."""
        for m in messages:
            assert isinstance(m, Message)
            if m.key is not None or m.headers:
                self.complete = False
                break
            self._row(m.id.to_bytes(), m.payload)
        messages.clear()

    def _row(self, message_id: bytes, payload: bytes | memoryview) -> None:
        self.ids.append(message_id)
        self.positions.append(_U32.pack(self.size))
        self.data.append(payload)
        self.size += len(payload)
        self.count += 1
        self.last = message_id

    def add_entry(self, ts: int, seq: int, value: bytes, first: int, room: int) -> None:
        """Up to ``room`` messages of the ``BATCH`` entry ``value`` whose first message
        is ``(ts, seq)``, from its message ``first`` on, fewer where the byte budget
        ends first; gives the page up if its payloads are not back to back."""
        (count,) = _U32.unpack_from(value, 1)
        n = min(count - first, room)
        if n <= 0:
            return
        at = BATCH_ENDS_AT + 4 * first
        ends = value[at : at + 4 * (n + 1)]
        begin = int.from_bytes(ends[:4], "little")
        end = int.from_bytes(ends[-4:], "little")
        if end - begin >= self.budget:
            # The message that reaches the budget is the page's last.
            positions = batch_layout(value)[1]
            n = bisect.bisect_left(positions, begin + self.budget, first + 1, first + n) - first
            ends = ends[: 4 * (n + 1)]
            end = positions[first + n]
        starts_at = BATCH_ENDS_AT + 4 * (count + 1) + 4 * first
        seq += first
        if value[starts_at : starts_at + 4 * n] != ends[: 4 * n] or seq + n - 1 > MAX_SEQ:
            self.complete = False  # the first form (a flags byte before each payload)
            return
        # Every position moved to where the page's payloads have got to, in one
        # addition: no lane carries into the next, as each moved position is a
        # position in the page (non-negative, below 2**31).
        moved = int.from_bytes(ends[: 4 * n], "little") + (self.size - begin) * u32_lanes(n)
        self.positions.append(moved.to_bytes(4 * n, "little"))
        ids = int.from_bytes(_ENTRY_ID.pack(ts, seq) * n, "big") + _seq_steps(n)
        block = ids.to_bytes(20 * n, "big")
        self.ids.append(block)
        self.data.append(memoryview(value)[begin:end])
        self.size += end - begin
        self.budget -= end - begin
        self.count += n
        self.last = block[-20:]

    def add_row(self, key: bytes, value: bytes) -> None:
        """A ``PLAIN`` row: its payload follows the flags byte."""
        self._row(key[8:18] + _NO_PAYLOAD_ROW, memoryview(value)[1:])
        self.budget -= len(value)

    def last_id(self) -> MessageId | None:
        """The id of the page's last message (None for an empty page)."""
        return MessageId.from_bytes(self.last) if self.count else None

    def encode(self) -> bytes:
        """The columnar poll response of the page (the layout
        :func:`~tidings.codec.columns.write_columns` writes)."""
        n = self.count
        fixed = columns_codec.IDS_AT + 20 * n + 4 * (n + 1)
        if fixed + self.size > _MAX_POSITION:
            raise OverflowError("a columnar page's positions are 32-bit")
        # Every position moved past the fixed part at once, as in add_entry.
        raw = b"".join(self.positions) + _U32.pack(self.size)
        moved = (int.from_bytes(raw, "little") + fixed * u32_lanes(n + 1)).to_bytes(
            4 * (n + 1), "little"
        )
        head = columns_codec.page_head(n)
        return b"".join((head, *self.ids, moved, *self.data))


def append_plain(
    view: ReadView, scan_from: bytes, stop: bytes, page: PlainPage, limit: int
) -> None:
    """Walk the Message Table from ``scan_from`` into ``page`` until it holds ``limit``
    messages, its byte budget runs out, or the walk reaches ``stop``; at any entry but
    a ``PLAIN`` row or a ``BATCH`` entry, give the page up (:attr:`PlainPage.complete`)."""
    plain, batch = PLAIN, BATCH
    for key, value in view.scan(_MESSAGES, scan_from, stop):
        flags = value[0]
        if flags == batch:
            ts, seq = _TAIL.unpack_from(key, 8)
            page.add_entry(ts, seq, value, 0, limit - page.count)
        elif flags == plain:
            page.add_row(key, value)
        else:
            page.complete = False
        if not page.complete or page.count >= limit or page.budget <= 0:
            return
