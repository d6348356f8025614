"""Consuming a topic as an iterator: long-polls that resume after the last id seen.

Read-committed (the default) follows seed 000's transactional consumption: each poll
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

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import Future, ThreadPoolExecutor

from tidings.client.api import READ_COMMITTED, PollPage
from tidings.client.base import StartPosition, resolve_start
from tidings.client.session import AsyncSession, Session
from tidings.errors import ServiceUnavailable
from tidings.structs import Message, MessageId, TopicStats, Transaction

__all__ = ["AsyncConsumer", "Consumer", "ConsumerCursor"]

DEFAULT_BATCH_SIZE = 500
DEFAULT_WAIT = 10.0
DEFAULT_COMMITTED_WAIT = 0.5
#: Loop turns an :class:`AsyncConsumer` gives a read-ahead task before decoding a page:
#: the default transport writes the request in one, aiohttp's needs two (measured; one
#: left it unsent until after).
_SEND_TURNS = 2

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

    def resolve_latest(self, stats: TopicStats) -> None:
        """Start right after the newest entry there is now (or at the oldest, if none)."""
        if stats.newest_id is not None:
            self.start, self.inclusive = stats.newest_id, False
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
        page is full by its headers, so :meth:`advance` will keep the snapshot and move
        just past its last id. None otherwise (short page, no headers)."""
        if page.count is None or page.last_id is None or page.count < self.batch_size:
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

    def advance(self, messages: list[Message]) -> None:
        """Move past a page; a short page means caught up with this snapshot."""
        if messages:
            self.start, self.inclusive = messages[-1].id, False
        if len(messages) < self.batch_size:
            self.snapshot = None
            if not messages and not self.follow:
                self.exhausted = True


class Consumer(Iterator[Message]):
    """Iterates over a topic's messages, polling as needed (see :meth:`Client.consume`)."""

    def __init__(
        self,
        client: Session,
        topic: str,
        start: StartPosition = "earliest",
        *,
        inclusive: bool = True,
        transactional: bool = True,
        batch_size: int = DEFAULT_BATCH_SIZE,
        wait: float = DEFAULT_WAIT,
        committed_wait: float = DEFAULT_COMMITTED_WAIT,
        follow: bool = True,
    ) -> None:
        self._client = client
        self.topic = topic
        self._cursor = ConsumerCursor(
            start,
            inclusive=inclusive,
            transactional=transactional,
            batch_size=batch_size,
            wait=wait,
            committed_wait=committed_wait,
            follow=follow,
            server_snapshots=client.server_snapshots,
        )
        self._buffer: deque[Message] = deque()
        self._position = self._cursor.after
        self._executor: ThreadPoolExecutor | None = None
        self._ahead: tuple[PollKey, Future[PollPage]] | None = None

    @property
    def position(self) -> MessageId | None:
        """The id of the last message this consumer returned (to resume after it)."""
        return self._position

    @property
    def transactional(self) -> bool:
        """True if this consumer reads committed messages only."""
        return self._cursor.transactional

    def poll(self) -> list[Message]:
        """The next page of messages (waiting as configured), instead of iterating."""
        page = list(self._buffer) if self._buffer else self._fetch()
        self._buffer.clear()
        if page:
            self._position = page[-1].id
        return page

    def close(self) -> None:
        """Drop a poll sent ahead, if any, and stop the read-ahead thread."""
        self._ahead = None
        executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=False)

    def _send_page(self, key: PollKey, wait: float) -> PollPage:
        start, inclusive, snapshot, isolation = key
        return self._client.poll_page(
            self.topic,
            start,
            inclusive=inclusive,
            limit=self._cursor.batch_size,
            transaction=snapshot,
            wait=wait,
            isolation=isolation,
        )

    def _taken_ahead(self) -> PollPage | None:
        """The answer of the poll sent ahead, if it is the one to send now."""
        ahead, self._ahead = self._ahead, None
        if ahead is None:
            return None
        key, future = ahead
        try:
            page = future.result()
        except Exception:
            return None  # polled again below, where the error counts
        return page if self._cursor.accepts(key, page) else None

    def _send_ahead(self, key: PollKey) -> None:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="tidings-read-ahead")
        self._ahead = (key, self._executor.submit(self._send_page, key, 0.0))

    def _fetch(self) -> list[Message]:
        cursor = self._cursor
        if cursor.latest_pending:
            cursor.resolve_latest(self._client.stats(self.topic))
        page = self._taken_ahead()
        while page is None:
            if cursor.needs_snapshot:
                cursor.snapshot = self._client.snapshot()
            try:
                page = self._send_page(cursor.key(), cursor.poll_wait())
            except ServiceUnavailable as exc:
                cursor.fall_back(exc)
        key = cursor.ahead_of(page)
        if key is not None:
            self._send_ahead(key)  # before decoding: the server works meanwhile
        messages = page.messages()
        cursor.advance(messages)
        return messages

    def __iter__(self) -> Consumer:
        return self

    def __next__(self) -> Message:
        while not self._buffer:
            if self._cursor.exhausted:
                self.close()
                raise StopIteration
            self._buffer.extend(self._fetch())
        message = self._buffer.popleft()
        self._position = message.id
        return message


