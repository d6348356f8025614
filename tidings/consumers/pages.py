"""The pages group members scan, fetched once for all of them.

Members of a topic's groups read the same total order from similar places; a page of
read-committed messages, with each message's partition hash and, per partition count,
the indices of each partition's messages, serves every member that scans through it.
Each member's share of a page (its partitions' rows) is laid out as columns once, by
the first member of its group to reach the page, and each answer is cut from it.
"""

from __future__ import annotations

import bisect
import threading
import time
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import accumulate, chain

from tidings.codec.columns import ColumnBlocks, column_blocks, write_blocks
from tidings.messaging.fetching import PageColumns
from tidings.structs import Message, MessageId

__all__ = ["Page", "Pages", "Selection", "Share", "data_bytes", "row_bytes"]

#: Most pages kept per topic for the members' scans, and most bytes they may hold
#: (payloads and keys, plus an allowance per message for its objects). Members of a
#: group drift apart while they read (each reads every page, at its own pace), so
#: pages are kept for the spread between the first and the last: 8 were too few for 4
#: members over 20 pages (each page was fetched and decoded about 3 times).
_PAGES_KEPT = 64
_BYTES_KEPT = 64 << 20
#: Memory per message beyond its payload and key: the id (a 20-byte bytes object),
#: the payload's bytes object header and the list slots. Counting more than a page
#: holds evicts pages members still need: 200 per message, with pages of 10,000 keyed
#: 100-byte messages, made 4 members over 30 pages fetch each page about 3 times
#: (123k against 279k msg/s in one benchmark run).
_ROW_OVERHEAD = 53 + 33 + 3 * 8
#: Seconds a page serves: it may hold messages whose TTL passes meanwhile, which a fresh
#: fetch would skip, so it is not kept much longer than members take to pass through
#: (and no longer than its oldest message is within the topic's TTL: ``Page.stale_at``).
PAGE_LIFETIME = 10.0


