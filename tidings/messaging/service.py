"""The messaging core: every operation of the messaging service, transport-free.

:class:`MessagingService` wires the pure parts (names, codecs, sequencing, fetching) to
the store. Writes go through ``store.submit`` so keys are assigned inside the write
that makes them visible (invariant 1) and callers learn of success only once it is
durable (invariant 2). Nothing here talks to the transaction service: transactional
reads only evaluate the snapshot the caller passes in (invariant 6).
"""

from __future__ import annotations

import logging
import struct
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from functools import partial
from typing import TypeVar, cast

from tidings.clock import Clock, SystemClock
from tidings.codec import keys, values, wire
from tidings.codec.values import TopicState
from tidings.codec.wire import JSON, AvroItems, Media
from tidings.errors import BadRequest, EmptyPublish, InvalidMessageId
from tidings.messaging import accounting, publishing
from tidings.messaging.counters import Counters, LatencyHistogram, TopicCounters
from tidings.messaging.fetching import PageColumns, fetch_messages, newest_id
from tidings.messaging.names import parse_ttl
from tidings.messaging.plain_pages import PlainPage
from tidings.messaging.retention import Cleaner, CleanupReport, producers_range
from tidings.messaging.topics import Topics
from tidings.names import check_name
from tidings.store.backend import AFTER_ALL_KEYS, ReadView, Store, WriteView
from tidings.structs import (
    Message,
    MessageId,
    PayloadRange,
    Record,
    RollbackInfo,
    TopicEnd,
    TopicMetadata,
    TopicStats,
    Transaction,
)
from tidings.tx.visibility import Visibility, classify

__all__ = ["FetchedFrom", "MessagingConfig", "MessagingService"]

_I64 = struct.Struct(">q")

_log = logging.getLogger(__name__)
T = TypeVar("T")
_MAX_U64 = 2**64 - 1
#: Most ids of one entry the newest-message seek reads (a pointer entry may hold many).
_NEWEST_SCAN = 1_000_000
_META = "metadata"
_MESSAGES = "messages"
#: Columnar pages of a topic that go the general way after a plain page was given up
#: on it (a topic's shape seldom changes; the walk given up costs a second read).
_GENERAL_PAGES = 16


@dataclass(slots=True)
class FetchedFrom:
    """What a fetch given one fills in: the generation of the topic its page was read
    from, in the same store view, so a reader can tell the page's topic from one of the
    same name deleted and created again (a poll answers it as a header)."""

    generation: int | None = None


@dataclass(frozen=True)
class MessagingConfig:
    """Settings of the core. Times in seconds unless named otherwise."""

    default_ttl: int = 7 * 24 * 3600
    fetch_default_limit: int = 1000
    fetch_max_limit: int = 10_000
    #: Most bytes of messages one page holds (past the message that reaches it): a
    #: fetch's ``max_bytes`` when it sets none, and its ceiling.
    fetch_max_bytes: int = 16 << 20
    cleanup_interval: float = 60.0
    cleanup_batch: int = 5_000
    #: Seconds an idempotent producer's sequence state outlives its last publish.
    producer_expiry: float = 7 * 24 * 3600.0

    def __post_init__(self) -> None:
        parse_ttl(self.default_ttl)
        if not 1 <= self.fetch_default_limit <= self.fetch_max_limit:
            raise ValueError("need 1 <= fetch_default_limit <= fetch_max_limit")
        if self.fetch_max_bytes < 1:
            raise ValueError("fetch_max_bytes must be positive")
        if self.cleanup_interval <= 0 or self.cleanup_batch < 1:
            raise ValueError("cleanup_interval and cleanup_batch must be positive")
        if self.producer_expiry <= 0:
            raise ValueError("producer_expiry must be positive")