class AsyncConsumer(AsyncIterator[Message]):
    """Async iteration over a topic's messages (see :meth:`AsyncClient.consume`)."""

    def __init__(
        self,
        client: AsyncSession,
        topic: str,
        start: StartPosition = "earliest",
        *,
        inclusive: bool = True,
        transactional: bool = True,
        batch_size: int = DEFAULT_BATCH_SIZE,
        wait: float = DEFAULT_WAIT,
        committed_wait: float = DEFAULT_COMMITTED_WAIT,
        follow: bool = True,
    ) -> None:
        self._client = client
        self.topic = topic
        self._cursor = ConsumerCursor(
            start,
            inclusive=inclusive,
            transactional=transactional,
            batch_size=batch_size,
            wait=wait,
            committed_wait=committed_wait,
            follow=follow,
            server_snapshots=client.server_snapshots,
        )
        self._buffer: deque[Message] = deque()
        self._position = self._cursor.after
        self._ahead: tuple[PollKey, asyncio.Task[PollPage]] | None = None

    @property
    def position(self) -> MessageId | None:
        """The id of the last message this consumer returned (to resume after it)."""
        return self._position

    @property
    def transactional(self) -> bool:
        """True if this consumer reads committed messages only."""
        return self._cursor.transactional

    async def poll(self) -> list[Message]:
        """The next page of messages (waiting as configured), instead of iterating."""
        page = list(self._buffer) if self._buffer else await self._fetch()
        self._buffer.clear()
        if page:
            self._position = page[-1].id
        return page

    def close(self) -> None:
        """Cancel a poll sent ahead, if any."""
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            ahead[1].cancel()

    async def _send_page(self, key: PollKey, wait: float) -> PollPage:
        start, inclusive, snapshot, isolation = key
        return await self._client.poll_page(
            self.topic,
            start,
            inclusive=inclusive,
            limit=self._cursor.batch_size,
            transaction=snapshot,
            wait=wait,
            isolation=isolation,
        )

    async def _taken_ahead(self) -> PollPage | None:
        """The answer of the poll sent ahead, if it is the one to send now."""
        ahead, self._ahead = self._ahead, None
        if ahead is None:
            return None
        key, task = ahead
        try:
            page = await task
        except Exception:
            return None  # polled again below, where the error counts
        return page if self._cursor.accepts(key, page) else None

    async def _send_ahead(self, key: PollKey) -> None:
        task = asyncio.ensure_future(self._send_page(key, 0.0))
        task.add_done_callback(_retrieve)
        self._ahead = (key, task)
        # Let the task write its request before decoding holds the loop.
        for _ in range(_SEND_TURNS):
            await asyncio.sleep(0)

    async def _fetch(self) -> list[Message]:
        cursor = self._cursor
        if cursor.latest_pending:
            cursor.resolve_latest(await self._client.stats(self.topic))
        page = await self._taken_ahead()
        while page is None:
            if cursor.needs_snapshot:
                cursor.snapshot = await self._client.snapshot()
            try:
                page = await self._send_page(cursor.key(), cursor.poll_wait())
            except ServiceUnavailable as exc:
                cursor.fall_back(exc)
        key = cursor.ahead_of(page)
        if key is not None:
            await self._send_ahead(key)  # before decoding: the server works meanwhile
        messages = page.messages()
        cursor.advance(messages)
        return messages

    def __aiter__(self) -> AsyncConsumer:
        return self

    async def __anext__(self) -> Message:
        while not self._buffer:
            if self._cursor.exhausted:
                self.close()
                raise StopAsyncIteration
            self._buffer.extend(await self._fetch())
        message = self._buffer.popleft()
        self._position = message.id
        return message


def _retrieve(task: asyncio.Task[PollPage]) -> None:
    """Mark a read-ahead's failure as seen: the consumer polls again and sees it then."""
    if not task.cancelled():
        with contextlib.suppress(Exception):
            task.exception()
