"""The batching publisher: a bounded buffer drained by a background batching sender.

After CDAP TMS: publishing can be asynchronous, with retries, and a
message whose sending keeps failing is dropped. Each ``send`` returns a future at once;
a sender (a thread for the sync publisher, a task for the async one) takes
batches from the buffer, one topic at a time, and publishes each with one request.

- **Batching**: a batch is up to ``max_batch_messages`` / ``max_batch_bytes`` of one
  topic's messages, sent when full, when its oldest message has waited ``linger``
  seconds, or on :meth:`flush` / :meth:`close`. With ``linger=0`` (the default) a batch
  goes as soon as the sender is free, with what was sent meanwhile: adaptive batching.
- **Bounded buffer**: at most ``buffer_messages`` / ``buffer_bytes`` wait unsent;
  ``send`` blocks while it is full (up to its ``timeout``, then
  :class:`~tidings.errors.RequestTimeout`).
- **Futures**: a message's future resolves (to None) once its batch is durable.
- **Retries**: a batch that fails with a retriable error (cannot connect, no answer,
  5xx) is resent after a backoff, up to ``retry.attempts`` tries, under the same
  idempotent producer id and sequence number: a batch whose answer was lost after it
  was stored is not stored again (with ``idempotent=False`` clients, it may be).
- **When retries run out** (or at once for an error no retry can fix, e.g.
  ``TopicNotFound``): the batch is dropped; each of its futures fails with the last
  error, ``on_error(topic, records, error)`` is called if given, the failure is logged
  and counted in ``failed``; the sender goes on with the next batch. Messages of one
  topic are sent in ``send`` order, so the delivered ones keep that order, with a gap
  where a batch was dropped.
"""

from __future__ import annotations

import time

from tidings.client._async.concurrency import (
    AsyncCondition,
    AsyncFuture,
    AsyncSender,
    claim,
    new_future,
    settle,
)
from tidings.client._async.session import AsyncSession
from tidings.client.base import NO_RETRY, MessageLike, Outgoing, RetryPolicy, to_record
from tidings.client.batching import (
    Batcher,
    ErrorCallback,
    Pending,
    PublisherOptions,
    record_size,
    report_failure,
)
from tidings.client.transports import Cancellation
from tidings.errors import RequestTimeout
from tidings.names import check_name

__all__ = ["AsyncPublisher"]

#: Seconds a close that ran out of time waits for the sender it cut off to end (it
#: ends at once unless a callback of the application holds it).
_STOP_GRACE = 1.0