@dataclass(slots=True)
class Page:
    """Read-committed messages after ``start`` (exclusive; None: from the oldest), as
    the columns of a columnar poll response (:class:`PageColumns`): a member's answer
    is a selection of its rows, encoded as columns (or as messages for a member that
    asks for another medium). Partition hashes are made when first asked for: a
    member alone needs none, and under several they are made once per page."""

    start: MessageId | None
    columns: PageColumns
    full: bool
    #: Per partition count: the indices of each partition's messages.
    indexes: dict[int, dict[int, list[int]]] = field(default_factory=dict)
    #: When it was fetched (monotonic seconds).
    fetched: float = field(default_factory=time.monotonic)
    #: When its oldest message passes the topic's TTL (ms since the epoch; None: not
    #: known). A fresh fetch skips that message from then on, so the page serves no
    #: longer: a member must not get what the topic's retention no longer keeps.
    stale_at: int | None = None
    #: Roughly what it holds in memory (bytes), for the bound on the kept pages.
    size: int = 0
    #: At least its messages' payload and key bytes (what a member's byte bound
    #: counts): what the fetch counted against its own bound, their stored sizes.
    data: int = 0
    #: Per partition count and set of partitions: that share of the page's messages.
    shares: dict[tuple[int, frozenset[int]], Share] = field(default_factory=dict)
    _hashes: list[int] | None = None
    #: Held while the hashes and an index are made: members reach a new page together,
    #: and each making them at once cost four times the work under four members.
    _making: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        columns = self.columns
        if not self.data:
            # What the fetch counted is enough (at least the payloads and keys: the
            # bound is checked exactly where it may fall), and saves a pass over them.
            self.data = columns.spent or data_bytes(columns, range(len(columns.ids)))
        if not self.size:
            self.size = self.data + _ROW_OVERHEAD * len(columns.ids)

    def __len__(self) -> int:
        return len(self.columns.ids)

    @property
    def last(self) -> MessageId | None:
        return self.id_at(-1) if self.columns.ids else self.start

    def covers(self, position: MessageId | None) -> bool:
        """True if the messages after ``position`` start inside this page."""
        if position is None:
            return self.start is None
        last = self.last
        if last is None or not position < last:
            return False
        if self.start is None:
            # Read from the topic's oldest message: it covers its own messages (a
            # member's second poll resumes inside it).
            return self.id_at(0) <= position
        return self.start <= position

    def id_at(self, index: int) -> MessageId:
        """The id of the message at ``index``."""
        return MessageId.from_bytes(self.columns.ids[index])

    @property
    def hashes(self) -> list[int]:
        """Each message's partition hash (:func:`~tidings.codec.groups.key_hash`: the
        key's crc32, or the id's for a message without a key)."""
        hashes = self._hashes
        if hashes is None:
            with self._making:
                hashes = self._hashes
                if hashes is None:
                    ids, keys, crc32 = self.columns.ids, self.columns.keys, zlib.crc32
                    if keys is None:
                        hashes = list(map(crc32, ids))
                    else:
                        hashes = [
                            crc32(i if k is None else k) for i, k in zip(ids, keys, strict=True)
                        ]
                    self._hashes = hashes
        return hashes

    def by_partition(self, partitions: int) -> dict[int, list[int]]:
        """The indices of each partition's messages, in order, for ``partitions``."""
        index = self.indexes.get(partitions)
        if index is None:
            hashes = self.hashes
            with self._making:
                index = self.indexes.get(partitions)
                if index is None:
                    # Each partition's list and its bound append made once: a third
                    # less per message than a setdefault and a method lookup each.
                    index = {p: [] for p in range(partitions)}
                    appends = [index[p].append for p in range(partitions)]
                    for i, h in enumerate(hashes):
                        appends[h % partitions](i)
                    self.indexes[partitions] = index
        return index

    def share(
        self, partitions: int, owned: frozenset[int], others: Iterable[frozenset[int]] = ()
    ) -> Share:
        """The messages of partitions ``owned`` (of ``partitions``), laid out as
        columns unless they are all the page's (a member alone takes runs of them).
        The first member to ask lays out its group's other members' shares
        (``others``) too: the page was fetched just before and is still in the
        processor's caches, where each member laying out its own later, from memory,
        took about twice as long (BENCHMARKS.md, "Group pages laid out once per
        member")."""
        share = self.shares.get((partitions, owned))
        if share is not None:
            return share
        wanted = [owned, *(s for s in others if s and s != owned)]
        every = range(partitions)
        index = None
        if not all(s.issuperset(every) for s in wanted):
            index = self.by_partition(partitions)  # before the lock: it takes it
        with self._making:
            for parts in wanted:
                if (partitions, parts) in self.shares:
                    continue
                if index is None or parts.issuperset(every):
                    rows: Sequence[int] = range(len(self))
                else:
                    # Each partition's rows are in order: the sort merges a few runs.
                    rows = sorted(chain.from_iterable(index.get(p, ()) for p in parts))
                made = Share(self.columns, rows)
                if not isinstance(rows, range):
                    # A member alone takes runs of rows, which the general way copies
                    # as list slices: laid out, they measured slower.
                    made.lay_out()
                self.shares[(partitions, parts)] = made
                self.size += made.size
            return self.shares[(partitions, owned)]

    def after(self, position: MessageId | None) -> int:
        """The index of the first message after ``position``."""
        if position is None or position == self.start:
            return 0
        # The 20-byte form sorts as the ids do.
        return bisect.bisect_right(self.columns.ids, position.to_bytes())


class Share:
    """Rows of a page (ascending indices; a ``range`` for all of them) and, for a
    share laid out (:meth:`lay_out`), those rows as columns (:class:`ColumnBlocks`)."""

    __slots__ = ("blocks", "columns", "rows")

    def __init__(self, columns: PageColumns, rows: Sequence[int]) -> None:
        self.columns = columns
        self.rows = rows
        #: The rows as columns, once laid out (never for a page with headers).
        self.blocks: ColumnBlocks | None = None

    def __len__(self) -> int:
        return len(self.rows)

    def lay_out(self) -> None:
        """Lay the rows out as columns, unless the page has headers (its answers are
        encoded the general way)."""
        columns, rows = self.columns, self.rows
        if self.blocks is not None or columns.headers:
            return
        keys = columns.keys
        self.blocks = column_blocks(
            list(map(columns.ids.__getitem__, rows)),
            list(map(columns.payloads.__getitem__, rows)),
            None if keys is None else list(map(keys.__getitem__, rows)),
        )

    def data(self, a: int, b: int) -> int:
        """The payload and key bytes of rows ``a`` to ``b`` (exclusive) of the share."""
        if self.blocks is not None:
            return self.blocks.data(a, b)
        return data_bytes(self.columns, self.rows[a:b])

    def cut(self, a: int, b: int, budget: int) -> int:
        """Where the share's rows from ``a`` end within a byte ``budget``: after the
        row that brings their payloads and keys to it or past, or at ``b``."""
        if self.blocks is not None:
            return self.blocks.cut(a, b, budget)
        running = list(accumulate(row_bytes(self.columns, self.rows[a:b])))
        return min(b, a + bisect.bisect_left(running, budget) + 1)

    @property
    def size(self) -> int:
        """Roughly the bytes it holds beyond the page's."""
        listed = 0 if isinstance(self.rows, range) else 8 * len(self.rows)
        return listed + (self.blocks.size if self.blocks is not None else 0)


