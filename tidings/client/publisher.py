"""The asynchronous publisher: a bounded buffer drained by a background batching sender.

Seed 000 requirements 4.3.3 and 6: publishing can be asynchronous, with retries, and a
message whose sending keeps failing is dropped. Each ``send`` returns a future at once;
a sender (a thread for :class:`Publisher`, a task for :class:`AsyncPublisher`) takes
batches from the buffer, one topic at a time, and publishes each with one request.

- **Batching**: a batch is up to ``max_batch_messages`` / ``max_batch_bytes`` of one
  topic's messages, sent when full, when its oldest message has waited ``linger``
  seconds, or on :meth:`flush` / :meth:`close`.
- **Bounded buffer**: at most ``buffer_messages`` / ``buffer_bytes`` wait unsent;
  ``send`` blocks while it is full (up to its ``timeout``, then
  :class:`~tidings.errors.RequestTimeout`).
- **Futures**: a message's future resolves (to None) once its batch is durable.
- **Retries**: a batch that fails with a retriable error (cannot connect, no answer,
  5xx) is resent after a backoff, up to ``retry.attempts`` tries. A retried publish may
  have been stored the first time, so delivery is at-least-once.
- **When retries run out** (or at once for an error no retry can fix, e.g.
  ``TopicNotFound``): the batch is dropped; each of its futures fails with the last
  error, ``on_error(topic, records, error)`` is called if given, the failure is logged
  and counted in ``failed``; the sender goes on with the next batch. Messages of one
  topic are sent in ``send`` order, so the delivered ones keep that order, with a gap
  where a batch was dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from tidings.client.base import (
    MessageLike,
    Outgoing,
    RetryPolicy,
    as_record,
    to_record,
)
from tidings.client.session import AsyncSession, Session
from tidings.errors import RequestTimeout
from tidings.names import check_name
from tidings.structs import Record

__all__ = ["AsyncPublisher", "Batcher", "ErrorCallback", "Publisher", "record_size"]

log = logging.getLogger("tidings.client.publisher")

F = TypeVar("F")

#: Called with the topic, the dropped records and the error, from the sender.
ErrorCallback = Callable[[str, Sequence[Record], BaseException], None]

DEFAULT_RETRY = RetryPolicy(attempts=5, initial_backoff=0.1, max_backoff=5.0)


def record_size(record: Outgoing) -> int:
    """Bytes a message adds to a request, roughly (payload, key and headers)."""
    if type(record) is bytes:
        return len(record)
    assert isinstance(record, Record)
    size = len(record.payload) + (len(record.key) if record.key else 0)
    for name, value in record.headers.items():
        size += len(name) + len(value)
    return size


@dataclass(slots=True)
class Pending(Generic[F]):
    """A message waiting in the buffer, with the future its sender resolves."""

    seq: int
    topic: str
    record: Outgoing
    size: int
    enqueued: float
    future: F


class Batcher(Generic[F]):
    """The buffer and the batching rules; no I/O, no locking (callers lock)."""

    def __init__(
        self,
        *,
        max_batch_messages: int,
        max_batch_bytes: int,
        buffer_messages: int,
        buffer_bytes: int,
        linger: float,
    ) -> None:
        if min(max_batch_messages, max_batch_bytes, buffer_messages, buffer_bytes) < 1:
            raise ValueError("batch and buffer limits must be positive")
        if linger < 0:
            raise ValueError("linger must not be negative")
        self.max_batch_messages = max_batch_messages
        self.max_batch_bytes = max_batch_bytes
        self.buffer_messages = buffer_messages
        self.buffer_bytes = buffer_bytes
        self.linger = linger
        self._queues: OrderedDict[str, deque[Pending[F]]] = OrderedDict()
        self._count = 0
        self._bytes = 0
        self._next_seq = 0
        # Every message not yet resolved, in send order (dicts keep insertion order).
        self._unresolved: dict[int, None] = {}

    @property
    def buffered(self) -> int:
        """Messages waiting to be taken by the sender."""
        return self._count

    @property
    def unresolved(self) -> int:
        """Messages sent to the buffer whose futures are not resolved yet."""
        return len(self._unresolved)

    @property
    def last_seq(self) -> int:
        """The sequence number the latest ``add`` got (-1 before any)."""
        return self._next_seq - 1

    def has_room(self, size: int) -> bool:
        """True if a message of ``size`` bytes fits (an empty buffer takes any one)."""
        if self._count == 0:
            return True
        return self._count < self.buffer_messages and self._bytes + size <= self.buffer_bytes

    def add(self, topic: str, record: Outgoing, future: F, now: float) -> Pending[F]:
        """Buffer one message (the caller checked :meth:`has_room`)."""
        item = Pending(self._next_seq, topic, record, record_size(record), now, future)
        self._next_seq += 1
        self._queues.setdefault(topic, deque()).append(item)
        self._count += 1
        self._bytes += item.size
        self._unresolved[item.seq] = None
        return item

    def resolved_through(self, seq: int) -> bool:
        """True if every message up to sequence number ``seq`` is resolved."""
        oldest = next(iter(self._unresolved), None)
        return oldest is None or oldest > seq

    def next_due(self, now: float, urgent: bool) -> float | None:
        """Seconds until a batch should go (0: now), or None if the buffer is empty."""
        due: float | None = None
        for queue in self._queues.values():
            head = queue[0]
            if urgent or len(queue) >= self.max_batch_messages:
                return 0.0
            wait = max(0.0, head.enqueued + self.linger - now)
            due = wait if due is None else min(due, wait)
        return due

    def take(self) -> tuple[str, list[Pending[F]]] | None:
        """The next batch: from the topic whose head has waited longest, in send order."""
        if not self._queues:
            return None
        topic = min(self._queues, key=lambda t: self._queues[t][0].seq)
        queue = self._queues[topic]
        batch: list[Pending[F]] = []
        size = 0
        while queue and len(batch) < self.max_batch_messages:
            item = queue[0]
            if batch and size + item.size > self.max_batch_bytes:
                break
            queue.popleft()
            batch.append(item)
            size += item.size
        if not queue:
            del self._queues[topic]
        self._count -= len(batch)
        self._bytes -= size
        return topic, batch

    def resolve(self, batch: Sequence[Pending[F]]) -> None:
        """Forget a batch whose futures are resolved."""
        for item in batch:
            self._unresolved.pop(item.seq, None)


def _report_failure(
    topic: str, records: list[Outgoing], error: BaseException, on_error: ErrorCallback | None
) -> None:
    log.warning("dropped %d message(s) for topic %r: %s", len(records), topic, error)
    if on_error is not None:
        try:
            on_error(topic, [as_record(r) for r in records], error)
        except Exception:
            log.exception("the publisher's on_error callback failed")


class _Options:
    """The knobs both publishers take, checked once."""

    def __init__(
        self,
        max_batch_messages: int,
        max_batch_bytes: int,
        buffer_messages: int,
        buffer_bytes: int,
        linger: float,
        retry: RetryPolicy | None,
        on_error: ErrorCallback | None,
    ) -> None:
        self.batcher_args: dict[str, Any] = {
            "max_batch_messages": max_batch_messages,
            "max_batch_bytes": max_batch_bytes,
            "buffer_messages": buffer_messages,
            "buffer_bytes": buffer_bytes,
            "linger": linger,
        }
        self.retry = retry if retry is not None else DEFAULT_RETRY
        self.on_error = on_error


class Publisher:
    """Background batching publisher for :class:`~tidings.Client`; thread-safe.

    Use as a context manager (or call :meth:`close`): leaving it flushes. The sender is
    a daemon thread, so messages still buffered when the interpreter exits are lost.
    """

    def __init__(
        self,
        client: Session,
        *,
        max_batch_messages: int = 500,
        max_batch_bytes: int = 1 << 20,
        buffer_messages: int = 10_000,
        buffer_bytes: int = 32 << 20,
        linger: float = 0.005,
        retry: RetryPolicy | None = None,
        on_error: ErrorCallback | None = None,
    ) -> None:
        opts = _Options(
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
        self._batcher: Batcher[Future[None]] = Batcher(**opts.batcher_args)
        self._cond = threading.Condition()
        self._flushing = 0
        self._closed = False
        self._thread: threading.Thread | None = None
        #: Messages made durable / dropped after their retries ran out.
        self.sent = 0
        self.failed = 0

    def send(
        self, topic: str, message: MessageLike, *, timeout: float | None = None
    ) -> Future[None]:
        """Buffer one message; the future resolves once it is durable (or fails).

        Blocks while the buffer is full, at most ``timeout`` seconds (None: no limit),
        then raises :class:`~tidings.errors.RequestTimeout`.
        """
        check_name(topic)
        record = to_record(message)
        future: Future[None] = Future()
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            if self._closed:
                raise RuntimeError("the publisher is closed")
            while not self._batcher.has_room(record_size(record)):
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise RequestTimeout("the publisher's buffer stayed full")
                self._cond.wait(remaining)
            self._batcher.add(topic, record, future, time.monotonic())
            self._start_sender()
            self._cond.notify_all()
        return future

    def flush(self, timeout: float | None = None) -> None:
        """Send everything buffered now and wait until each of it is durable or dropped.

        Does not raise for dropped messages (see their futures, ``on_error``,
        ``failed``); raises :class:`TimeoutError` if ``timeout`` seconds pass first.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            target = self._batcher.last_seq
            self._flushing += 1
            self._cond.notify_all()
            try:
                while not self._batcher.resolved_through(target):
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        raise TimeoutError("flush did not finish in time")
                    self._cond.wait(remaining)
            finally:
                self._flushing -= 1

    def close(self, timeout: float | None = None) -> None:
        """Flush, then stop the sender; later sends raise."""
        with self._cond:
            if self._closed:
                return
        try:
            self.flush(timeout)
        finally:
            with self._cond:
                self._closed = True
                self._cond.notify_all()
            if self._thread is not None:
                self._thread.join(timeout)

    def __enter__(self) -> Publisher:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _start_sender(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="tidings-publisher", daemon=True)
            self._thread.start()

    def _next_batch(self) -> tuple[str, list[Pending[Future[None]]]] | None:
        with self._cond:
            while True:
                due = self._batcher.next_due(
                    time.monotonic(), urgent=self._flushing > 0 or self._closed
                )
                if due is None and self._closed:
                    return None
                if due == 0:
                    return self._batcher.take()
                self._cond.wait(due)

    def _run(self) -> None:
        while (taken := self._next_batch()) is not None:
            topic, batch = taken
            live = [p for p in batch if p.future.set_running_or_notify_cancel()]
            error = self._publish(topic, [p.record for p in live]) if live else None
            for p in live:
                if error is None:
                    p.future.set_result(None)
                else:
                    p.future.set_exception(error)
            if error is None:
                self.sent += len(live)
            else:
                self.failed += len(live)
                _report_failure(topic, [p.record for p in live], error, self._on_error)
            with self._cond:
                self._batcher.resolve(batch)
                self._cond.notify_all()

    def _publish(self, topic: str, records: list[Outgoing]) -> BaseException | None:
        attempt = 1
        while True:
            try:
                self._client.publish(topic, records)
                return None
            except Exception as exc:
                if not self._retry.should_retry(exc, attempt):
                    return exc
            time.sleep(self._retry.backoff(attempt))
            attempt += 1


