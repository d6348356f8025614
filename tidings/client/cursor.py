"""Where a consumer stands and what it polls next: the I/O-free half of consuming.

Consumers (:class:`~tidings.Consumer`, :class:`~tidings.AsyncConsumer`) iterate over a
topic with long-polls that resume after the last id seen; every decision is here.

Read-committed (the default) follows CDAP TMS's transactional consumption: each poll
carries a transaction snapshot, the server returns only entries visible in it and stops
at the first entry of a transaction still in progress, so committed messages come in
one order, and never one of an aborted or unfinished transaction. The snapshot is a
read-only one (:func:`~tidings.client.base.read_only_snapshot`): one read of the
service's state instead of begin + abort, and it is reused while pages come back full
(catching up), since an older snapshot only ever shows less, never something wrong.

By default the server takes the snapshots (``?isolation=read_committed``, docs/api.md):
a fresh one at every fetch, and a long poll also wakes when a transaction commits, so
one request per page and the whole ``wait``. That needs the transaction service in the
messaging server's process, and the client's transactions addressed there; otherwise
(a 503, or a separate ``transactions_url``) the consumer takes the snapshots itself:
one read of the service's state per page, and since a long poll holding a snapshot
wakes for new non-transactional messages but cannot see a transaction that commits
while it waits, such polls wait at most ``committed_wait`` seconds before taking a fresh
snapshot, which bounds the latency of transactional messages. Read-uncommitted polls
wait the whole ``wait``.

Reading ahead: a poll response says how many messages it holds and the id of the last
(``Tidings-Count``, ``Tidings-Last-Id``, docs/api.md). When a page is full, the
consumer sends the poll for the next one (after that id, exclusive, with the same
snapshot or isolation) as soon as the page arrives, then decodes the page, so the
server fetches and encodes page N+1 while the client decodes page N. At most one such
poll is in flight (a worker thread for :class:`Consumer`, a task for
:class:`AsyncConsumer`), and it waits for nothing on the server (``waitMs`` 0). Its
answer is used only if it is exactly the poll the consumer would send next; otherwise
(a page shorter than its header said, a failure, an empty answer while following) it
is dropped and the consumer polls as it would have anyway, so order, exactly-once
delivery and read-committed semantics are those of one poll after another. A short
page, the end of the topic or a server that sends no such headers means no read-ahead.
"""

from __future__ import annotations

from tidings.client.api import READ_COMMITTED, PollPage
from tidings.client.base import StartPosition, resolve_start
from tidings.errors import ServiceUnavailable
from tidings.structs import Message, MessageId, TopicEnd, Transaction

__all__ = [
    "DEFAULT_BATCH_SIZE",
    "DEFAULT_COMMITTED_WAIT",
    "DEFAULT_WAIT",
    "ConsumerCursor",
    "PollKey",
]

DEFAULT_BATCH_SIZE = 500
DEFAULT_WAIT = 10.0
DEFAULT_COMMITTED_WAIT = 0.5
#: What a poll asks for besides topic, limit and wait: start, inclusive, the snapshot
#: (compared by identity) and the isolation parameter.
PollKey = tuple[MessageId | int | None, bool, Transaction | None, str | None]


