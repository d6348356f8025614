"""Long-poll: park a poll until its topic gets a durable write, with no busy loop.

The messaging core calls :meth:`LongPolls.on_commit` from the store's writer thread
after a publish, store or rollback is durable. Only when some poll is parked on that
topic does it cross to the event loop (``call_soon_threadsafe``, one wake-up per commit
per topic, however many polls wait), so publishing to topics nobody waits on costs one
dict lookup.

A waiter registers *before* it fetches again, so no commit can slip between the
fetch and the wait: either the fetch sees the data, or the commit finds the waiter.
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

    async def wait(self, future: asyncio.Future[None], timeout: float) -> None:
        """Until ``future`` resolves or ``timeout`` seconds pass, whichever is first."""
        if timeout > 0 and not future.done():
            # asyncio.wait neither cancels nor wraps the shared future.
            await asyncio.wait((future,), timeout=timeout)

    def _wake(self, key: _Key) -> None:
        future = self._waiting.pop(key, None)
        if future is not None and not future.done():
            future.set_result(None)

    def close(self) -> None:
        """Release every parked poll now and from now on (shutdown). Loop thread only."""
        self._closed = True
        for key in list(self._waiting):
            self._wake(key)