class AsyncPublisher:
    """Background batching publisher for :class:`~tidings.AsyncClient`.

    Bound to the event loop of its first ``send``. Use ``async with`` (or ``await
    close()``): leaving it flushes.
    """

    def __init__(
        self,
        client: AsyncSession,
        *,
        max_batch_messages: int = 500,
        max_batch_bytes: int = 1 << 20,
        buffer_messages: int = 10_000,
        buffer_bytes: int = 32 << 20,
        linger: float = 0.005,
        retry: RetryPolicy | None = None,
        on_error: ErrorCallback | None = None,
    ) -> None:
        opts = _Options(
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
        self._batcher: Batcher[asyncio.Future[None]] = Batcher(**opts.batcher_args)
        self._cond: asyncio.Condition | None = None
        self._flushing = 0
        self._closed = False
        self._task: asyncio.Task[None] | None = None
        #: Messages made durable / dropped after their retries ran out.
        self.sent = 0
        self.failed = 0

    def _condition(self) -> asyncio.Condition:
        if self._cond is None:
            self._cond = asyncio.Condition()
        return self._cond

    async def send(
        self, topic: str, message: MessageLike, *, timeout: float | None = None
    ) -> asyncio.Future[None]:
        """Buffer one message; the future resolves once it is durable (or fails).

        Waits while the buffer is full, at most ``timeout`` seconds (None: no limit),
        then raises :class:`~tidings.errors.RequestTimeout`.
        """
        check_name(topic)
        record = to_record(message)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        cond = self._condition()
        async with cond:
            if self._closed:
                raise RuntimeError("the publisher is closed")
            size = record_size(record)
            try:
                async with asyncio.timeout(timeout):
                    await cond.wait_for(lambda: self._batcher.has_room(size))
            except TimeoutError:
                raise RequestTimeout("the publisher's buffer stayed full") from None
            self._batcher.add(topic, record, future, loop.time())
            if self._task is None:
                self._task = asyncio.create_task(self._run(), name="tidings-publisher")
            cond.notify_all()
        return future

    async def flush(self, timeout: float | None = None) -> None:
        """Send everything buffered now and wait until each of it is durable or dropped.

        Does not raise for dropped messages (see their futures, ``on_error``,
        ``failed``); raises :class:`TimeoutError` if ``timeout`` seconds pass first.
        """
        cond = self._condition()
        async with cond:
            target = self._batcher.last_seq
            self._flushing += 1
            cond.notify_all()
            try:
                async with asyncio.timeout(timeout):
                    await cond.wait_for(lambda: self._batcher.resolved_through(target))
            finally:
                self._flushing -= 1

    async def close(self, timeout: float | None = None) -> None:
        """Flush, then stop the sender; later sends raise."""
        if self._closed:
            return
        try:
            await self.flush(timeout)
        finally:
            cond = self._condition()
            async with cond:
                self._closed = True
                cond.notify_all()
            if self._task is not None:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(self._task), timeout)

    async def __aenter__(self) -> AsyncPublisher:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def _next_batch(self) -> tuple[str, list[Pending[asyncio.Future[None]]]] | None:
        cond = self._condition()
        loop = asyncio.get_running_loop()
        async with cond:
            while True:
                due = self._batcher.next_due(loop.time(), urgent=self._flushing > 0 or self._closed)
                if due is None and self._closed:
                    return None
                if due == 0:
                    return self._batcher.take()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(cond.wait(), due)

    async def _run(self) -> None:
        while (taken := await self._next_batch()) is not None:
            topic, batch = taken
            live = [p for p in batch if not p.future.done()]
            error = await self._publish(topic, [p.record for p in live]) if live else None
            for p in live:
                if p.future.done():
                    continue
                if error is None:
                    p.future.set_result(None)
                else:
                    p.future.set_exception(error)
            if error is None:
                self.sent += len(live)
            else:
                self.failed += len(live)
                _report_failure(topic, [p.record for p in live], error, self._on_error)
            cond = self._condition()
            async with cond:
                self._batcher.resolve(batch)
                cond.notify_all()

    async def _publish(self, topic: str, records: list[Outgoing]) -> BaseException | None:
        attempt = 1
        while True:
            try:
                await self._client.publish(topic, records)
                return None
            except Exception as exc:
                if not self._retry.should_retry(exc, attempt):
                    return exc
            await asyncio.sleep(self._retry.backoff(attempt))
            attempt += 1