class ConsumerCursor:
    """Where a consumer stands and what its next poll asks for (no I/O)."""

    def __init__(
        self,
        start: StartPosition,
        *,
        inclusive: bool = True,
        transactional: bool,
        batch_size: int,
        wait: float,
        committed_wait: float,
        follow: bool,
        server_snapshots: bool = False,
    ) -> None:
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        if wait < 0 or committed_wait < 0:
            raise ValueError("waits must not be negative")
        resolved = resolve_start(start)
        self.latest_pending = resolved == "latest"
        self.start: MessageId | int | None = None if resolved == "latest" else resolved
        self.inclusive = inclusive
        self.transactional = transactional
        self.batch_size = batch_size
        self.wait = wait
        self.committed_wait = committed_wait
        self.follow = follow
        self.snapshot: Transaction | None = None
        self.exhausted = False
        #: Read-committed by the server's own snapshots (until it answers 503).
        self.server_snapshots = transactional and server_snapshots

    @property
    def after(self) -> MessageId | None:
        """The id the next poll starts after, if it starts after an id."""
        return self.start if isinstance(self.start, MessageId) and not self.inclusive else None

    def resolve_latest(self, end: TopicEnd) -> None:
        """Start at "latest": after the newest entry there is now (or at the oldest, if
        none) -- for a read-committed consumer at the last stable position instead, if
        a transaction is open, so that it misses none that commits later (Kafka
        starts read_committed consumers at the LSO)."""
        if self.transactional and end.last_stable_id is not None:
            self.start, self.inclusive = end.last_stable_id, True
        elif end.newest_id is not None:
            self.start, self.inclusive = end.newest_id, False
        self.latest_pending = False

    def needs_stable_scan(self, end: TopicEnd, snapshot: Transaction | None) -> bool:
        """Whether "latest" must be found by reading the topic's ids: a read-committed
        consumer whose server cannot tell the last stable position (no transaction
        service in its process), while a transaction is in progress in ``snapshot``
        (taken after ``end``: any entry up to ``end.newest_id`` of a transaction still
        open belongs to one of those). Without one, after the newest entry is right."""
        return (
            self.transactional
            and not end.stable_known
            and end.newest_id is not None
            and snapshot is not None
            and bool(snapshot.in_progress)
        )

    def resolve_latest_after(self, stable: MessageId | None) -> None:
        """Start at "latest" found by reading ids with a snapshot from the oldest, a
        read that stopped before the newest entry, at an entry of a transaction still
        open: right after ``stable``, the last id it returned (None: none, so at the
        oldest). So the consumer misses none of that transaction's messages when it
        commits."""
        if stable is None:
            self.start, self.inclusive = None, True
        else:
            self.start, self.inclusive = stable, False
        self.latest_pending = False

    @property
    def needs_snapshot(self) -> bool:
        """True if the next poll needs a fresh read-committed snapshot from the client."""
        return self.transactional and not self.server_snapshots and self.snapshot is None

    @property
    def isolation(self) -> str | None:
        """The poll's ``isolation`` parameter (None: none sent)."""
        return READ_COMMITTED if self.server_snapshots else None

    def fall_back(self, error: ServiceUnavailable) -> None:
        """The server cannot take snapshots: take them client-side from now on."""
        if not self.server_snapshots:
            raise error
        self.server_snapshots = False

    def poll_wait(self) -> float:
        """How long the next poll may wait on the server."""
        if not self.follow:
            return 0.0
        if self.transactional and not self.server_snapshots:
            return min(self.wait, self.committed_wait)
        return self.wait

    def key(self) -> PollKey:
        """What the next poll asks for (after :meth:`advance`)."""
        return (self.start, self.inclusive, self.snapshot, self.isolation)

    def ahead_of(self, page: PollPage) -> PollKey | None:
        """The poll that follows ``page`` if it is worth sending before decoding it: the
        page is full by its headers (``batch_size`` messages, or its byte bound
        reached), so :meth:`advance` will keep the snapshot and move just past its last
        id. None otherwise (short page, no headers)."""
        if page.count is None or page.last_id is None:
            return None
        if page.count < self.batch_size and not page.more:
            return None
        return (page.last_id, False, self.snapshot, self.isolation)

    def accepts(self, key: PollKey, page: PollPage | None) -> bool:
        """True if a poll sent ahead as ``key`` answered what the next poll would."""
        if page is None or self.latest_pending or self.needs_snapshot:
            return False
        start, inclusive, snapshot, isolation = self.key()
        if not (
            key[0] == start and key[1] == inclusive and key[2] is snapshot and key[3] == isolation
        ):
            return False
        # Sent without waiting: an empty answer stands for the poll only if that one
        # would not have waited either.
        return not self.follow or (page.count is not None and page.count > 0)

    def advance(self, messages: list[Message], more: bool = False) -> None:
        """Move past a page; a short page means caught up with this snapshot, unless
        it reached its byte bound (``more``)."""
        self.advance_past(len(messages), messages[-1].id if messages else None, more)

    def advance_past(self, count: int, last: MessageId | None, more: bool = False) -> None:
        """Move past a page of ``count`` messages ending at ``last``."""
        if count and last is not None:
            self.start, self.inclusive = last, False
        if count < self.batch_size and not more:
            self.snapshot = None
            if not count and not self.follow:
                self.exhausted = True
