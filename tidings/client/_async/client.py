"""The client: one method per call of the REST API (docs/client.md)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any, Self, TypeVar, overload

# ---- sync only
# import threading
# from concurrent.futures import ThreadPoolExecutor
# ---- end
from tidings.client._async.concurrency import AsyncPending, AsyncWorker, sleep
from tidings.client._async.consumer import AsyncConsumer
from tidings.client._async.group_consumer import AsyncGroupConsumer
from tidings.client._async.publisher import AsyncPublisher
from tidings.client._async.queue import AsyncQueue
from tidings.client._async.transactions import AsyncTransactionAware, AsyncTransactionContext
from tidings.client.api import Call, PollPage
from tidings.client.asyncio_transport import AsyncioTransport
from tidings.client.base import (
    DEFAULT_MEDIA,
    DEFAULT_NAMESPACE,
    DEFAULT_TIMEOUT,
    BaseClient,
    MessageLike,
    Outgoing,
    ProducerLane,
    RetryPolicy,
    StartPosition,
    bearer_token,
    concrete_start,
    encoded_transaction,
    read_only_snapshot,
    resolve_start,
    to_records,
)
from tidings.client.batching import ErrorCallback
from tidings.client.cursor import DEFAULT_BATCH_SIZE, DEFAULT_COMMITTED_WAIT, DEFAULT_WAIT
from tidings.client.transports import AsyncTransport, Cancellation
from tidings.client.txbuffer import DEFAULT_PAYLOAD_THRESHOLD
from tidings.codec.admin import TransactionGroupCommit
from tidings.codec.queue_bodies import TransactionAck
from tidings.codec.wire import Media
from tidings.errors import BadRequest, OutOfOrderSequence, UnsupportedMediaType
from tidings.names import DEFAULT_URL
from tidings.structs import (
    GroupInfo,
    Message,
    MessageId,
    PayloadRange,
    ProducerInfo,
    QueueStats,
    RollbackInfo,
    TopicEnd,
    TopicMetadata,
    TopicStats,
    Transaction,
    TransactionEnd,
    TransactionState,
)

__all__ = ["AsyncClient"]

T = TypeVar("T")


def _wp(transaction: Transaction | int) -> int:
    return transaction.write_pointer if isinstance(transaction, Transaction) else transaction


class AsyncClient(BaseClient):
    # ---- async only
    """A Tidings client for asyncio; use it from one event loop.

    ::

        async with tidings.AsyncClient("http://127.0.0.1:8470") as client:
            await client.create_topic("events")
            await client.publish("events", [b"one", "two"])
            async for message in client.consume("events", follow=False):
                print(message.payload)

    ``media`` is the encoding of publish, store and poll bodies (the Avro extension by
    default: measured faster than JSON). Requests that are safe to repeat (reads, polls,
    property updates, idempotent publishes) are retried per ``retry`` when they fail
    retriably; others are sent once. ``transactions_url`` points the transaction calls at
    another server (``tidings serve --role transactions``).
    """

    # ---- sync only
    # """A Tidings client for one server and namespace; thread-safe.
    #
    # ::
    #
    #     with tidings.Client("http://127.0.0.1:8470") as client:
    #         client.create_topic("events")
    #         client.publish("events", [b"one", "two"])
    #         for message in client.consume("events", follow=False):
    #             print(message.payload)
    #
    # ``media`` is the encoding of publish, store and poll bodies (the Avro extension by
    # default: measured faster than JSON). Requests that are safe to repeat (reads, polls,
    # property updates, idempotent publishes) are retried per ``retry`` when they fail
    # retriably; others are sent once. ``transactions_url`` points the transaction calls at
    # another server (``tidings serve --role transactions``).
    # """
    # ---- end

    def __init__(
        self,
        url: str = DEFAULT_URL,
        namespace: str = DEFAULT_NAMESPACE,
        *,
        timeout: float | None = DEFAULT_TIMEOUT,
        media: Media = DEFAULT_MEDIA,
        retry: RetryPolicy | None = None,
        max_connections: int = 10,
        transactions_url: str | None = None,
        transport: AsyncTransport | None = None,
        idempotent: bool = True,
        token: str | None = None,
        verify: bool | str = True,
    ) -> None:
        super().__init__(
            url,
            namespace,
            timeout=timeout,
            media=media,
            retry=retry,
            transactions_url=transactions_url,
            idempotent=idempotent,
        )
        # The bearer token rides in every request's headers (docs/security.md);
        # ``verify`` is a CA file or directory, or a bool, as httpx takes it.
        token = bearer_token(token)
        headers = {} if token is None else {"Authorization": f"Bearer {token}"}
        self._transport = transport or AsyncioTransport(
            max_connections=max_connections, headers=headers, verify=verify
        )
        # ---- sync only
        # self._max_connections = max_connections
        # self._pool: ThreadPoolExecutor | None = None
        # self._pool_lock = threading.Lock()
        # ---- end

    # ---- sync only
    # def _commit_pool(self) -> ThreadPoolExecutor:
    #     """Threads that send a transaction's per-topic publishes concurrently at commit
    #     (created on first use, at most one per pooled connection)."""
    #     pool = self._pool
    #     if pool is None:
    #         with self._pool_lock:
    #             pool = self._pool
    #             if pool is None:
    #                 pool = self._pool = ThreadPoolExecutor(
    #                     max(1, min(8, self._max_connections)),
    #                     thread_name_prefix="tidings-commit",
    #                 )
    #     return pool
    # ---- end

    async def _send(
        self, call: Call[T], policy: RetryPolicy | None = None, cancel: Cancellation | None = None
    ) -> T:
        if policy is None:
            policy = self._policy_for(call)
        attempt = 1
        while True:
            request = call.request if cancel is None else replace(call.request, cancel=cancel)
            try:
                return call.result(await self._transport.send(request))
            except UnsupportedMediaType:
                if call.fallback is None:
                    raise
                call = call.fallback()  # the same request in a medium the server takes
                continue
            except Exception as exc:
                if isinstance(exc, call.final) or not policy.should_retry(exc, attempt):
                    raise
                if call.retry_on and not (
                    call.request.idempotent or isinstance(exc, call.retry_on)
                ):
                    raise  # it may have been carried out
            await sleep(policy.backoff(attempt))
            attempt += 1

    def _begin(self, worker: AsyncWorker, call: Call[T]) -> AsyncPending[T]:
        """``call`` started in the background by ``worker`` and sent once (a consumer
        whose read-ahead fails polls again)."""
        return worker.begin(self._transport, self._send, call)

    async def close(self) -> None:
        """Close pooled connections (and the commit threads, if any were started)."""
        # ---- sync only
        # with self._pool_lock:
        #     pool, self._pool = self._pool, None
        # if pool is not None:
        #     pool.shutdown(wait=True)
        # ---- end
        await self._transport.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # --- topics ---

    async def create_topic(
        self, topic: str, *, ttl: int | None = None, properties: Mapping[str, Any] | None = None
    ) -> TopicMetadata:
        """Create a topic (``ttl`` in seconds); :class:`TopicAlreadyExists` if it exists."""
        return await self._send(self._api.create_topic(topic, ttl, properties))

    async def update_topic(
        self, topic: str, *, ttl: int | None = None, properties: Mapping[str, Any] | None = None
    ) -> TopicMetadata:
        """Replace all of a topic's properties; unset ones return to defaults."""
        return await self._send(self._api.update_topic(topic, ttl, properties))

    async def get_topic(self, topic: str) -> TopicMetadata:
        """A topic's metadata; :class:`TopicNotFound` if there is none."""
        return await self._send(self._api.get_topic(topic))

    async def list_topics(self) -> list[str]:
        """The namespace's topic names, sorted."""
        return await self._send(self._api.list_topics())

    async def delete_topic(self, topic: str) -> None:
        """Delete a topic and (lazily) its messages."""
        await self._send(self._api.delete_topic(topic))

    async def stats(self, topic: str) -> TopicStats:
        """A topic's contents and traffic."""
        return await self._send(self._api.stats(topic))

    async def end(self, topic: str) -> TopicEnd:
        """Where a topic ends now: its newest message and its last stable position (the
        first message of the oldest transaction still open on it); see
        :class:`~tidings.TopicEnd`. Cheap: the server seeks, it does not scan."""
        return await self._send(self._api.topic_end(topic))

    # --- publishing ---

    @overload
    async def publish(self, topic: str, messages: MessageLike | Iterable[MessageLike]) -> None: ...

    @overload
    async def publish(
        self,
        topic: str,
        messages: MessageLike | Iterable[MessageLike],
        *,
        write_pointer: int,
        payload_ranges: Sequence[PayloadRange] | None = None,
    ) -> RollbackInfo: ...

    async def publish(
        self,
        topic: str,
        messages: MessageLike | Iterable[MessageLike],
        *,
        write_pointer: int | None = None,
        payload_ranges: Sequence[PayloadRange] | None = None,
    ) -> RollbackInfo | None:
        """Publish; returns once the messages are durable.

        Without ``write_pointer``: non-transactional, visible at once; idempotent
        unless the client was made with ``idempotent=False``: a publish retried after
        its answer was lost is written once (each concurrent publish runs under a
        producer id and sequence number of its own, docs/client.md). With it: a
        transactional publish (the messages, or with none, what ``store`` put under the
        write pointer), answered with the :class:`RollbackInfo` to undo it.

        ``payload_ranges`` (with a write pointer and no messages) publishes only the
        stored rows inside those ranges -- the :class:`PayloadRange` values ``store``
        returned -- rather than every row under the write pointer; it is sent as a
        JSON body whatever the client's media. Bad ranges raise :class:`BadRequest`.
        """
        records = to_records(messages)
        if write_pointer is None:
            if payload_ranges is not None:
                raise BadRequest("payload_ranges need a write_pointer (and no messages)")
            lanes = self._lanes
            if lanes is None:
                await self._send(self._api.publish(topic, records))
                return None
            # Idempotent: retried after a lost answer, the server keeps one copy.
            lane = lanes.acquire()
            await self._publish_on(topic, records, lane)
            # Only a lane whose sequence is known goes back (after an error it may or
            # may not have been written, so the lane is dropped with its producer id).
            lanes.release(lane)
            return None
        return await self._send(
            self._api.publish_transactional(topic, records, write_pointer, payload_ranges)
        )

    def _new_lane(self) -> ProducerLane | None:
        """A producer lane of its own for a caller that sends one publish at a time and
        retries it itself (the background publisher); None if this client does not
        publish idempotently."""
        return None if self._lanes is None else ProducerLane()

    async def _publish_on(
        self,
        topic: str,
        records: list[Outgoing],
        lane: ProducerLane | None,
        policy: RetryPolicy | None = None,
        cancel: Cancellation | None = None,
    ) -> None:
        """A non-transactional publish under ``lane``'s next sequence number for
        ``topic`` (without a lane, not idempotent). Sent again with the same lane after
        a failure, it is written once; the lane moves on once it is durable. A caller
        that gives up on the publish must drop the lane (was it written?). ``policy``
        (default: the client's, for an idempotent publish) decides how often it is
        sent here; ``cancel`` stops it from elsewhere."""
        if lane is None:
            await self._send(self._api.publish(topic, records), policy, cancel)
            return
        producer = (lane.producer_id, lane.sequence(topic))
        try:
            await self._send(self._api.publish(topic, records, producer), policy, cancel)
        except OutOfOrderSequence:
            # The server's last sequence of this producer is older than ours: it lost
            # what we wrote after it (a store restored from a copy). Nothing of this
            # publish was written, so it goes again as a new producer.
            lane.renew()
            producer = (lane.producer_id, lane.sequence(topic))
            await self._send(self._api.publish(topic, records, producer), policy, cancel)
        lane.advance(topic)

    async def store(
        self, topic: str, messages: MessageLike | Iterable[MessageLike], *, write_pointer: int
    ) -> PayloadRange:
        """Write payloads of transaction ``write_pointer`` to the Payload Table (durable,
        invisible until a ``publish`` of the write pointer and the commit).

        Returns the :class:`PayloadRange` the rows got; ``publish(topic, [],
        write_pointer=..., payload_ranges=[...])`` can then expose exactly them.
        """
        return await self._send(self._api.store(topic, to_records(messages), write_pointer))

    async def store_encoded(self, topic: str, body: bytes, *, write_pointer: int) -> PayloadRange:
        """:meth:`store` of a request body already encoded in this client's medium
        (with ``write_pointer`` inside it): for callers that build bodies in bulk,
        such as the Spark writer from Arrow columns, so rows never become objects."""
        return await self._send(self._api.store_encoded(topic, body, write_pointer))

    async def rollback(self, topic: str, info: RollbackInfo) -> int:
        """Mark exactly the entries a transactional publish wrote as rolled back."""
        return await self._send(self._api.rollback(topic, info))

    def publisher(
        self,
        *,
        max_batch_messages: int = 500,
        max_batch_bytes: int = 1 << 20,
        buffer_messages: int = 10_000,
        buffer_bytes: int = 32 << 20,
        linger: float = 0.0,
        retry: RetryPolicy | None = None,
        on_error: ErrorCallback | None = None,
    ) -> AsyncPublisher:
        """A background batching publisher (see :class:`~tidings.client.AsyncPublisher`)."""
        return AsyncPublisher(
            self,
            max_batch_messages=max_batch_messages,
            max_batch_bytes=max_batch_bytes,
            buffer_messages=buffer_messages,
            buffer_bytes=buffer_bytes,
            linger=linger,
            retry=retry,
            on_error=on_error,
        )

    # --- consuming ---

    async def poll(
        self,
        topic: str,
        start: StartPosition = None,
        *,
        inclusive: bool = True,
        limit: int | None = None,
        transaction: Transaction | bytes | None = None,
        wait: float | None = None,
        isolation: str | None = None,
        max_bytes: int | None = None,
    ) -> list[Message]:
        """One fetch: up to ``limit`` messages from ``start`` (a message id, a timestamp
        in ms, a datetime; None: the oldest). With ``transaction`` (a snapshot or its
        encoded form) only committed messages; ``wait`` seconds of long-poll.
        ``max_bytes``: the page stops after the message that brings it to that many
        bytes (default and most: the server's ``fetch_max_bytes``, 16 MiB unless set).

        ``isolation="read_committed"`` without ``transaction``: only committed messages,
        with a fresh snapshot the server takes at each fetch (a long poll then also
        wakes when a transaction commits); :class:`ServiceUnavailable` if the server does
        not run the transaction service. ``transaction``, if given, wins."""
        return await self._send(
            self._api.poll(
                topic,
                concrete_start(start),
                inclusive=inclusive,
                limit=limit,
                transaction=encoded_transaction(transaction),
                wait=wait,
                isolation=isolation,
                max_bytes=max_bytes,
            )
        )

    async def poll_page(
        self,
        topic: str,
        start: MessageId | int | None,
        *,
        inclusive: bool,
        limit: int | None,
        transaction: Transaction | bytes | None,
        wait: float | None,
        isolation: str | None,
        max_bytes: int | None = None,
    ) -> PollPage:
        """:meth:`poll`, answered undecoded with the page's extent (what consumers use
        to read ahead: they decode one page while the server prepares the next)."""
        return await self._send(
            self._api.poll_page(
                topic,
                start,
                inclusive=inclusive,
                limit=limit,
                transaction=encoded_transaction(transaction),
                wait=wait,
                isolation=isolation,
                max_bytes=max_bytes,
            )
        )

    async def poll_ids(
        self,
        topic: str,
        start: StartPosition = None,
        *,
        inclusive: bool = True,
        limit: int | None = None,
        transaction: Transaction | bytes | None = None,
        wait: float | None = None,
        isolation: str | None = None,
    ) -> list[MessageId]:
        """:meth:`poll`, answering only the ids of the messages it would return: what
        a planner needs to find where a range ends or to split it, without carrying
        the payloads (``?fields=id``, docs/api.md)."""
        return await self._send(
            self._api.poll_ids(
                topic,
                concrete_start(start),
                inclusive=inclusive,
                limit=limit,
                transaction=encoded_transaction(transaction),
                wait=wait,
                isolation=isolation,
            )
        )

    @overload
    def consume(
        self,
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
    ) -> AsyncConsumer: ...

    @overload
    def consume(
        self,
        topic: str,
        start: StartPosition = "earliest",
        *,
        group: str,
        batch_size: int = DEFAULT_BATCH_SIZE,
        wait: float = DEFAULT_WAIT,
        follow: bool = True,
        session_timeout: float = 10.0,
        auto_commit: bool = False,
        partitions: int | None = None,
        max_bytes: int | None = None,
    ) -> AsyncGroupConsumer: ...

    def consume(
        self,
        topic: str,
        start: StartPosition = "earliest",
        *,
        inclusive: bool = True,
        transactional: bool = True,
        batch_size: int = DEFAULT_BATCH_SIZE,
        wait: float = DEFAULT_WAIT,
        committed_wait: float = DEFAULT_COMMITTED_WAIT,
        follow: bool = True,
        group: str | None = None,
        session_timeout: float = 10.0,
        auto_commit: bool = False,
        partitions: int | None = None,
        max_bytes: int | None = None,
    ) -> AsyncConsumer | AsyncGroupConsumer:
        """An iterator over a topic's messages from ``start``, in the one order.

        Read-committed unless ``transactional=False``. With ``follow`` it waits for new
        messages forever (long-poll); without, it stops once caught up. To resume after
        a saved ``consumer.position``, pass it as ``start`` with ``inclusive=False``.

        With ``group`` it joins that consumer group of the topic instead (see
        :class:`~tidings.client.AsyncGroupConsumer`): the group's members split the
        topic by key hash, read-committed; ``start`` (``"earliest"`` or ``"latest"``)
        applies only where the group has no committed position; positions move only
        on ``commit()`` (or each poll, with ``auto_commit``). ``session_timeout``
        seconds without a poll or heartbeat drop the member; ``partitions`` (default
        32) is fixed when the group is first joined. ``transactional=False`` and
        ``inclusive=False`` are for a plain consumer: with ``group`` they raise
        ``ValueError``.

        Each poll asks for up to ``batch_size`` messages and, with ``max_bytes``,
        stops after the message that brings the page to that many bytes (the server
        caps it at its ``fetch_max_bytes``, 16 MiB unless set; Kafka's
        ``fetch.max.bytes``).
        """
        if group is not None:
            if not isinstance(start, str):
                raise ValueError("a group starts at 'earliest' or 'latest'")
            # A group reads committed messages from its own positions: these would be
            # ignored, and a caller passing them means something a group cannot do.
            if not transactional:
                raise ValueError("a group reads committed messages only: drop transactional")
            if not inclusive:
                raise ValueError("a group starts from its committed positions: drop inclusive")
            return AsyncGroupConsumer(
                self,
                topic,
                group,
                start,
                batch_size=batch_size,
                wait=wait,
                session_timeout=session_timeout,
                auto_commit=auto_commit,
                partitions=partitions,
                follow=follow,
                max_bytes=max_bytes,
            )
        return AsyncConsumer(
            self,
            topic,
            start,
            inclusive=inclusive,
            transactional=transactional,
            batch_size=batch_size,
            wait=wait,
            committed_wait=committed_wait,
            follow=follow,
            max_bytes=max_bytes,
        )

    # --- consumer groups ---

    async def groups(self, topic: str) -> list[str]:
        """The names of the topic's consumer groups, sorted."""
        return await self._send(self._api.group_list(topic))

    async def describe_group(self, topic: str, group: str) -> GroupInfo:
        """A consumer group's members, partitions, committed positions and lag;
        :class:`GroupNotFound` if there is none."""
        return await self._send(self._api.group_describe(topic, group))

    async def reset_group(
        self, topic: str, group: str, to: str | MessageId | int | datetime
    ) -> None:
        """Move every position of a group without members: ``"earliest"``,
        ``"latest"``, after a message id, or to the first message at or after a time
        (ms since the epoch). ``to`` takes every form ``consume``'s ``start`` takes, as
        ``tidings groups reset --to`` does: a 40-hex id, an ISO-8601 time, a time before
        now such as ``"-1h"``, a ``datetime``; anything else is
        :class:`~tidings.errors.InvalidMessageId` (a ``BadRequest``), sent nowhere."""
        if to is None:
            raise BadRequest("reset_group needs where to: earliest, latest, an id or a time")
        position = resolve_start(to)
        where = "earliest" if position is None else position
        await self._send(self._api.group_reset(topic, group, where))

    async def delete_group(self, topic: str, group: str) -> None:
        """Delete a consumer group and its positions."""
        await self._send(self._api.group_delete(topic, group))

    # --- queues ---

    def queue(
        self,
        topic: str,
        group: str,
        ack_timeout: float = 30.0,
        *,
        max_deliveries: int | None = None,
        dead_letter_topic: str | None = None,
        start: str = "earliest",
        prefetch: bool = False,
        max_bytes: int | None = None,
    ) -> AsyncQueue:
        """A worker's handle on queue ``group`` of ``topic``: ``pop`` leases messages
        to it for ``ack_timeout`` seconds, ``ack``/``nack`` settle them, ``close``
        gives back the rest (see :class:`~tidings.client.AsyncQueue`).

        The queue is created by its first pop, starting at ``start`` (``"earliest"``
        or ``"latest"``). After ``max_deliveries`` deliveries (default 20, kept per
        queue) a message goes to ``dead_letter_topic`` (default ``<topic>-dlq``,
        created when needed) instead of being delivered again.

        ``prefetch``: a full pop sends the next one at once, so the next batch is
        leased while this one is worked on (see :class:`~tidings.client.AsyncQueue`).

        ``max_bytes``: a pop stops after the message that brings it to that many
        bytes (the server caps it at its ``fetch_max_bytes``)."""
        return AsyncQueue(
            self,
            topic,
            group,
            ack_timeout=ack_timeout,
            max_deliveries=max_deliveries,
            dead_letter_topic=dead_letter_topic,
            start=start,
            prefetch=prefetch,
            max_bytes=max_bytes,
        )

    async def queues(self, topic: str | None = None) -> list[tuple[str, str]]:
        """``(topic, queue)`` of every queue of the namespace, or of ``topic``'s (with
        an auth file, the namespace's are those of topics the principal may consume)."""
        if topic is None:
            return await self._send(self._api.queue_list_all())
        return [(topic, q) for q in await self._send(self._api.queue_list(topic))]

    async def describe_queue(self, topic: str, queue: str) -> QueueStats:
        """A queue's settings, in-flight messages, depth and counters;
        :class:`QueueNotFound` if there is none."""
        return await self._send(self._api.queue_describe(topic, queue))

    async def purge_queue(self, topic: str, queue: str) -> int:
        """Ack everything a queue holds and everything published so far; how many
        messages it dropped that it had read and not acked (leased or waiting to be
        delivered again)."""
        return await self._send(self._api.queue_purge(topic, queue))

    async def delete_queue(self, topic: str, queue: str) -> None:
        """Delete a queue and its state."""
        await self._send(self._api.queue_delete(topic, queue))

    async def snapshot(self) -> Transaction:
        """A read-only snapshot of what is committed now, for :meth:`poll`."""
        return read_only_snapshot(await self.transactions())

    # --- transactions ---

    def transaction(
        self,
        *participants: AsyncTransactionAware,
        timeout: float | None = None,
        producer: ProducerInfo | None = None,
        payload_threshold: int = DEFAULT_PAYLOAD_THRESHOLD,
        defer_begin: bool = True,
    ) -> AsyncTransactionContext:
        """A transaction over the messaging publisher and ``participants``::

        with client.transaction() as tx:
            tx.publish("orders", b"...")
            tx.publish("audit", b"...")

        With no ``participants`` (``defer_begin``), the whole transaction is one
        request at the end of the block (begin, publish, commit on the server); see
        :class:`~tidings.client.transactions.TransactionContext`.
        """
        return AsyncTransactionContext(
            self,
            *participants,
            timeout=timeout,
            producer=producer,
            payload_threshold=payload_threshold,
            defer_begin=defer_begin,
        )

    async def publish_transaction(
        self,
        batches: Mapping[str, MessageLike | Iterable[MessageLike]],
        *,
        timeout: float | None = None,
        transactional_id: str | None = None,
        epoch: int | None = None,
        acks: Sequence[TransactionAck] = (),
        group_commits: Sequence[TransactionGroupCommit] = (),
    ) -> Transaction:
        """A whole transaction in one request: begin, publish each topic's messages
        under its write pointer, commit; all of them become visible together, or none.
        ``acks`` (queue acks) and ``group_commits`` (consumer group positions) count if
        and only if it commits.

        Returns the transaction's snapshot (its ``write_pointer`` is the transaction).
        Needs a server that runs both services (:class:`ServiceUnavailable` otherwise,
        with nothing done); an error answer means nothing became visible. Not retried:
        without an answer, it either committed or stays invisible for good.
        """
        parts = [(topic, to_records(messages)) for topic, messages in batches.items()]
        return await self._send(
            self._api.publish_transaction(
                parts, timeout, transactional_id, epoch, acks, group_commits
            )
        )

    async def begin(
        self,
        timeout: float | None = None,
        *,
        transactional_id: str | None = None,
        epoch: int | None = None,
        begin_id: str | None = None,
    ) -> Transaction:
        """Begin a transaction (``timeout`` seconds; the server's default if None).

        The begin carries ``begin_id`` (a fresh random one if None), so it is resent
        per the retry policy when its answer is lost: the server answers the
        transaction that id began, rather than begin another that nobody could end.
        An id is for one begin; one already used for another fails with
        :class:`~tidings.errors.BeginIdConflict` or, once its transaction ended, with
        the error saying how (410)."""
        return await self._send(self._api.begin(timeout, transactional_id, epoch, begin_id))

    async def commit(
        self,
        transaction: Transaction | int,
        changes: Iterable[bytes] = (),
        *,
        transactional_id: str | None = None,
        epoch: int | None = None,
    ) -> None:
        """Commit; :class:`TransactionConflict` if a change key was written meanwhile."""
        await self._send(self._api.commit(_wp(transaction), changes, transactional_id, epoch))

    async def abort(
        self,
        transaction: Transaction | int,
        *,
        transactional_id: str | None = None,
        epoch: int | None = None,
    ) -> TransactionEnd:
        """Abort; its published entries must have been rolled back first (Tephra).

        Says how the transaction stands: aborted (``already`` if an earlier call did),
        or invalid already, having timed out or been invalidated or fenced: the abort
        then succeeds without changing anything, since its writes never show anyway.
        """
        return await self._send(self._api.abort(_wp(transaction), transactional_id, epoch))

    async def invalidate(self, transaction: Transaction | int) -> TransactionEnd:
        """Make a transaction invalid: its writes are never visible. Says whether this
        call invalidated it or it was invalid already (and why)."""
        return await self._send(self._api.invalidate(_wp(transaction)))

    async def cluster(self) -> dict[str, Any]:
        """The instances sharing the server's store (``GET /v1/cluster``): the leader
        with its epoch and lease, and every instance with what it owns, as the JSON
        document docs/api.md describes."""
        return await self._send(self._api.cluster())

    async def transactions(self) -> TransactionState:
        """The transaction service's state: pointers, in-progress and invalid lists."""
        return await self._send(self._api.transactions())

    async def register_producer(self, transactional_id: str) -> ProducerInfo:
        """Register a transactional id: bumps its epoch and fences older holders."""
        return await self._send(self._api.register_producer(transactional_id))

    async def prune(
        self, *, below: int | None = None, ids: Iterable[int] | None = None
    ) -> list[int]:
        """Drop invalid pointers below ``below`` and/or in ``ids`` from the invalid list."""
        return await self._send(self._api.prune(below, ids))
