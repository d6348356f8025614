"""The write protocol: one transaction per write, payloads stored by executors, one
publish per topic at commit (the payload path CDAP TMS uses when a message's write
time is not close to its transaction's commit time), and for streams a marker that
makes a replayed batch a no-op.

For a streaming sink ``sinkId`` the driver, when it plans each micro-batch,

1. registers the transactional id ``tidings-spark-sink-<sinkId>`` -- a new epoch, which
   fences every older holder: the transactions they left open are invalidated and
   their later commits fail with :class:`~tidings.errors.ProducerFenced` (a Python
   worker that outlived a killed driver cannot finish an old commit);
2. begins the batch's transaction under that epoch; executors ``store`` their rows
   under its write pointer, and each task attempt reports the
   :class:`~tidings.structs.PayloadRange` of every store it made;

and when Spark commits the batch it

3. reads the control topic ``__tidings_sink_<sinkId>`` read-committed: if a marker for
   this batch id (or a later one) is there, the batch was published before Spark could
   record it -- abort, publish nothing;
4. publishes, on every topic written, exactly the ranges reported by the task attempts
   Spark committed (rows a failed or losing attempt stored under the same write pointer
   stay outside every range and are never seen), and the marker
   ``{sinkId, batchId, writePointer}`` on the control topic, in the same transaction;
5. commits (with the epoch). Output and marker become visible in that one commit, or
   neither does (invariant 4): "recorded" and "published" cannot come apart.

A commit that fails for sure is undone (rollback of every entry published, then abort;
invalidate if a rollback or a publish's outcome is unknown). A commit without an answer
is settled by invalidating: :class:`TransactionCommitted` means it did commit.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from tidings.client import Client
from tidings.client.base import MessageLike
from tidings.codec.media import AVRO_EXT
from tidings.errors import (
    ClientError,
    Forbidden,
    ServerError,
    TidingsError,
    TopicAlreadyExists,
    TopicNotFound,
    TransactionCommitted,
    TransactionNotInProgress,
)
from tidings.structs import MessageId, PayloadRange, Record, RollbackInfo

__all__ = [
    "CONTROL_PREFIX",
    "MARKER_TTL",
    "SinkTransaction",
    "begin_write",
    "control_topic",
    "end_write",
    "last_committed_batch",
    "marker",
    "publish_and_commit",
    "range_size",
    "store_encoded",
    "store_rows",
    "store_stream",
    "transactional_id",
]

CONTROL_PREFIX = "__tidings_sink_"
#: How long markers live (seconds): a query restarted later than this after a crash
#: between its publish and Spark's checkpoint could replay that one batch.
MARKER_TTL = 30 * 24 * 3600
#: Time windows (ms before now) searched for the newest marker before the whole topic.
_MARKER_WINDOWS = (60_000, 3_600_000, 86_400_000, 7 * 86_400_000)


def control_topic(sink_id: str) -> str:
    """The topic holding a streaming sink's batch markers."""
    return CONTROL_PREFIX + sink_id


def transactional_id(sink_id: str) -> str:
    """The transactional id a streaming sink registers (and so fences older holders)."""
    return f"tidings-spark-sink-{sink_id}"


@dataclass(frozen=True, slots=True)
class SinkTransaction:
    """The transaction one write (or micro-batch) stores under; travels to executors
    and, in their commit messages, back to the driver's commit."""

    write_pointer: int
    transactional_id: str | None = None
    epoch: int | None = None
    sink_id: str | None = None


def begin_write(client: Client, timeout: float, sink_id: str | None) -> SinkTransaction:
    """Begin the transaction of a batch write, or (with ``sink_id``) of a micro-batch,
    registering the sink's transactional id first so that older holders are fenced."""
    if sink_id is None:
        return SinkTransaction(client.begin(timeout).write_pointer)
    control = control_topic(sink_id)
    try:
        client.create_topic(control, ttl=MARKER_TTL)
    except TopicAlreadyExists:
        pass
    except Forbidden as refused:
        # With an auth file only an admin creates topics (before the server looks
        # whether it exists): a sink that is no admin uses the one an admin made.
        try:
            client.get_topic(control)
        except TopicNotFound:
            raise Forbidden(
                f"{refused.message}: the sink's control topic {control} does not exist, "
                "and only an admin may create it (docs/spark.md)"
            ) from None
    tid = transactional_id(sink_id)
    producer = client.register_producer(tid)
    tx = client.begin(timeout, transactional_id=tid, epoch=producer.epoch)
    return SinkTransaction(tx.write_pointer, tid, producer.epoch, sink_id)