class Selection:
    """What a member's scan took: rows ``a`` to ``b`` of a share of each page it
    passed, in the topic's order. Encoded as columns straight from the shares' blocks
    (no step per message), or as messages for a member that asks for another
    medium."""

    __slots__ = ("count", "parts")

    def __init__(self) -> None:
        self.parts: list[tuple[Share, int, int]] = []
        self.count = 0

    def __len__(self) -> int:
        return self.count

    def add(self, share: Share, a: int, b: int) -> None:
        """Rows ``a`` to ``b`` (exclusive) of ``share``, after those taken so far."""
        if b > a:
            self.parts.append((share, a, b))
            self.count += b - a

    def data(self) -> int:
        """The payload and key bytes taken so far."""
        return sum(share.data(a, b) for share, a, b in self.parts)

    def columns(self) -> PageColumns:
        """The rows as the columns of one page."""
        out = PageColumns()
        for share, a, b in self.parts:
            out.extend_rows(share.columns, share.rows[a:b])
        return out

    def messages(self) -> list[Message]:
        """The rows as messages (without write pointers, as a poll answer has none)."""
        return self.columns().messages()

    def encode(self) -> bytes:
        """The columnar poll response of the rows: from the shares' blocks where every
        share was laid out, else the general way."""
        parts = []
        for share, a, b in self.parts:
            if share.blocks is None:
                return self.columns().encode()
            parts.append((share.blocks, a, b))
        return write_blocks(parts)


def data_bytes(columns: PageColumns, rows: Sequence[int]) -> int:
    """The payload and key bytes of ``rows`` of ``columns`` (a run of rows, as a
    ``range``, is summed over list slices)."""
    payloads, keys = columns.payloads, columns.keys
    if isinstance(rows, range) and rows.step == 1:
        total = sum(map(len, payloads[rows.start : rows.stop]))
        if keys is not None:  # None and empty keys alike add nothing
            total += sum(map(len, filter(None, keys[rows.start : rows.stop])))
        return total
    total = sum(map(len, map(payloads.__getitem__, rows)))
    if keys is not None:
        total += sum(map(len, filter(None, map(keys.__getitem__, rows))))
    return total


def row_bytes(columns: PageColumns, rows: Sequence[int]) -> list[int]:
    """The payload and key bytes of each of ``rows``."""
    payloads, keys = columns.payloads, columns.keys
    if keys is None:
        return [len(payloads[i]) for i in rows]
    return [len(payloads[i]) + len(keys[i] or b"") for i in rows]


class Pages:
    """The pages a topic's group members scanned lately. Members of a group read the
    same total order from similar places, so one fetch (and one decode) of a page serves
    them all, and a member polling in small batches decodes each page once. What a
    read-committed page holds between its first and last entry never changes: every
    entry visible there and none that was still open, so a later snapshot sees the same
    (an entry can only be rolled back while its transaction is open). A page that ended
    early (the topic's end, or an open transaction) serves only positions inside it:
    what came after its last entry is fetched fresh."""

    def __init__(self) -> None:
        self._pages: list[Page] = []
        self._lock = threading.Lock()
        #: Held while a page is fetched: a member missing the same page waits for it.
        self.fetching = threading.Lock()

    def find(self, position: MessageId | None) -> Page | None:
        oldest = time.monotonic() - PAGE_LIFETIME
        now_ms = time.time_ns() // 1_000_000
        with self._lock:
            self._pages = [
                p
                for p in self._pages
                if p.fetched >= oldest and (p.stale_at is None or p.stale_at > now_ms)
            ]
            for i, page in enumerate(self._pages):
                if page.covers(position):
                    self._pages.append(self._pages.pop(i))  # most recently used last
                    return page
        return None

    def add(self, page: Page) -> None:
        """Keep ``page``, evicting the least recently used past the bounds. A page
        without messages is not kept: it covers no position (members polling at the
        topic's end fetch one at each poll, and kept, they evicted the pages members
        behind them still read)."""
        if not page.columns.ids:
            return
        with self._lock:
            self._pages.append(page)
            del self._pages[:-_PAGES_KEPT]
            # The least recently used go first, down to the newest one.
            total = sum(p.size for p in self._pages)
            while total > _BYTES_KEPT and len(self._pages) > 1:
                total -= self._pages.pop(0).size
