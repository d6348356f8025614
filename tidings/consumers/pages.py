"""The pages group members scan, fetched and decoded once for all of them.

Members of a topic's groups read the same total order from similar places; a page of
read-committed messages, with each message's partition hash and, per partition count,
the indices of each partition's messages, serves every member that scans through it.
"""

from __future__ import annotations

import bisect
import threading
import time
from dataclasses import dataclass, field

from tidings.codec.avro import item_id
from tidings.codec.groups import item_hash
from tidings.structs import Message, MessageId

__all__ = ["Page", "Pages"]

#: Most pages kept per topic for the members' scans, and most bytes they may hold
#: (items, or payloads and keys, plus an allowance per message for its objects). Members of a
#: group drift apart while they read (each reads every page, at its own pace), so
#: pages are kept for the spread between the first and the last: 8 were too few for 4
#: members over 20 pages (each page was fetched and decoded about 3 times).
_PAGES_KEPT = 64
_BYTES_KEPT = 64 << 20
#: Memory per message beyond its bytes: an item is one bytes object (33 bytes of
#: header) and its list slot; a Message is two tuples, an int or two and its bytes
#: objects. Counting 200 per item made a page of 10,000 keyed 100-byte items look
#: twice its size, and 4 members over 30 such pages (the bound reached at ~20) fetched
#: and indexed each page about 3 times: 123k against 279k msg/s in one benchmark run.
_ITEM_OVERHEAD = 41
_MESSAGE_OVERHEAD = 200
#: Seconds a page serves: it may hold messages whose TTL passes meanwhile, which a fresh
#: fetch would skip, so it is not kept much longer than members take to pass through.
PAGE_LIFETIME = 10.0


@dataclass(slots=True)
class Page:
    """Read-committed messages after ``start`` (exclusive; None: from the oldest): each
    as its item of an extended Avro poll response where the messaging core wrote one
    straight from the stored row (else a :class:`Message`). A message's id and the hash
    its partition is taken from (``hash % P``) are read from its item when asked for.

    Items, not messages: a member's answer is then the join of its share, where
    decoding every stored row into a message and encoding each member's share again
    took two thirds of the server's time under four members (BENCHMARKS.md, "Group
    pages of poll items"). Ids and hashes on demand: a member alone needs neither but
    for a few bisections, and the hashes are taken once per page for all members."""

    start: MessageId | None
    items: list[Message | bytes]
    full: bool
    #: Per partition count: the indices of each partition's messages.
    indexes: dict[int, dict[int, list[int]]] = field(default_factory=dict)
    #: When it was fetched (monotonic seconds).
    fetched: float = field(default_factory=time.monotonic)
    #: Roughly what it holds in memory (bytes), for the bound on the kept pages.
    size: int = 0
    _hashes: list[int] | None = None
    #: Held while the hashes and an index are made: members reach a new page together,
    #: and each making them at once cost four times the work under four members.
    _making: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        if not self.size:
            self.size = sum(
                len(item) + _ITEM_OVERHEAD if type(item) is bytes else _message_size(item)
                for item in self.items
            )

    @property
    def last(self) -> MessageId | None:
        return self.id_at(-1) if self.items else self.start

    def covers(self, position: MessageId | None) -> bool:
        """True if the messages after ``position`` start inside this page."""
        if position is None or self.start is None:
            return position is None and self.start is None
        last = self.last
        return self.start <= position and last is not None and position < last

    def id_at(self, index: int) -> MessageId:
        """The id of the message at ``index``."""
        return item_id(self.items[index])

    @property
    def hashes(self) -> list[int]:
        """Each message's partition hash (:func:`~tidings.codec.groups.key_hash`)."""
        hashes = self._hashes
        if hashes is None:
            with self._making:
                hashes = self._hashes
                if hashes is None:
                    hashes = self._hashes = [item_hash(item) for item in self.items]
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
        return bisect.bisect_right(self.items, position, key=item_id)


def _message_size(message: Message | bytes) -> int:
    assert isinstance(message, Message)
    return len(message.payload) + len(message.key or b"") + _MESSAGE_OVERHEAD


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
        with self._lock:
            self._pages.append(page)
            del self._pages[:-_PAGES_KEPT]
            # The least recently used go first, down to the newest one.
            total = sum(p.size for p in self._pages)
            while total > _BYTES_KEPT and len(self._pages) > 1:
                total -= self._pages.pop(0).size
