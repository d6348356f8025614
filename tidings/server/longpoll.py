"""Long-poll: park a poll until its topic gets a durable write, with no busy loop.

The messaging core calls :meth:`LongPolls.on_commit` from the store's writer thread
after a publish, store or rollback is durable. Only when some poll is parked on that
topic does it cross to the event loop (``call_soon_threadsafe``, one wake-up per commit
per topic, however many polls wait), so publishing to topics nobody waits on costs one
dict lookup.

A waiter registers *before* it fetches again, so no commit can slip between the
fetch and the wait: either the fetch sees the data, or the commit finds the waiter.

Read-committed polls (``?isolation=read_committed``) also wait on the transaction
service: the manager calls :meth:`LongPolls.on_transaction` after every durable end of
a transaction (commit, abort, invalidation, timeout), which wakes every such poll to
fetch again with a fresh snapshot. Wake-ups are coalesced: one hop to the loop per
burst of transaction ends, and none while no read-committed poll waits.
"""

from __future__ import annotations

import asyncio
import contextlib

__all__ = ["LongPolls"]

_Key = tuple[str, str]


class LongPolls:
    """Per-topic wake-up futures shared by every poll parked on the topic."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiting: dict[_Key, asyncio.Future[None]] = {}
        self._tx_waiting: asyncio.Future[None] | None = None
        self._tx_wake_pending = False
        self._closed = False

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """Attach to the event loop that serves requests (before any poll waits)."""
        self._loop = loop

    @property
    def closed(self) -> bool:
        return self._closed

    def on_commit(self, namespace: str, topic: str) -> None:
        """Listener for the messaging core; safe to call from any thread."""
        key = (namespace, topic)
        # A racy read is fine: a waiter added after this check fetches after the
        # commit, so it sees the data without being woken.
        if key in self._waiting and self._loop is not None and not self._closed:
            # The loop may have closed meanwhile (shutdown): nobody waits any more.
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._wake, key)

    def on_transaction(self) -> None:
        """Listener for the transaction manager; safe to call from any thread."""
        # Racy reads are fine for the same reason as in on_commit: a waiter added later
        # takes its snapshot after this change. A wake already scheduled but not yet run
        # covers this change too, as the polls it wakes take their snapshots after it.
        if self._tx_waiting is None or self._tx_wake_pending or self._closed:
            return
        loop = self._loop
        if loop is not None:
            self._tx_wake_pending = True
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._wake_transactions)

    def waiter(self, namespace: str, topic: str) -> asyncio.Future[None]:
        """The future the next commit on the topic resolves (on the loop thread)."""
        assert self._loop is not None, "LongPolls.bind() was not called"
        if self._closed:
            future = self._loop.create_future()
            future.set_result(None)
            return future
        key = (namespace, topic)
        waiting = self._waiting.get(key)
        if waiting is None or waiting.done():
            waiting = self._waiting[key] = self._loop.create_future()
        return waiting

    def transaction_waiter(self) -> asyncio.Future[None]:
        """The future the next durable end of a transaction resolves (loop thread)."""
        assert self._loop is not None, "LongPolls.bind() was not called"
        waiting = self._tx_waiting
        if waiting is None or waiting.done():
            waiting = self._tx_waiting = self._loop.create_future()
            if self._closed:
                waiting.set_result(None)
        return waiting

    async def wait(
        self,
        future: asyncio.Future[None],
        timeout: float,
        also: asyncio.Future[None] | None = None,
    ) -> None:
        """Until ``future`` (or ``also``) resolves or ``timeout`` seconds pass."""
        if timeout <= 0 or future.done() or (also is not None and also.done()):
            return
        # asyncio.wait neither cancels nor wraps the shared futures.
        futures = (future,) if also is None else (future, also)
        await asyncio.wait(futures, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)

    def _wake(self, key: _Key) -> None:
        future = self._waiting.pop(key, None)
        if future is not None and not future.done():
            future.set_result(None)

    def _wake_transactions(self) -> None:
        self._tx_wake_pending = False
        future, self._tx_waiting = self._tx_waiting, None
        if future is not None and not future.done():
            future.set_result(None)

    def close(self) -> None:
        """Release every parked poll now and from now on (shutdown). Loop thread only."""
        self._closed = True
        for key in list(self._waiting):
            self._wake(key)
        self._wake_transactions()