def store_rows(
    client: Client,
    write_pointer: int,
    rows: Iterable[tuple[str, Record]],
    *,
    max_records: int,
    max_bytes: int,
) -> dict[str, list[PayloadRange]]:
    """Store ``(topic, record)`` rows under ``write_pointer`` in batches, keeping each
    topic's rows in their order; returns, per topic, the range of every store made, in
    order (publishing exactly these exposes exactly these rows)."""
    buffers: dict[str, list[MessageLike]] = {}
    sizes: dict[str, int] = {}
    ranges: dict[str, list[PayloadRange]] = {}

    def flush(topic: str) -> None:
        batch = buffers.pop(topic, None)
        sizes.pop(topic, None)
        if batch:
            stored = client.store(topic, batch, write_pointer=write_pointer)
            ranges.setdefault(topic, []).append(stored)

    for topic, record in rows:
        buffer = buffers.setdefault(topic, [])
        buffer.append(record)
        sizes[topic] = sizes.get(topic, 0) + len(record.payload) + 64
        if len(buffer) >= max_records or sizes[topic] >= max_bytes:
            flush(topic)
    for topic in list(buffers):
        flush(topic)
    return ranges


def store_encoded(client: Client, topic: str, body: bytes, write_pointer: int) -> PayloadRange:
    """``client.store`` of a request body already encoded (``PublishRequestExt``, as
    :func:`tidings.spark.bodies.store_bodies` builds it from Arrow columns)."""
    if client.media is not AVRO_EXT:
        raise ValueError(
            f"encoded store bodies are {AVRO_EXT.value}, the client sends {client.media}"
        )
    return client.store_encoded(topic, body, write_pointer=write_pointer)


def store_stream(
    client: Client, write_pointer: int, bodies: Iterable[tuple[str, bytes]], *, ahead: int = 2
) -> dict[str, list[PayloadRange]]:
    """Send ``(topic, body)`` stores in order on a second thread, at most ``ahead``
    waiting, while this thread builds the next bodies (and Spark's worker keeps
    reading rows from the JVM). One store at a time keeps a topic's rows in their
    order; returns each topic's store ranges in order, as :func:`store_rows`."""
    ranges: dict[str, list[PayloadRange]] = {}
    pending: deque[tuple[str, Future[PayloadRange]]] = deque()

    def settle_one() -> None:
        topic, future = pending.popleft()
        ranges.setdefault(topic, []).append(future.result())

    with ThreadPoolExecutor(1, thread_name_prefix="tidings-store") as sender:
        try:
            for topic, body in bodies:
                while len(pending) >= ahead:
                    settle_one()
                pending.append(
                    (topic, sender.submit(store_encoded, client, topic, body, write_pointer))
                )
        except BaseException:
            # Stores handed over still go out, as they would have one by one before
            # the failure; the task then fails with the original error.
            for _, future in pending:
                with contextlib.suppress(Exception):
                    future.result()
            raise
        while pending:
            settle_one()
    return ranges


def range_size(rng: PayloadRange) -> int:
    """How many rows a store's range holds: a store's positions are consecutive, the
    sequence running 0-65535 within each millisecond."""
    return (rng.last_ts - rng.first_ts) * 0x10000 + rng.last_seq - rng.first_seq + 1


def merge_ranges(ranges: Iterable[PayloadRange]) -> list[PayloadRange]:
    """``ranges`` sorted, with ranges that touch (no position between them) joined.

    A task's consecutive stores into a topic usually touch, so a publish then names a
    few ranges instead of one per store batch (a publish takes at most 10,000).
    """
    merged: list[PayloadRange] = []
    for rng in sorted(ranges):
        if merged:
            last = merged[-1]
            after = (
                (last.last_ts, last.last_seq + 1)
                if last.last_seq < 0xFFFF
                else (
                    last.last_ts + 1,
                    0,
                )
            )
            if (rng.first_ts, rng.first_seq) == after:
                merged[-1] = last._replace(last_ts=rng.last_ts, last_seq=rng.last_seq)
                continue
        merged.append(rng)
    return merged


def marker(sink_id: str, batch_id: int, write_pointer: int, counts: Mapping[str, int]) -> Record:
    """The control-topic message recording that ``batch_id`` was published."""
    body = {
        "sinkId": sink_id,
        "batchId": batch_id,
        "writePointer": write_pointer,
        "messages": dict(sorted(counts.items())),
    }
    return Record(json.dumps(body, sort_keys=True).encode(), key=str(batch_id).encode())