class MessagingService:
    """Topics, publish, store, rollback, fetch, retention and counters over one store.

    Thread-safe: any number of threads may call it at once. ``close()`` stops the
    background cleaner; it does not close the store.
    """

    def __init__(
        self, store: Store, config: MessagingConfig | None = None, clock: Clock | None = None
    ) -> None:
        self._store = store
        self._config = config if config is not None else MessagingConfig()
        self._clock: Clock = clock if clock is not None else SystemClock()
        self._topics = Topics(store, self._config.default_ttl)
        self._counters = Counters()
        #: Topics whose last plain page was given up: how many more of their columnar
        #: pages go the general way before plain pages are tried again.
        self._general_pages: dict[tuple[str, str], int] = {}
        self._listeners: list[Callable[[str, str], None]] = []
        self._guard: Callable[[int], None] | None = None
        self._committed: Callable[[int], bool] | None = None
        self._cleaner = Cleaner(
            store,
            self._topics,
            self._clock,
            self._config.cleanup_batch,
            producer_expiry_ms=round(self._config.producer_expiry * 1000),
        )
        self._clean_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: Idempotent producers' records as the last cleaner pass left them.
        self._producers: int | None = None

    @property
    def config(self) -> MessagingConfig:
        """The settings this service runs with."""
        return self._config

    # --- topics ------------------------------------------------------------------

    def create_topic(
        self, namespace: str, topic: str, properties: Mapping[str, object] | None = None
    ) -> TopicMetadata:
        """Create a topic (generation 1, or ``abs(old) + 1`` if it existed before).

        Raises InvalidName, InvalidProperties, TopicAlreadyExists.
        """
        return self._topics.create(namespace, topic, properties)

    def update_topic(
        self, namespace: str, topic: str, properties: Mapping[str, object]
    ) -> TopicMetadata:
        """Replace all properties of a topic (an absent ttl means the default again)."""
        return self._topics.update(namespace, topic, properties)

    def get_topic(self, namespace: str, topic: str) -> TopicMetadata:
        """A topic's metadata; TopicNotFound if it does not exist."""
        return self._topics.get(namespace, topic)

    def list_topics(self, namespace: str) -> list[str]:
        """The namespace's topic names, sorted."""
        return self._topics.names(namespace)

    def topic_names(self) -> dict[int, tuple[str, str]]:
        """Every topic id with its ``(namespace, topic)``: what state filed by topic id
        (consumer groups) is reported under."""
        return self._topics.all_names()

    def identity(self, namespace: str, topic: str) -> tuple[int, int]:
        """The live topic's ``(topic_id, generation)``: what state kept beside the topic
        (consumer groups) is filed under. TopicNotFound if it is not live."""
        check_name(namespace, "namespace")
        check_name(topic, "topic")
        with self._store.read() as view:
            ref = self._topics.resolve(view, namespace, topic)
        return ref.topic_id, ref.state.generation

    def knows_live(self, namespace: str, topic: str) -> bool:
        """True if memory holds the topic as live: a publish, store or rollback on it
        then reads nothing from the store before its write is queued. Otherwise
        :meth:`identity`, where reading may wait, reads the topic and remembers it
        (or raises as the write would)."""
        return self._topics.known_live(namespace, topic)

    def end(self, namespace: str, topic: str, snapshot: Transaction | None) -> TopicEnd:
        """Where the topic ends: its newest message, and (with ``snapshot``, a fresh one
        from the transaction service) the first message of the oldest transaction still
        open on it. Seeks and a walk over the markers of the transactions that published
        here, never over the topic. Markers of transactions that have ended are dropped
        in passing (a separate write, not waited for)."""
        now = self._clock.now_ms()
        with self._store.read() as view:
            ref = self._topics.resolve(view, namespace, topic)
            newest = _newest(view, ref.topic_id, ref.state, now)
            if snapshot is None:
                return TopicEnd(newest, None, stable_known=False)
            stable = self._stable(view, ref.topic_id, ref.state.generation, snapshot)
        return TopicEnd(newest, stable)

    def last_stable(self, namespace: str, topic: str, snapshot: Transaction) -> MessageId | None:
        """The first message of the oldest transaction open on the topic in
        ``snapshot``, or None (the ``last_stable_id`` of :meth:`end`, without the rest)."""
        with self._store.read() as view:
            ref = self._topics.resolve(view, namespace, topic)
            return self._stable(view, ref.topic_id, ref.state.generation, snapshot)

    def _stable(
        self, view: ReadView, topic_id: int, generation: int, snapshot: Transaction
    ) -> MessageId | None:
        start, stop = keys.open_range(topic_id, generation)
        first_open: bytes | None = None
        ended: list[bytes] = []
        for key, value in view.scan(_META, start, stop):
            wp = keys.open_write_pointer(key)
            # Open exactly where a read-committed poll stops: in progress in the
            # snapshot, or begun after it; an invalid transaction has ended (its
            # entries are skipped), even where no commit moved the read pointer past it.
            if classify(snapshot, wp) == Visibility.BLOCK:
                if first_open is None or value < first_open:
                    first_open = value
            else:
                ended.append(key)
        if ended:
            self._store.submit(partial(_drop_keys, ended))
        if first_open is None:
            return None
        ts, seq = keys.parse_ts_seq(first_open)
        return MessageId(ts, seq, 0, 0)

    def delete_topic(self, namespace: str, topic: str) -> None:
        """Delete a topic: its messages become invisible at once; the cleaner drops them."""
        self._topics.delete(namespace, topic)
        self._counters.forget((namespace, topic))

    # --- publishing ----------------------------------------------------------------

    def publish(
        self,
        namespace: str,
        topic: str,
        messages: publishing.Messages,
        write_pointer: int | None = None,
        payload_ranges: Sequence[PayloadRange] | None = None,
        producer: tuple[bytes, int] | None = None,
    ) -> RollbackInfo | None:
        """Append ``messages`` to the topic; returns once they are durable.

        With ``write_pointer`` the publish is transactional and returns the rollback
        info; with a write pointer and no messages it publishes the Payload Table rows
        stored under that pointer (one Message Table entry). ``payload_ranges`` (the
        :class:`PayloadRange` values ``store`` returned) narrows that to the rows inside
        them: one entry per range, in ascending order; rows outside every range stay
        invisible. Without a write pointer or messages, EmptyPublish.
        """
        return self.publish_future(
            namespace, topic, messages, write_pointer, payload_ranges, producer
        ).result()

    def publish_future(
        self,
        namespace: str,
        topic: str,
        messages: publishing.Messages,
        write_pointer: int | None = None,
        payload_ranges: Sequence[PayloadRange] | None = None,
        producer: tuple[bytes, int] | None = None,
    ) -> Future[RollbackInfo | None]:
        """:meth:`publish` without waiting: bad input raises here, at once; the future
        resolves once the messages are durable (or with the storage error).

        ``producer`` makes a non-transactional publish idempotent: ``(producer id (16
        bytes), sequence number)``. A sequence the producer already wrote on the topic
        is answered as done without a second copy; one past the next is
        :class:`~tidings.errors.OutOfOrderSequence`."""
        began = time.perf_counter()
        self._topics.check_live(namespace, topic)
        if producer is not None:
            _check_producer(producer, write_pointer)
        if write_pointer is not None:
            publishing.check_write_pointer(write_pointer)
        elif not messages:
            raise EmptyPublish("a publish without a write pointer needs at least one message")
        ranges = _ranges(payload_ranges, write_pointer, messages)
        batch = publishing.encode_batch(messages, write_pointer, self._clock.now_ms())
        # A retry of an idempotent batch written already writes nothing: not counted as
        # published (the traffic counters and rates would count the batch twice).
        retried: list[bool] = []
        fn = publishing.publish_fn(
            self._topics,
            self._clock,
            namespace,
            topic,
            batch,
            write_pointer,
            ranges,
            self._guard,
            producer,
            None if producer is None else partial(retried.append, True),
        )
        return self._submit(
            fn, namespace, topic, began, len(batch), batch.size, inline=True, retried=retried
        )

    def publish_with_future(
        self,
        namespace: str,
        topic: str,
        messages: Sequence[Record | bytes],
        also: Callable[[WriteView], T],
    ) -> Future[T]:
        """Publish ``messages`` (non-transactionally) and run ``also`` in the same write
        transaction: both are durable together, or neither happened. A queue moves a
        message to its dead-letter topic this way, taking it out of its lease in the
        same write. Bad input raises here, at once."""
        began = time.perf_counter()
        self._topics.check_live(namespace, topic)
        if not messages:
            raise EmptyPublish("a publish without a write pointer needs at least one message")
        batch = publishing.encode_batch(messages, None, self._clock.now_ms())
        publish = publishing.publish_fn(self._topics, self._clock, namespace, topic, batch, None)

        def both(view: WriteView) -> T:
            publish(view)
            return also(view)

        return self._submit(both, namespace, topic, began, len(batch), batch.size)

    def publish_all_future(
        self,
        namespace: str,
        batches: Sequence[tuple[str, publishing.Messages]],
        write_pointer: int | None = None,
        payload_ranges: Mapping[str, Sequence[PayloadRange]] | None = None,
        then: Callable[[WriteView], None] | None = None,
    ) -> Future[list[RollbackInfo | None]]:
        """Several publishes (``(topic, messages)``, in order) in one write transaction:
        all become durable together, or none is written (the future then carries the
        first error, e.g. a topic deleted meanwhile). Bad input raises here, at once.
        ``payload_ranges`` maps a topic of a pointer publish (no messages) to the ranges
        to publish there, as in :meth:`publish`. Resolves to each batch's
        :meth:`publish` result, in order.

        ``then(view)`` runs last in the same write function (the commit of a one-write
        transaction, :meth:`~tidings.tx.TransactionManager.commit_in_write`), in place
        of the publish guard (:meth:`guard_publishes`): it must refuse, by raising, a
        write pointer the guard would refuse. The guard cannot run there, because the
        store may run the function again after ``then`` committed the transaction."""
        began = time.perf_counter()
        if write_pointer is not None:
            publishing.check_write_pointer(write_pointer)
        fns = []
        counts: list[tuple[tuple[str, str], int, int]] = []
        for topic, messages in batches:
            self._topics.check_live(namespace, topic)
            if write_pointer is None and not messages:
                raise EmptyPublish("a publish without a write pointer needs at least one message")
            ranges = _ranges(
                None if payload_ranges is None else payload_ranges.get(topic),
                write_pointer,
                messages,
            )
            batch = publishing.encode_batch(messages, write_pointer, self._clock.now_ms())
            fns.append(
                publishing.publish_fn(
                    self._topics,
                    self._clock,
                    namespace,
                    topic,
                    batch,
                    write_pointer,
                    ranges,
                    self._guard if then is None else None,
                )
            )
            counts.append(((namespace, topic), len(batch), batch.size))
        result: Future[list[RollbackInfo | None]] = Future()

        def done(inner: Future[list[RollbackInfo | None]]) -> None:
            exc = inner.exception()
            if exc is not None:
                result.set_exception(exc)
                return
            elapsed = time.perf_counter() - began
            for key, messages, size in counts:
                self._counters.published(key, messages, size, elapsed)
            for key in dict.fromkeys(key for key, _, _ in counts):
                self._notify(*key)
            result.set_result(inner.result())

        write = publishing.publish_all_fn(fns)
        if then is not None:
            publish_all = write

            def write(view: WriteView) -> list[RollbackInfo | None]:
                infos = publish_all(view)
                then(view)
                return infos

        self._store.submit_inline(write).add_done_callback(done)
        return result

    def store_payloads(
        self,
        namespace: str,
        topic: str,
        write_pointer: int,
        messages: publishing.Messages,
    ) -> PayloadRange:
        """Store payloads under ``write_pointer`` in the Payload Table; returns once
        durable. They become visible when that pointer is published. Returns the range
        of positions they got, which a pointer publish can name to expose exactly them."""
        return self.store_future(namespace, topic, write_pointer, messages).result()

    def store_future(
        self,
        namespace: str,
        topic: str,
        write_pointer: int,
        messages: publishing.Messages,
    ) -> Future[PayloadRange]:
        """:meth:`store_payloads` without waiting (bad input raises at once)."""
        began = time.perf_counter()
        self._topics.check_live(namespace, topic)
        publishing.check_write_pointer(write_pointer)
        if not messages:
            raise EmptyPublish("a store needs at least one message")
        batch = publishing.encode_batch(messages, None, self._clock.now_ms())
        fn = publishing.store_fn(
            self._topics, self._clock, namespace, topic, batch, write_pointer, self._guard
        )
        return self._submit(fn, namespace, topic, began, len(batch), batch.size)

    def rollback(self, namespace: str, topic: str, info: RollbackInfo) -> int:
        """Invert the sign of ``t`` on exactly the entries ``info`` names; returns how many
        entries changed (0 if none carries that write pointer any more)."""
        return self.rollback_future(namespace, topic, info).result()

    def rollback_future(self, namespace: str, topic: str, info: RollbackInfo) -> Future[int]:
        """:meth:`rollback` without waiting (bad input raises at once)."""
        self._topics.check_live(namespace, topic)
        if not isinstance(info, RollbackInfo):
            raise BadRequest(f"rollback needs a RollbackInfo, got {type(info).__name__}")
        publishing.check_rollback_info(info)
        fn = publishing.rollback_fn(self._topics, namespace, topic, info, self._committed)
        return self._submit(fn, namespace, topic, None, 0, 0)

    def _submit(
        self,
        fn: Callable[[WriteView], T],
        namespace: str,
        topic: str,
        began: float | None,
        messages: int,
        size: int,
        inline: bool = False,
        retried: list[bool] | None = None,
    ) -> Future[T]:
        # A future of our own, resolved after counting and notifying, so a caller that
        # wakes up on it sees the counters and long-polls already updated. ``retried``
        # is not empty once the write found its batch written already: nothing new.
        result: Future[T] = Future()
        key = (namespace, topic)

        def done(inner: Future[T]) -> None:
            exc = inner.exception()
            if exc is not None:
                result.set_exception(exc)
                return
            if retried:
                result.set_result(inner.result())
                return
            if began is not None:
                self._counters.published(key, messages, size, time.perf_counter() - began)
            self._notify(namespace, topic)
            result.set_result(inner.result())

        # A publish may commit right here, on the server's event loop, when nothing
        # else is going on (Store.submit_inline); the done callback then runs at once.
        submit = self._store.submit_inline if inline else self._store.submit
        submit(fn).add_done_callback(done)
        return result

    # --- consuming -----------------------------------------------------------------

    def fetch(
        self,
        namespace: str,
        topic: str,
        *,
        start: MessageId | int | None = None,
        inclusive: bool = True,
        limit: int | None = None,
        transaction: Transaction | None = None,
        max_bytes: int | None = None,
        count: bool = True,
    ) -> list[Message]:
        """Messages in id order from ``start`` (an id, a timestamp in ms, or None for
        the oldest live message), at most ``limit`` (default and maximum configured),
        and none past the message that brings them to ``max_bytes`` (default and
        maximum ``fetch_max_bytes``; how bytes count: :func:`fetch_messages`).
        ``count=False``: a read of the server's own (a lag or depth count, a long
        poll's fetch counted once with :meth:`count_fetch`), not a fetch in the counters.

        With ``transaction`` only entries visible in that snapshot are returned and the
        fetch stops before the first entry of a transaction in progress; without it,
        everything written is returned, rolled-back entries included.
        """
        items = self._fetch(
            namespace, topic, start, inclusive, limit, transaction, None,
            max_bytes=max_bytes, count=count,
        )  # fmt: skip
        return cast("list[Message]", items)

    def fetch_ids(
        self,
        namespace: str,
        topic: str,
        *,
        start: MessageId | int | None = None,
        inclusive: bool = True,
        limit: int | None = None,
        transaction: Transaction | None = None,
        count: bool = True,
    ) -> list[MessageId]:
        """The ids of the messages :meth:`fetch` returns, without their payloads (to
        find where a range ends, or to count it, without carrying the data)."""
        raw = self._fetch_ids(namespace, topic, start, inclusive, limit, transaction, count)
        return [MessageId.from_bytes(item) for item in raw]

    def fetch_ids_encoded(
        self,
        namespace: str,
        topic: str,
        media: Media,
        *,
        start: MessageId | int | None = None,
        inclusive: bool = True,
        limit: int | None = None,
        transaction: Transaction | None = None,
        count: bool = True,
        source: FetchedFrom | None = None,
    ) -> tuple[bytes, int, MessageId | None]:
        """:meth:`fetch_ids` as an ids-only poll response body in ``media``, with the
        count and the last id (as :meth:`fetch_encoded`); the ids go from the store's
        keys into the body without a :class:`MessageId` each."""
        raw = self._fetch_ids(namespace, topic, start, inclusive, limit, transaction, count, source)
        last = MessageId.from_bytes(raw[-1]) if raw else None
        return wire.encode_raw_message_ids(raw, media), len(raw), last

    def held_ids(self, namespace: str, topic: str, ids: Sequence[MessageId]) -> set[MessageId]:
        """Those of ``ids`` that the topic still holds (not past its retention or their
        own expiry), read in one view with a seek each: a queue hands out again only
        messages a reader could still see."""
        check_name(namespace, "namespace")
        check_name(topic, "topic")
        found: set[MessageId] = set()
        if not ids:
            return found
        now = self._clock.now_ms()
        with self._store.read() as view:
            ref = self._topics.resolve(view, namespace, topic)
            for message_id in ids:
                page = fetch_messages(
                    view, ref.topic_id, ref.state, now, message_id, True, 1, None, ids=True
                )
                if page and page[0] == message_id.to_bytes():
                    found.add(message_id)
        return found

    def _fetch_ids(
        self,
        namespace: str,
        topic: str,
        start: MessageId | int | None,
        inclusive: bool,
        limit: int | None,
        transaction: Transaction | None,
        count: bool = True,
        source: FetchedFrom | None = None,
    ) -> list[bytes]:
        # Not bounded by bytes: an id is 20 of them, whatever its message holds.
        items = self._fetch(
            namespace, topic, start, inclusive, limit, transaction, None, True, count=count,
            source=source,
        )  # fmt: skip
        return cast("list[bytes]", items)  # with ids=True every item is a 20-byte id

    def fetch_items(
        self,
        namespace: str,
        topic: str,
        media: Media,
        *,
        start: MessageId | int | None = None,
        inclusive: bool = True,
        limit: int | None = None,
        transaction: Transaction | None = None,
        max_bytes: int | None = None,
        count: bool = True,
        source: FetchedFrom | None = None,
    ) -> list[Message | bytes]:
        """:meth:`fetch`, with plain messages as their items of an Avro poll response in
        ``media`` (``bytes``, see :func:`tidings.codec.wire.avro_messages`) and the
        others as :class:`Message`; all of them :class:`Message` for JSON."""
        avro = AvroItems.for_media(media)
        return self._fetch(
            namespace, topic, start, inclusive, limit, transaction, avro,
            max_bytes=max_bytes, count=count, source=source,
        )  # fmt: skip

    def fetch_encoded(
        self,
        namespace: str,
        topic: str,
        media: Media,
        *,
        start: MessageId | int | None = None,
        inclusive: bool = True,
        limit: int | None = None,
        transaction: Transaction | None = None,
        max_bytes: int | None = None,
        count: bool = True,
        source: FetchedFrom | None = None,
    ) -> tuple[bytes, int, MessageId | None]:
        """:meth:`fetch`, answered as a poll response body in ``media`` directly: the
        body, the number of messages in it and the last one's id (None if empty, for
        the ``Tidings-Last-Id`` header). For Avro, plain messages go from the store into
        the body without a :class:`Message` each (the consumer's hot path)."""
        items = self.fetch_items(
            namespace, topic, media, start=start, inclusive=inclusive, limit=limit,
            transaction=transaction, max_bytes=max_bytes, count=count, source=source,
        )  # fmt: skip
        last: MessageId | None = None
        if items:
            item = items[-1]
            # A pre-encoded Avro item starts with the id: length byte 0x28, 20 bytes.
            last = item.id if isinstance(item, Message) else MessageId.from_bytes(item[1:21])
        if media is JSON:
            body = wire.encode_messages(cast("list[Message]", items), media)
        else:
            body = wire.avro_messages(items, media)
        return body, len(items), last

    def fetch_columns(
        self,
        namespace: str,
        topic: str,
        *,
        start: MessageId | int | None = None,
        inclusive: bool = True,
        limit: int | None = None,
        transaction: Transaction | None = None,
        max_bytes: int | None = None,
        count: bool = True,
        source: FetchedFrom | None = None,
    ) -> tuple[bytes, int, MessageId | None]:
        """:meth:`fetch_encoded` as a columnar poll response
        (:mod:`tidings.codec.columns`): plain and short-keyed messages go from the store
        into the columns without a :class:`Message` each, and a page of plain messages
        only goes a batch entry at a time (:mod:`tidings.messaging.plain_pages`)."""
        topic_key = (namespace, topic)
        general = self._general_pages.get(topic_key, 0)
        if general:
            # A plain page was given up here lately: the topic is likely not plain.
            if general == 1:
                self._general_pages.pop(topic_key, None)
            else:
                self._general_pages[topic_key] = general - 1
        else:
            plain = PlainPage()
            self._fetch(
                namespace, topic, start, inclusive, limit, transaction, None,
                columns=plain, max_bytes=max_bytes, count=count, source=source,
            )  # fmt: skip
            if plain.complete:
                return plain.encode(), len(plain), plain.last_id()
            self._general_pages[topic_key] = _GENERAL_PAGES
        columns = self.fetch_page_columns(
            namespace, topic, start=start, inclusive=inclusive, limit=limit,
            transaction=transaction, max_bytes=max_bytes, count=count, source=source,
        )  # fmt: skip
        ids = columns.ids
        last = MessageId.from_bytes(ids[-1]) if ids else None
        return columns.encode(), len(ids), last

    def fetch_page_columns(
        self,
        namespace: str,
        topic: str,
        *,
        start: MessageId | int | None = None,
        inclusive: bool = True,
        limit: int | None = None,
        transaction: Transaction | None = None,
        max_bytes: int | None = None,
        count: bool = True,
        source: FetchedFrom | None = None,
    ) -> PageColumns:
        """:meth:`fetch_columns` not encoded yet: the page's columns (what group pages
        hold, each member's answer a selection of its rows; ``cut`` says the page
        stopped at ``max_bytes``)."""
        columns = PageColumns()
        self._fetch(
            namespace, topic, start, inclusive, limit, transaction, None,
            columns=columns, max_bytes=max_bytes, count=count, source=source,
        )  # fmt: skip
        return columns

    def _fetch(
        self,
        namespace: str,
        topic: str,
        start: MessageId | int | None,
        inclusive: bool,
        limit: int | None,
        transaction: Transaction | None,
        avro: AvroItems | None,
        ids: bool = False,
        columns: PageColumns | PlainPage | None = None,
        max_bytes: int | None = None,
        count: bool = True,
        source: FetchedFrom | None = None,
    ) -> list[Message | bytes]:
        check_name(namespace, "namespace")
        check_name(topic, "topic")
        checked_limit = self._limit(limit)
        checked_bytes = self.max_bytes(max_bytes)
        _check_start(start)
        if transaction is not None and not isinstance(transaction, Transaction):
            raise BadRequest(f"transaction must be a Transaction, got {type(transaction)}")
        with self._store.read() as view:
            ref = self._topics.resolve(view, namespace, topic)
            if source is not None:
                source.generation = ref.state.generation
            out = fetch_messages(
                view,
                ref.topic_id,
                ref.state,
                self._clock.now_ms(),
                start,
                bool(inclusive),
                checked_limit,
                transaction,
                avro,
                ids=ids,
                columns=columns,
                max_bytes=checked_bytes,
            )
        if not count or (isinstance(columns, PlainPage) and not columns.complete):
            return out  # given up: the page is fetched again, and counted then
        fetched = len(out) if columns is None else len(columns)
        self._counters.fetched((namespace, topic), fetched)
        return out

    def count_fetch(self, namespace: str, topic: str, messages: int) -> None:
        """Count one poll that returned ``messages`` messages, whose fetches were made
        with ``count=False`` (a long poll fetches again each time it is woken)."""
        self._counters.fetched((namespace, topic), messages)

    def max_bytes(self, max_bytes: object) -> int:
        """A fetch's byte bound: ``max_bytes`` checked and capped at
        ``fetch_max_bytes`` (which None means); BadRequest if it is not a positive
        integer."""
        most = self._config.fetch_max_bytes
        return _bounded(max_bytes, "max_bytes", most, most)

    def _limit(self, limit: object) -> int:
        config = self._config
        return _bounded(limit, "limit", config.fetch_default_limit, config.fetch_max_limit)

    def stats(self, namespace: str, topic: str) -> TopicStats:
        """The topic's live contents (what a non-transactional reader would get) and
        traffic, at the same cost however large the topic is: the count and payload
        bytes are kept in the topic's state by the writes that change them, the oldest
        and newest ids are seeks.

        A message counts until the cleaner deletes it: one past the topic's TTL or its
        own expiry, which fetch already hides, counts until the next cleaner pass (at
        most ``cleanup_interval`` later, as Kafka counts a log segment until it is
        deleted). A rolled-back message counts (non-transactional readers get it). A
        topic whose data predates kept counts is counted once, by reading it, on its
        first call. TopicNotFound if the topic does not exist.
        """
        check_name(namespace, "namespace")
        check_name(topic, "topic")
        state, oldest, newest = self._contents(namespace, topic)
        if state.message_count < 0:
            self._store.apply(accounting.migrate_fn(self._topics, namespace, topic))
            state, oldest, newest = self._contents(namespace, topic)
        counters = self._counters.get((namespace, topic))
        publish_rate, fetch_rate = self._counters.rates((namespace, topic))
        return TopicStats(
            namespace=namespace,
            topic=topic,
            message_count=max(state.message_count, 0),
            bytes=max(state.payload_bytes, 0),
            oldest_id=oldest,
            newest_id=newest,
            oldest_time=None if oldest is None else oldest.publish_ts,
            newest_time=None if newest is None else newest.publish_ts,
            messages_published=counters.messages_published,
            bytes_published=counters.bytes_published,
            fetches=counters.fetches,
            publish_rate=publish_rate,
            fetch_rate=fetch_rate,
        )

    def _contents(
        self, namespace: str, topic: str
    ) -> tuple[TopicState, MessageId | None, MessageId | None]:
        """The topic's state, oldest and newest live message, in one read snapshot."""
        now = self._clock.now_ms()
        with self._store.read() as view:
            ref = self._topics.resolve(view, namespace, topic)
            first = fetch_messages(
                view, ref.topic_id, ref.state, now, None, True, 1, None, ids=True
            )
            newest = _newest(view, ref.topic_id, ref.state, now)
        oldest = MessageId.from_bytes(cast(bytes, first[0])) if first else None
        return ref.state, oldest, newest

    # --- listeners and counters ------------------------------------------------------

    def guard_publishes(self, check: Callable[[int], None] | None) -> None:
        """Run ``check(write_pointer)`` inside the write function of every publish with
        a write pointer (and every store), in the write transaction: if it raises,
        nothing of that write happens and its caller gets the error. The server passes
        the transaction manager's :meth:`~tidings.tx.TransactionManager.check_writable`
        when it runs both services, so nothing is published under a transaction that
        has ended (which is what makes pruning the invalid list safe, see
        :meth:`referenced_pointers`). None (the default) checks nothing."""
        self._guard = check

    def guard_rollbacks(self, committed: Callable[[int], bool] | None) -> None:
        """Ask ``committed(write_pointer)`` inside the write function of every rollback:
        if true, the rollback changes nothing and answers 0. The server passes the
        transaction manager's :meth:`~tidings.tx.TransactionManager.has_committed`
        when it runs both services, so a rollback after the commit (one whose answer
        was lost, or anyone's who may publish to the topic) cannot take committed
        messages away from readers. None (the default) checks nothing."""
        self._committed = committed

    def barrier(self) -> None:
        """Wait until every write function submitted before this call has committed
        (or failed): an empty write queued behind them, in the writer's order."""
        self._store.apply(lambda view: None)

    def referenced_pointers(
        self,
        candidates: Iterable[int],
        *,
        chunk: int = 10_000,
        pause: float = 0.0,
        cancelled: Callable[[], bool] | None = None,
    ) -> set[int]:
        """Those of ``candidates`` (positive write pointers) that a Message Table entry
        still names, not rolled back, in any topic or generation: a scan of the whole
        table, ``chunk`` entries per read snapshot, sleeping ``pause`` seconds between
        chunks so a large table does not hold the CPU.

        An invalid pointer no entry names can be pruned from the invalid list only if no
        entry can name it later either: publishes must be guarded
        (:meth:`guard_publishes`) and the scan must start after :meth:`barrier` has let
        every publish that passed the guard before the pointer ended commit. If
        ``cancelled()`` turns true between chunks, the scan stops and reports every
        candidate as named (the safe answer).
        """
        wanted = {int(c) for c in candidates}
        found: set[int] = set()
        start = b""
        while wanted - found:
            with self._store.read() as view:
                batch = list(view.scan("messages", start, AFTER_ALL_KEYS, chunk))
            for _, value in batch:
                if value[0] & values.FLAG_T:
                    (wp,) = _I64.unpack_from(value, 1)
                    if wp in wanted:
                        found.add(wp)
            if len(batch) < chunk:
                break
            start = batch[-1][0] + b"\0"
            if cancelled is not None and cancelled():
                return wanted
            if pause > 0:
                time.sleep(pause)
        return found

    def add_listener(self, fn: Callable[[str, str], None]) -> None:
        """Call ``fn(namespace, topic)`` after each durable publish, store or rollback.

        It runs on the store's commit thread: it must not block (the server uses it to
        wake long-polls). Its exceptions are logged and ignored.
        """
        self._listeners = [*self._listeners, fn]

    def _notify(self, namespace: str, topic: str) -> None:
        for fn in self._listeners:
            try:
                fn(namespace, topic)
            except Exception:
                _log.exception("messaging listener %r failed", fn)

    def counters(self) -> Mapping[tuple[str, str], TopicCounters]:
        """A snapshot of every topic's counters, keyed by ``(namespace, topic)``."""
        return self._counters.snapshot()

    def publish_latency(self) -> LatencyHistogram:
        """Publish and store latency (call to durable) of every topic since the service
        started, topics deleted since included."""
        return self._counters.latency()

    # --- retention -----------------------------------------------------------------

    def clean_once(self) -> CleanupReport:
        """One full cleaner pass, in bounded batches (also what the thread runs)."""
        with self._clean_lock:
            report = self._cleaner.run_once()
            self._producers = report.producers
            return report

    def producer_records(self) -> int:
        """How many idempotent producers' records (one per producer id and topic
        generation) the store holds, as the last cleaner pass counted them: the pass
        reads them all anyway, so between passes this costs nothing. Before the first
        pass, counted now."""
        counted = self._producers
        if counted is not None:
            return counted
        start, stop = producers_range()
        with self._store.read() as view:
            return sum(1 for _ in view.scan(_META, start, stop))

    def start(self) -> None:
        """Start the background cleaner (a daemon thread), every ``cleanup_interval``."""
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._clean_loop, name="tidings-messaging-cleaner", daemon=True
        )
        self._thread.start()

    def _clean_loop(self) -> None:
        while not self._stop.wait(self._config.cleanup_interval):
            try:
                report = self.clean_once()
            except Exception:
                # A failed pass (e.g. a storage error) is retried next interval.
                _log.exception("messaging cleaner pass failed")
                continue
            if report.messages_deleted or report.payloads_deleted:
                _log.info("cleaner: %s", report)

    def close(self) -> None:
        """Stop the cleaner thread. The store stays open (its owner closes it)."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join()


def _bounded(value: object, name: str, default: int, most: int) -> int:
    """A fetch's count or byte bound: ``default`` for None, else ``value`` capped at
    ``most``; BadRequest unless it is a positive integer."""
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(f"{name} must be an integer, got {value!r}")
    if value < 1:
        raise BadRequest(f"{name} must be at least 1, got {value}")
    return min(value, most)


def _ranges(
    payload_ranges: Sequence[PayloadRange] | None,
    write_pointer: int | None,
    messages: publishing.Messages,
) -> list[PayloadRange] | None:
    # Ranges only narrow a pointer publish; with messages they would mean nothing.
    if payload_ranges is None:
        return None
    if write_pointer is None or messages:
        raise BadRequest("payload ranges need a write pointer and no messages")
    return publishing.check_payload_ranges(payload_ranges)


def _check_start(start: object) -> None:
    if start is None or isinstance(start, MessageId):
        if isinstance(start, MessageId):
            fields = (start.publish_ts, start.seq, start.write_ts, start.p_seq)
            try:
                start.to_bytes()
            except Exception:
                raise InvalidMessageId(f"message id fields out of range: {fields}") from None
        return
    if isinstance(start, bool) or not isinstance(start, int):
        raise BadRequest(f"start must be a message id, a timestamp or None, got {start!r}")
    if not 0 <= start <= _MAX_U64 - 1:
        raise BadRequest(f"start timestamp must be a non-negative int64, got {start}")


def _newest(view: ReadView, topic_id: int, state: TopicState, now: int) -> MessageId | None:
    """The newest live message, by a seek (or one per entry past its own expiry)."""
    found = newest_id(view, topic_id, state, now, _NEWEST_SCAN)
    return None if found is None else MessageId.from_bytes(found)


def _drop_keys(doomed: list[bytes], view: WriteView) -> None:
    for key in doomed:
        view.delete(_META, key)


def _check_producer(producer: tuple[bytes, int], write_pointer: int | None) -> None:
    producer_id, sequence = producer
    if write_pointer is not None:
        raise BadRequest("an idempotent publish is non-transactional (no write pointer)")
    if not isinstance(producer_id, bytes) or len(producer_id) != 16:
        raise BadRequest("a producer id is 16 bytes (32 hex digits)")
    if isinstance(sequence, bool) or not isinstance(sequence, int) or not 0 <= sequence < 2**63:
        raise BadRequest("a sequence number is a non-negative 64-bit integer")