class AsyncPublisher:
    # ---- async only
    """Background batching publisher for :class:`~tidings.AsyncClient`.

    Bound to the event loop of its first ``send``. Use ``async with`` (or ``await
    close()``): leaving it flushes.
    """

    # ---- sync only
    # """Background batching publisher for :class:`~tidings.Client`; thread-safe.
    #
    # Use as a context manager (or call :meth:`close`): leaving it flushes. The sender is
    # a daemon thread, so messages still buffered when the interpreter exits are lost.
    # """
    # ---- end

    def __init__(
        self,
        client: AsyncSession,
        *,
        max_batch_messages: int = 500,
        max_batch_bytes: int = 1 << 20,
        buffer_messages: int = 10_000,
        buffer_bytes: int = 32 << 20,
        linger: float = 0.0,
        retry: RetryPolicy | None = None,
        on_error: ErrorCallback | None = None,
    ) -> None:
        opts = PublisherOptions(
            max_batch_messages,
            max_batch_bytes,
            buffer_messages,
            buffer_bytes,
            linger,
            retry,
            on_error,
        )
        self._client = client
        self._retry = opts.retry
        self._on_error = opts.on_error
        self._batcher: Batcher[AsyncFuture[None]] = Batcher(**opts.batcher_args)
        #: The idempotent producer every batch goes out under (one batch in flight at a
        #: time, so its sequence numbers reach the server in order); replaced after a
        #: batch is dropped, since that batch may or may not have been written.
        self._lane = client._new_lane()
        self._cond = AsyncCondition()
        self._flushing = 0
        self._closed = False
        #: A close ran out of time: what is left is dropped, and nothing retried.
        self._abandoned = False
        #: The batch the sender is publishing (its topic, claimed messages and whole
        #: batch); a close that runs out of time takes it, and the sender then leaves it.
        self._in_flight: (
            tuple[str, list[Pending[AsyncFuture[None]]], list[Pending[AsyncFuture[None]]]] | None
        ) = None
        self._sender: AsyncSender | None = None
        #: Cut by a close that ran out of time: the request in flight is cut off, and
        #: the sender sends nothing more.
        self._cancel = Cancellation()
        #: Messages made durable / dropped after their retries ran out.
        self.sent = 0
        self.failed = 0

    async def send(
        self, topic: str, message: MessageLike, *, timeout: float | None = None
    ) -> AsyncFuture[None]:
        """Buffer one message; the future resolves once it is durable (or fails).

        Waits while the buffer is full, at most ``timeout`` seconds (None: no limit),
        then raises :class:`~tidings.errors.RequestTimeout`.
        """
        check_name(topic)
        record = to_record(message)
        size = record_size(record)
        future = new_future()
        async with self._cond:
            if self._closed:
                raise RuntimeError("the publisher is closed")
            if not self._batcher.has_room(size):
                # A close that gives up meanwhile makes room too (it drops the buffer).
                room = lambda: self._closed or self._batcher.has_room(size)  # noqa: E731
                if not await self._cond.wait_for(room, timeout):
                    raise RequestTimeout("the publisher's buffer stayed full")
                if self._closed:
                    raise RuntimeError("the publisher is closed")
            self._batcher.add(topic, record, future, time.monotonic())
            if self._sender is None:
                self._sender = AsyncSender(self._run, "tidings-publisher")
            self._cond.notify_all()
        return future

    async def flush(self, timeout: float | None = None) -> None:
        """Send everything buffered now and wait until each of it is durable or dropped.

        Does not raise for dropped messages (see their futures, ``on_error``,
        ``failed``); raises :class:`TimeoutError` if ``timeout`` seconds pass first.
        From the sender itself (``on_error``, a future's callback) it raises
        :class:`RuntimeError`: it would wait for itself.
        """
        if self._sender is not None and self._sender.is_current():
            raise RuntimeError(
                "flush() from the publisher's own sender (on_error or a future's callback) "
                "would wait for itself"
            )
        async with self._cond:
            target = self._batcher.last_seq
            self._flushing += 1
            self._cond.notify_all()
            try:
                done = await self._cond.wait_for(
                    lambda: self._batcher.resolved_through(target), timeout
                )
            finally:
                self._flushing -= 1
        if not done:
            raise TimeoutError("flush did not finish in time")

    async def close(self, timeout: float | None = None) -> None:
        """Flush, then stop the sender; later sends raise.

        Without ``timeout`` it waits until every message is durable or dropped. With
        it, once ``timeout`` seconds have passed, every message not yet sent is
        dropped (its future fails with :class:`~tidings.errors.RequestTimeout`,
        ``on_error`` is called, ``failed`` counts it), the batch in flight gets no
        further try (and is dropped the same way if still unanswered: it may or may
        not have been written), and :class:`TimeoutError` is raised; the sender
        stops: its request in flight is cut off (with the project's transports) and it
        sends nothing after ``close`` returns. From the sender itself
        (``on_error``, a future's callback) it only stops new sends: the sender sends
        what is buffered, then ends.
        """
        # Not done at once when closed already: a close from the sender (below) or one
        # that ran out of time left messages to wait for.
        if self._sender is not None and self._sender.is_current():
            async with self._cond:
                self._closed = True
                self._cond.notify_all()
            return
        began = time.monotonic()
        try:
            await self.flush(timeout)
        except TimeoutError:
            await self._abandon()
            raise
        finally:
            async with self._cond:
                self._closed = True
                self._cond.notify_all()
            if self._sender is not None:
                left = None if timeout is None else max(0.0, began + timeout - time.monotonic())
                if self._abandoned:
                    # Cut off, the sender ends at once: wait for it, so that nothing
                    # of it runs once close() returned.
                    left = _STOP_GRACE
                await self._sender.join(left)
            if self._abandoned:
                # Its request may stay unanswered up to the client's timeout (for ever
                # without one): no future may wait that long behind a closed publisher.
                await self._drop_in_flight()

    async def _abandon(self) -> None:
        """Drop every message still buffered, and stop retrying the batch in flight."""
        error = RequestTimeout("the publisher was closed before this message was sent")
        async with self._cond:
            self._abandoned = True
            self._closed = True
            dropped = self._batcher.take_all()
            self._cond.notify_all()
        # Outside the lock: the cut wakes the sender, which then wants it.
        self._cancel.cancel()
        for topic, batch in dropped:
            await self._settle_batch(topic, [p for p in batch if claim(p.future)], batch, error)

    async def _drop_in_flight(self) -> None:
        """Fail the batch still being published, if any: it may or may not be written."""
        async with self._cond:
            taken, self._in_flight = self._in_flight, None
        if taken is None:
            return
        topic, live, batch = taken
        error = RequestTimeout(
            "the publisher was closed before this message's batch was answered: "
            "it may or may not have been written"
        )
        await self._settle_batch(topic, live, batch, error)

    async def _settle_batch(
        self,
        topic: str,
        live: list[Pending[AsyncFuture[None]]],
        batch: list[Pending[AsyncFuture[None]]],
        error: BaseException | None,
    ) -> None:
        """Answer a batch's claimed messages (``live``) with ``error`` (None: sent),
        report a failure, count them, and let the batch's topic go on."""
        for p in live:
            settle(p.future, error)
        if error is not None and live:
            report_failure(topic, [p.record for p in live], error, self._on_error)
        async with self._cond:
            if error is None:
                self.sent += len(live)
            else:
                self.failed += len(live)
            self._batcher.resolve(batch)
            self._cond.notify_all()

    async def __aenter__(self) -> AsyncPublisher:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def _next_batch(
        self,
    ) -> tuple[str, list[Pending[AsyncFuture[None]]], list[Pending[AsyncFuture[None]]]] | None:
        """The next batch to publish, in flight from here: its topic, its claimed
        messages and the whole batch. In flight under the same lock it was taken
        under, so a close that runs out of time finds it one way or the other."""
        async with self._cond:
            while True:
                urgent = self._flushing > 0 or self._closed
                due = self._batcher.next_due(time.monotonic(), urgent=urgent)
                if due is None and self._closed:
                    return None
                if due == 0:
                    taken = self._batcher.take()
                    assert taken is not None
                    topic, batch = taken
                    live = [p for p in batch if claim(p.future)]
                    self._in_flight = (topic, live, batch)
                    return topic, live, batch
                await self._cond.wait(due)

    async def _run(self) -> None:
        while (taken := await self._next_batch()) is not None:
            topic, live, batch = taken
            error = await self._publish(topic, [p.record for p in live]) if live else None
            async with self._cond:
                # A close that ran out of time dropped it meanwhile, or is about to:
                # a failure now is its cutting the request off, which says nothing
                # of whether the batch was written.
                mine = self._in_flight is not None and (error is None or not self._abandoned)
                if mine:
                    self._in_flight = None
            if not mine:
                continue
            await self._settle_batch(topic, live, batch, error)

    async def _publish(self, topic: str, records: list[Outgoing]) -> BaseException | None:
        attempt = 1
        while True:
            try:
                # Each try under the same producer sequence: written once, however many.
                # Sent once per try: the publisher's retry policy counts the tries, the
                # client's must not multiply them.
                await self._client._publish_on(
                    topic, records, self._lane, NO_RETRY, cancel=self._cancel
                )
                return None
            except Exception as exc:
                error = exc
                if self._abandoned or not self._retry.should_retry(exc, attempt):
                    break
            # The backoff, cut short by a close that ran out of time.
            async with self._cond:
                if await self._cond.wait_for(lambda: self._abandoned, self._retry.backoff(attempt)):
                    break
            attempt += 1
        self._lane = self._client._new_lane()
        return error
