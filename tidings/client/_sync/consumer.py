# Generated from tidings/client/_async/consumer.py by scripts/unasync.py; do not edit.

"""Consuming a topic as an iterator; every decision is :mod:`tidings.client.cursor`'s.

At most one poll is sent ahead of the page being decoded (a task; for the sync
consumer, a request whose answer it reads itself after decoding, or a worker thread
with a transport that cannot split a request so); see the cursor's module for when
and why.
"""

from __future__ import annotations

from collections.abc import Iterator

from tidings.client._sync.concurrency import Pending, Worker, sleep, yield_turns
from tidings.client._sync.session import Session
from tidings.client.api import PollPage, check_max_bytes
from tidings.client.base import StartPosition, encoded_transaction
from tidings.client.cursor import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_COMMITTED_WAIT,
    DEFAULT_WAIT,
    ConsumerCursor,
    PollKey,
)
from tidings.client.outage import Outage
from tidings.errors import RoleUnavailable, TidingsError
from tidings.structs import Message, MessageId

__all__ = ["Consumer"]

#: Ids per poll of the read that finds "latest" where the server cannot tell it.
_STABLE_SCAN = 10_000


class Consumer(Iterator[Message]):
    """Iterates over a topic's messages, polling as needed (see
    :meth:`Client.consume`)."""

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
        max_bytes: int | None = None,
    ) -> None:
        self._client = client
        self._max_bytes = check_max_bytes(max_bytes)
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
        # The current page's messages not returned yet, made as they are taken.
        self._rest: Iterator[Message] = iter(())
        self._position = self._cursor.after  # until a message is returned
        # The last message returned: kept whole, not its id, since the loop over a
        # page then stores one reference per message (~12 ns less than ``.id``).
        self._last: Message | None = None
        self._worker = Worker("tidings-read-ahead")
        self._ahead: tuple[PollKey, Pending[PollPage]] | None = None

    @property
    def position(self) -> MessageId | None:
        """The id of the last message this consumer returned (to resume after it)."""
        return self._position if self._last is None else self._last.id

    @property
    def transactional(self) -> bool:
        """True if this consumer reads committed messages only."""
        return self._cursor.transactional

    def poll(self) -> list[Message]:
        """The next page of messages (waiting as configured), instead of iterating."""
        page = list(self._rest)
        if not page:
            page = self._fetch()
        if page:
            self._last = page[-1]
        return page

    def close(self) -> None:
        """Drop a poll sent ahead, if any, and stop the read-ahead."""
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            ahead[1].cancel()
        self._worker.close()

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
            max_bytes=self._max_bytes,
        )

    def _taken_ahead(self) -> PollPage | None:
        """The answer of the poll sent ahead, if it is the one to send now."""
        ahead, self._ahead = self._ahead, None
        if ahead is None:
            return None
        key, pending = ahead
        try:
            page = pending.result()
        except Exception:
            return None  # polled again below, where the error counts
        return page if self._cursor.accepts(key, page) else None

    def _send_ahead(self, key: PollKey) -> None:
        start, inclusive, snapshot, isolation = key
        call = self._client._api.poll_page(
            self.topic,
            start,
            inclusive=inclusive,
            limit=self._cursor.batch_size,
            transaction=encoded_transaction(snapshot),
            wait=0.0,
            isolation=isolation,
            max_bytes=self._max_bytes,
        )
        self._ahead = (key, self._client._begin(self._worker, call))
        # Let the request go out before decoding holds the loop.
        yield_turns()

    def _fetch(self) -> list[Message]:
        page = self._next_page()
        messages = page.messages()
        self._cursor.advance(messages, page.more)
        return messages

    def _fetch_rows(self) -> Iterator[Message]:
        page = self._next_page()
        rows = page.iterate()
        self._cursor.advance_past(rows.count, rows.last, page.more)
        return rows.messages

    def _next_page(self) -> PollPage:
        """The next page, read ahead or polled now; the poll after it sent ahead."""
        cursor = self._cursor
        page = self._taken_ahead()
        outage: Outage | None = None
        while page is None:
            try:
                if cursor.latest_pending:
                    # Where "latest" is, outlasting an outage as the polls do.
                    self._resolve_latest()
                if cursor.needs_snapshot:
                    cursor.snapshot = self._client.snapshot()
                page = self._send_page(cursor.key(), cursor.poll_wait())
            except RoleUnavailable as exc:
                # This process takes no snapshots (its role): an answer, not an outage.
                # Any other 503 (a store out of reach, a cluster between leaders) is
                # waited out below like a lost connection.
                cursor.fall_back(exc)
            except TidingsError as exc:
                if outage is None:
                    outage = Outage(f"consumer of topic {self.topic!r}")
                self._wait_out(exc, outage)
        if outage is not None:
            outage.ended()
        key = cursor.ahead_of(page)
        if key is not None:
            self._send_ahead(key)  # before decoding: the server works meanwhile
        return page

    def _resolve_latest(self) -> None:
        """Where "latest" is: the server's end of the topic, or, for a read-committed
        consumer whose server cannot tell the last stable position while a transaction
        is in progress, the ids read with a snapshot from the oldest up to where such a
        read stops (before that transaction's first entry) or reaches the newest."""
        cursor = self._cursor
        end = self._client.end(self.topic)
        newest = end.newest_id
        snapshot = None
        if cursor.transactional and not end.stable_known and newest is not None:
            snapshot = self._client.snapshot()  # after the end: see the cursor
        if newest is None or not cursor.needs_stable_scan(end, snapshot):
            cursor.resolve_latest(end)
            return
        encoded = encoded_transaction(snapshot)
        start: MessageId | None = None
        stable: MessageId | None = None
        while True:
            ids = self._client._send(
                self._client._api.poll_ids(
                    self.topic,
                    start,
                    inclusive=start is None,
                    limit=_STABLE_SCAN,
                    transaction=encoded,
                    wait=0.0,
                )
            )
            if not ids:
                break
            if ids[-1] >= newest:
                cursor.resolve_latest(end)  # stable through the newest entry
                return
            stable = start = ids[-1]
        cursor.resolve_latest_after(stable)

    def _wait_out(self, error: TidingsError, outage: Outage) -> None:
        """A follower outlives a server restart: on a retriable error it waits (0.1 s,
        doubling to 5 s; logged, see :mod:`tidings.client.outage`) and polls again from
        its position; anything else is raised."""
        if not (self._cursor.follow and error.retriable):
            raise error
        self._cursor.snapshot = None  # a fresh one after the outage
        sleep(outage.failed(error))

    def __iter__(self) -> Iterator[Message]:
        # A generator over the pages: a loop over the consumer takes each message
        # without a call of ``__next__``, ~50 ns less per message (~8 % of a 100 B
        # message's decoding). ``__next__`` takes from the same page, so the two mix.
        # The async consumer stays its own iterator: an async generator measured slower.
        return self._messages()

    def _messages(self) -> Iterator[Message]:
        while True:
            for message in self._rest:
                self._last = message
                yield message
            if self._cursor.exhausted:
                self.close()
                return
            self._rest = self._fetch_rows()

    def __next__(self) -> Message:
        message = next(self._rest, None)
        while message is None:
            if self._cursor.exhausted:
                self.close()
                raise StopIteration
            self._rest = self._fetch_rows()
            message = next(self._rest, None)
        self._last = message
        return message
