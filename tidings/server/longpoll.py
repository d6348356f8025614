"""Long-poll: park a poll until its topic gets a durable write, with no busy loop.

The messaging core calls :meth:`LongPolls.on_commit` from the store's writer thread
after a publish, store or rollback is durable. Only when some poll is parked on that
topic does it cross to the event loop (through the :class:`~tidings.server.inbox.LoopInbox`,
which the same commit's publish answers share: one loop wake-up per commit, however
many polls wait), so publishing to topics nobody waits on costs one dict lookup.

A poll parks (:meth:`LongPolls.park`) *before* each fetch, so no commit can slip
between the fetch and the wait: either the fetch sees the data, or the commit finds
the parked poll.

Read-committed polls (``?isolation=read_committed``) also wait on the transaction
service: the manager calls :meth:`LongPolls.on_transaction` after every durable end of
a transaction (commit, abort, invalidation, timeout), which wakes every such poll to
fetch again with a fresh snapshot. Wake-ups are coalesced: one hop to the loop per
burst of transaction ends, and none while no read-committed poll waits.

Each parked poll has a future of its own, which the wake-up resolves directly, so the
poll's task runs in the loop turn right after the wake-up, ahead of the publishers the
same commit answers (the inbox runs the wake-up first): the consumer's response is
written before the publisher's. Awaiting shared futures through ``asyncio.wait`` took
two more loop turns, so the publish answer went out first and a consumer in the same
client process handled it before its message. With this, and a waiting poll that parks
before its first fetch instead of fetching twice, the W3 benchmark's median latency
(``benchmarks/workloads.py``) went from about 1.3 to 1.0 ms.
"""

from __future__ import annotations

import asyncio

from tidings.server.inbox import LoopInbox

__all__ = ["LongPolls"]

_Key = tuple[str, str]


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class LongPolls:
    """The futures of the polls parked on each topic and on the transaction service."""

    def __init__(self) -> None:
        self._inbox: LoopInbox | None = None
        # Insertion-ordered, so that polls are woken in the order they parked. A topic's
        # entry exists only while some poll is parked on it (on_commit relies on that).
        self._waiting: dict[_Key, dict[asyncio.Future[None], None]] = {}
        self._tx_waiting: dict[asyncio.Future[None], None] = {}
        self._tx_wake_pending = False
        self._closed = False
        self._parked = 0

    def bind(self, inbox: LoopInbox) -> None:
        """Attach to the event loop that serves requests, through its inbox (before
        any poll waits)."""
        self._inbox = inbox

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def parked(self) -> int:
        """How many requests are waiting in :meth:`wait` now (their tasks are idle)."""
        return self._parked

    def on_commit(self, namespace: str, topic: str) -> None:
        """Listener for the messaging core; safe to call from any thread."""
        key = (namespace, topic)
        # A racy read is fine: a poll parked after this check fetches after the
        # commit, so it sees the data without being woken.
        if key in self._waiting and self._inbox is not None and not self._closed:
            self._inbox.post(self._wake, key)

    def on_transaction(self) -> None:
        """Listener for the transaction manager; safe to call from any thread."""
        # Racy reads are fine for the same reason as in on_commit: a poll parked later
        # takes its snapshot after this change. A wake already scheduled but not yet run
        # covers this change too, as the polls it wakes take their snapshots after it.
        if not self._tx_waiting or self._tx_wake_pending or self._closed:
            return
        if self._inbox is not None:
            self._tx_wake_pending = True
            self._inbox.post(self._wake_transactions)

    def park(
        self, namespace: str, topic: str, *, transactions: bool = False
    ) -> asyncio.Future[None]:
        """Register a poll before it fetches (loop thread): the future resolves at the
        next durable write on the topic and, with ``transactions``, also at the next
        durable end of a transaction. Await it with :meth:`wait`, or :meth:`unpark` it."""
        assert self._inbox is not None, "LongPolls.bind() was not called"
        future = self._inbox.loop.create_future()
        if self._closed:
            future.set_result(None)
            return future
        key = (namespace, topic)
        waiting = self._waiting.get(key)
        if waiting is None:
            waiting = self._waiting[key] = {}
        waiting[future] = None
        if transactions:
            self._tx_waiting[future] = None
        return future

    def unpark(self, future: asyncio.Future[None], namespace: str, topic: str) -> None:
        """Forget a parked poll (loop thread); harmless if it was woken already."""
        key = (namespace, topic)
        waiting = self._waiting.get(key)
        if waiting is not None:
            waiting.pop(future, None)
            if not waiting:
                del self._waiting[key]
        self._tx_waiting.pop(future, None)

    async def wait(self, future: asyncio.Future[None], timeout: float) -> None:
        """Until the parked ``future`` resolves or ``timeout`` seconds pass."""
        if future.done() or timeout <= 0:
            return
        timer = future.get_loop().call_later(timeout, _resolve, future)
        self._parked += 1
        try:
            await future
        finally:
            self._parked -= 1
            timer.cancel()

    def _wake(self, key: _Key) -> None:
        for future in self._waiting.pop(key, ()):
            _resolve(future)

    def _wake_transactions(self) -> None:
        self._tx_wake_pending = False
        waiting, self._tx_waiting = self._tx_waiting, {}
        for future in waiting:
            _resolve(future)

    def close(self) -> None:
        """Release every parked poll now and from now on (shutdown). Loop thread only."""
        self._closed = True
        for key in list(self._waiting):
            self._wake(key)
        self._wake_transactions()
