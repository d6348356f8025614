"""When a publish may commit on the event loop: while it is the only request at work.

The store's writer thread groups the writes that queue up during a commit's fsync into
the next commit. A write that arrives alone gains nothing from that thread and pays for
it: the event loop wakes the writer, and the writer wakes the loop with the result,
two hand-overs between threads (and cores) on every request of a client that sends
one at a time. :class:`LoneRequest` tells the store
(:meth:`~tidings.store.backend.Store.submit_inline`) when committing on the loop costs
nobody anything: on the loop's own thread, with no other request's task alive except
those parked in a long-poll. Any other request in progress, a commit already
running or queued, or a group of several committed by the writer in the last 50 ms,
and the write goes to the writer as before, so concurrent clients keep their group
commits. A request whose bytes arrive while the loop commits waits
for that commit, at most one fsync.
Justified by BENCHMARKS.md, "A lone write committed where it was made".
"""

from __future__ import annotations

import threading
from collections.abc import Collection

from tidings.server.longpoll import LongPolls

__all__ = ["LoneRequest"]


class LoneRequest:
    """The check for :meth:`~tidings.store.backend.Store.set_inline_check`.

    ``tasks`` is the server's set of request tasks (uvicorn's), ``polls`` the long-polls
    whose waiting requests do not count. Make it on the event loop's thread."""

    __slots__ = ("_polls", "_tasks", "_thread")

    def __init__(self, tasks: Collection[object], polls: LongPolls) -> None:
        self._tasks = tasks
        self._polls = polls
        self._thread = threading.get_ident()

    def __call__(self) -> bool:
        """True when called on the loop's thread by the one request at work."""
        return threading.get_ident() == self._thread and len(self._tasks) - self._polls.parked <= 1
