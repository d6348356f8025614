"""Hand results from other threads to the event loop, one loop wake-up per burst.

The store's writer thread ends each commit by waking long-polls and resolving every
publish of its group. ``call_soon_threadsafe`` per item writes to the loop's wake-up
descriptor each time; on this project's machines that write costs ~20 us (it wakes the
loop on the other core), and the writer makes it holding the GIL, on the way from
commit to answer. :class:`LoopInbox` queues the items instead and wakes the loop only
if no drain is pending yet: one wake-up per commit, however many publishes and
long-polls it ends, and the items run in the order they were posted (the long-poll
wake-up first, so consumers are answered before the publishers).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

__all__ = ["LoopInbox"]

T = TypeVar("T")

log = logging.getLogger("tidings.server")


class LoopInbox:
    """Runs callables posted from any thread on one event loop, in posting order."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._items: collections.deque[tuple[Callable[..., object], tuple[Any, ...]]] = (
            collections.deque()
        )
        self._scheduled = False
        self._loop_thread: int | None = None  # learnt at the first drain

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def post(self, fn: Callable[..., object], *args: Any) -> None:
        """Run ``fn(*args)`` on the loop soon; safe to call from any thread.

        Does nothing once the loop is closed (shutdown: nobody waits any more).
        """
        self._items.append((fn, args))
        # Racy but safe: the flag is cleared before the drain takes items, so an item
        # appended while it is set is taken by that pending drain, and one appended
        # after it is cleared schedules a drain of its own (at worst an empty one).
        if self._scheduled:
            return
        self._scheduled = True
        if threading.get_ident() == self._loop_thread:
            # Posted on the loop itself (a write committed there): no wake-up to write.
            self._loop.call_soon(self._drain)
            return
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self._drain)

    def _drain(self) -> None:
        self._loop_thread = threading.get_ident()
        self._scheduled = False
        items = self._items
        while items:
            fn, args = items.popleft()
            try:
                fn(*args)
            except Exception:
                # One failing item must not strand the ones queued behind it.
                log.exception("inbox item %r failed", fn)

    async def wait(self, future: Future[T]) -> T:
        """Await a ``concurrent.futures.Future`` resolved on another thread.

        ``asyncio.wrap_future``, except that the result reaches the loop through this
        inbox. Cancelling the caller cancels ``future`` too (if it has not started).
        """
        waiter: asyncio.Future[T] = self._loop.create_future()

        def done(source: Future[T]) -> None:
            self.post(_copy_state, source, waiter)

        future.add_done_callback(done)
        try:
            return await waiter
        except asyncio.CancelledError:
            future.cancel()
            raise


def _copy_state(source: Future[T], target: asyncio.Future[T]) -> None:
    if target.done():  # the awaiting task was cancelled meanwhile
        return
    if source.cancelled():
        target.cancel()
        return
    exc = source.exception()
    if exc is not None:
        target.set_exception(exc)
    else:
        target.set_result(source.result())
