"""Calls the server makes on its event loop, and how they step aside for a worker.

The coordinators offer ``*_nowait`` variants of their short calls: they run on the
event loop and raise :class:`WouldWait` internally, having changed nothing, where the
call would wait (for the store, or a lock a worker thread holds); the route then runs
the ordinary call on a worker thread.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

__all__ = ["LOOP_LOCK_WAIT", "WouldWait", "holding"]


class WouldWait(Exception):
    """A call for the event loop met something that waits: the store, or a lock a
    worker thread holds for long."""


#: How long the event loop waits for a lock a worker thread holds before it hands the
#: call to a worker itself. Waiting releases the GIL, so the holder runs at once and a
#: short critical section ends well within it; only a store write under the lock (a
#: rebalance, a commit outside a transaction) takes longer.
LOOP_LOCK_WAIT = 0.1


@contextlib.contextmanager
def holding(lock: threading.Lock | threading.RLock, may_wait: bool) -> Iterator[None]:
    """``with lock``; where we may not wait, :class:`WouldWait` if it stays held for
    :data:`LOOP_LOCK_WAIT`."""
    if not lock.acquire(timeout=-1 if may_wait else LOOP_LOCK_WAIT):
        raise WouldWait
    try:
        yield
    finally:
        lock.release()