def _batch_id(payload: bytes) -> int | None:
    try:
        value = json.loads(payload).get("batchId")
    except (ValueError, AttributeError):
        return None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def last_committed_batch(client: Client, sink_id: str, *, fetch_size: int = 5_000) -> int | None:
    """The highest batch id whose marker is committed, or None.

    Markers only ever grow (batches commit in order), so the newest one is wanted: look
    in the last minute first, then further back, then the whole topic. Read-committed
    with a fresh snapshot, taken after this epoch was registered: any older holder
    either committed before (and its marker is seen) or can no longer commit.
    """
    topic = control_topic(sink_id)
    tx = client.snapshot()
    now = time.time_ns() // 1_000_000
    for window in (*_MARKER_WINDOWS, None):
        start: int | None = None if window is None else max(0, now - window)
        newest: int | None = None
        position: int | MessageId | None = start
        inclusive = True
        while True:
            try:
                page = client.poll(
                    topic, position, inclusive=inclusive, limit=fetch_size, transaction=tx
                )
            except TopicNotFound:
                return None
            for message in page:
                batch = _batch_id(message.payload)
                if batch is not None and (newest is None or batch > newest):
                    newest = batch
            # Only an empty page is the end: a page may stop short at the server's
            # byte bound (or at an open transaction, where the next one is empty).
            if not page:
                break
            position, inclusive = page[-1].id, False
        if newest is not None or window is None:
            return newest
    return None


def _ambiguous(error: BaseException) -> bool:
    """True if a failed call may still have taken effect (no answer, or a 5xx)."""
    return isinstance(error, ClientError | ServerError)


def end_write(
    client: Client,
    tx: SinkTransaction,
    published: Iterable[tuple[str, RollbackInfo]] = (),
    *,
    unknown: bool = False,
) -> list[str]:
    """Undo a write that will not commit: roll back what it published, then abort it
    (invalidate it if a rollback failed or a publish's outcome is unknown, so its
    entries stay skipped whatever they are). Returns what went wrong, for notes."""
    problems: list[str] = []
    for topic, info in published:
        try:
            client.rollback(topic, info)
        except TidingsError as exc:
            problems.append(f"rollback on {topic!r} failed: {exc!r}")
    try:
        if problems or unknown:
            client.invalidate(tx.write_pointer)
        else:
            client.abort(tx.write_pointer, transactional_id=tx.transactional_id, epoch=tx.epoch)
    except TransactionNotInProgress:
        pass  # timed out, invalidated or fenced meanwhile: its entries are skipped anyway
    except TidingsError as exc:
        problems.append(
            f"could not end transaction {tx.write_pointer} ({exc!r}); "
            "it becomes invalid when it times out"
        )
    return problems


def _committed_after_all(client: Client, tx: SinkTransaction) -> bool | None:
    """After a commit without an answer: True if it committed, False if it is now
    invalid, None if that cannot be told either."""
    try:
        client.invalidate(tx.write_pointer)
    except TransactionCommitted:
        return True
    except TransactionNotInProgress:
        return False
    except TidingsError:
        return None
    return False


def publish_and_commit(
    client: Client,
    tx: SinkTransaction,
    topics: Mapping[str, Sequence[PayloadRange]] | Iterable[str],
    extra: tuple[str, Record] | None = None,
) -> None:
    """Publish ``tx``'s write pointer on every topic (and ``extra``, a direct message
    such as a batch marker), then commit; on failure undo and raise.

    ``topics`` maps each topic to the payload ranges to publish there (only those rows
    become visible); a plain iterable of topic names publishes every row stored under
    the write pointer on each.
    """
    published: list[tuple[str, RollbackInfo]] = []
    ranges = topics if isinstance(topics, Mapping) else None
    try:
        for topic in sorted(set(topics)):
            info = client.publish(
                topic,
                [],
                write_pointer=tx.write_pointer,
                payload_ranges=None if ranges is None else list(ranges[topic]),
            )
            published.append((topic, info))
        if extra is not None:
            topic, record = extra
            published.append((topic, client.publish(topic, record, write_pointer=tx.write_pointer)))
    except Exception as exc:
        for note in end_write(client, tx, published, unknown=_ambiguous(exc)):
            exc.add_note(note)
        raise
    try:
        client.commit(tx.write_pointer, transactional_id=tx.transactional_id, epoch=tx.epoch)
    except TransactionCommitted:
        return  # an earlier attempt of this very request went through
    except Exception as exc:
        if _ambiguous(exc):
            outcome = _committed_after_all(client, tx)
            if outcome is True:
                return
            if outcome is None:
                exc.add_note(
                    f"the outcome of committing transaction {tx.write_pointer} is unknown; "
                    "if it did not commit it becomes invalid when it times out"
                )
                raise
        for note in end_write(client, tx, published):
            exc.add_note(note)
        raise
