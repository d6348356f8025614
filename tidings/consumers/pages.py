"""The pages group members scan, fetched once for all of them.

Members of a topic's groups read the same total order from similar places; a page of
read-committed messages, with each message's partition hash and, per partition count,
the indices of each partition's messages, serves every member that scans through it.
"""

from __future__ import annotations

import bisect
import threading
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field

from tidings.messaging.fetching import PageColumns
from tidings.structs import MessageId

__all__ = ["Page", "Pages", "data_bytes", "row_bytes"]

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
#: fetch would skip, so it is not kept much longer than members take to pass through.
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
    #: Roughly what it holds in memory (bytes), for the bound on the kept pages.
    size: int = 0
    #: Its messages' payload and key bytes (what a member's byte bound counts).
    data: int = 0
    _hashes: list[int] | None = None
    #: Held while the hashes and an index are made: members reach a new page together,
    #: and each making them at once cost four times the work under four members.
    _making: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        columns = self.columns
        if not self.data:
            self.data = data_bytes(columns, range(len(columns.ids)))
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
                    index = {}
                    for i, h in enumerate(hashes):
                        index.setdefault(h % partitions, []).append(i)
                    self.indexes[partitions] = index
        return index

    def after(self, position: MessageId | None) -> int:
        """The index of the first message after ``position``."""
        if position is None or position == self.start:
            return 0
        # The 20-byte form sorts as the ids do.
        return bisect.bisect_right(self.columns.ids, position.to_bytes())


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
        with self._lock:
            self._pages = [p for p in self._pages if p.fetched >= oldest]
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
