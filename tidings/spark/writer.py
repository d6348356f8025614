"""``df.write`` and ``df.writeStream`` into Tidings (protocol: :mod:`tidings.spark.sink`).

How Spark 4 drives a Python writer decides where the transaction begins. For each write
-- and, in a streaming query, for each micro-batch -- Spark creates the writer on the
driver and pickles it to ship it to the executors; the executors' ``write`` returns
commit messages; ``commit``/``abort`` then run in another Python process on the driver
(batch: the same pickled writer; streaming: a fresh writer from ``streamWriter()``).
So the transaction begins when the writer is *pickled* -- the moment it must exist --
and its write pointer travels inside the writer to the executors and back in every
commit message.

Every task attempt stores its rows under the write's one write pointer and returns, in
its commit message, the :class:`~tidings.structs.PayloadRange` of each store it made.
The driver publishes exactly the ranges in the messages Spark hands to ``commit`` --
one per partition, from the attempt Spark's output commit coordinator let commit --
so rows stored by an attempt that failed, was killed, or lost a speculative race stay
under the write pointer outside every published range: never visible, dropped with
the topic's TTL. Task retries (``spark.task.maxFailures``), stage re-attempts and
``spark.speculation`` therefore need no special handling. An attempt that is still
storing after the publish (a zombie) is refused with ``PayloadsAlreadyPublished``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from tidings.spark.bodies import store_bodies
from tidings.spark.options import WriteOptions
from tidings.spark.scan import connect
from tidings.spark.schema import WriteColumns, write_columns
from tidings.spark.sink import (
    SinkTransaction,
    begin_write,
    control_topic,
    end_write,
    last_committed_batch,
    marker,
    merge_ranges,
    publish_and_commit,
    range_size,
    store_stream,
)
from tidings.structs import PayloadRange

if TYPE_CHECKING:
    import pyarrow as pa  # type: ignore[import-untyped,unused-ignore]

__all__ = [
    "SinkMessage",
    "TidingsBatchWriter",
    "TidingsStreamWriter",
    "query_id_from_checkpoint",
]


@dataclass
class SinkMessage(WriterCommitMessage):
    """What one task attempt tells the driver: the transaction it stored under, the
    ranges of its stores per topic (what the driver publishes), which attempt it was,
    and (streaming) the query it ran in."""

    tx: SinkTransaction
    ranges: dict[str, list[PayloadRange]] = field(default_factory=dict)
    attempt: int = 0
    query_id: str | None = None

    @property
    def counts(self) -> dict[str, int]:
        """How many rows the attempt stored per topic."""
        return {t: sum(map(range_size, rs)) for t, rs in self.ranges.items()}


def query_id_from_checkpoint(location: str) -> str | None:
    """The streaming query id Spark keeps in ``<checkpoint>/metadata``, if the
    checkpoint is on the local file system (stable across restarts of the query)."""
    parts = urlsplit(location)
    if parts.scheme not in ("", "file"):
        return None
    path = parts.path if parts.scheme else location
    try:
        with open(os.path.join(path, "metadata"), encoding="utf-8") as f:
            value = json.loads(f.readline()).get("id")
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, str) and value else None


def _write_task(
    options: WriteOptions,
    columns: WriteColumns,
    tx: SinkTransaction | None,
    batches: Iterator[pa.RecordBatch],
) -> SinkMessage:
    from pyspark import TaskContext

    if tx is None:
        raise RuntimeError("the tidings writer reached an executor without a transaction")
    ctx = TaskContext.get()
    attempt = ctx.attemptNumber() if ctx is not None else 0
    query_id = ctx.getLocalProperty("sql.streaming.queryId") if ctx is not None else None
    # Any attempt stores: the driver publishes only the ranges of the attempt whose
    # message it gets, so what an earlier attempt of this task stored stays unseen.
    bodies = (
        (body.topic, body.body)
        for batch in batches
        for body in store_bodies(
            batch,
            columns,
            options.topic,
            tx.write_pointer,
            max_records=options.store_batch,
            max_bytes=options.store_bytes,
        )
    )
    with connect(options) as client:
        ranges = store_stream(client, tx.write_pointer, bodies)
    return SinkMessage(tx, ranges, attempt, query_id)


def _sink_messages(messages: Sequence[WriterCommitMessage | None]) -> list[SinkMessage]:
    return [m for m in messages if isinstance(m, SinkMessage)]


def _one_transaction(messages: Sequence[SinkMessage]) -> SinkTransaction:
    pointers = {m.tx.write_pointer for m in messages}
    if len(pointers) != 1:
        raise RuntimeError(f"tasks of one write stored under several transactions: {pointers}")
    return messages[0].tx


def _counts(messages: Sequence[SinkMessage]) -> dict[str, int]:
    total: dict[str, int] = {}
    for m in messages:
        for topic, n in m.counts.items():
            total[topic] = total.get(topic, 0) + n
    return total


def _ranges(messages: Sequence[SinkMessage]) -> dict[str, list[PayloadRange]]:
    """Per topic, the ranges of every committed attempt (one message per partition),
    sorted and with touching ones joined: the publish writes them in that order,
    partitions interleaved as stored."""
    out: dict[str, list[PayloadRange]] = {}
    for m in messages:
        for topic, ranges in m.ranges.items():
            if ranges:
                out.setdefault(topic, []).extend(ranges)
    return {topic: merge_ranges(ranges) for topic, ranges in out.items()}


class _WriterBase:
    """Options, columns and the lazily begun transaction, shared by both writers."""

    def __init__(self, options: WriteOptions, schema: StructType) -> None:
        self.options = options
        self.columns = write_columns(schema, options.topic)
        self.tx: SinkTransaction | None = None

    def _sink_id(self) -> str | None:
        return None

    def __getstate__(self) -> dict[str, Any]:
        # Spark pickles the writer on the driver to ship it to the executors: the
        # transaction they store under must exist from then on.
        if self.tx is None:
            with self._client() as client:
                self.tx = begin_write(client, self.options.transaction_timeout, self._sink_id())
        return dict(self.__dict__)

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def _client(self) -> Any:
        o = self.options
        return connect(o)

    def _abort(self, messages: Sequence[WriterCommitMessage | None]) -> None:
        ours = _sink_messages(messages)
        tx = ours[0].tx if ours else self.tx
        if tx is None:
            return  # no task wrote; the transaction times out (or is fenced) unused
        with self._client() as client:
            end_write(client, tx)


class TidingsBatchWriter(_WriterBase, DataSourceArrowWriter):
    """``df.write.format("tidings").mode("append")``: all rows or none, in one
    transaction committed when every task succeeded."""

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkMessage:
        return _write_task(self.options, self.columns, self.tx, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        ours = _sink_messages(messages)
        tx = _one_transaction(ours) if ours else self.tx
        if tx is None:
            return
        with self._client() as client:
            ranges = _ranges(ours)
            if not ranges:
                end_write(client, tx)
                return
            publish_and_commit(client, tx, ranges)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        self._abort(messages)


class TidingsStreamWriter(_WriterBase, DataSourceStreamArrowWriter):
    """``df.writeStream.format("tidings")``: every micro-batch exactly once."""

    def __init__(self, options: WriteOptions, schema: StructType) -> None:
        super().__init__(options, schema)
        self.from_checkpoint = False
        sink_id = options.sink_id
        if sink_id is None and options.checkpoint_location is not None:
            sink_id = query_id_from_checkpoint(options.checkpoint_location)
            self.from_checkpoint = sink_id is not None
        if sink_id is None:
            raise ValueError(
                "a streaming write to tidings needs a stable sink id: set the sinkId option, "
                "or set checkpointLocation with .option() on a local file system path "
                "(the query id kept there is used)"
            )
        self.sink_id = sink_id

    def _sink_id(self) -> str | None:
        return self.sink_id

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkMessage:
        message = _write_task(self.options, self.columns, self.tx, iterator)
        if self.from_checkpoint and message.query_id not in (None, self.sink_id):
            raise RuntimeError(
                f"sink id {self.sink_id} (from the checkpoint) is not the running query's "
                f"id {message.query_id}; set the sinkId option"
            )
        return message

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        ours = _sink_messages(messages)
        if not ours:
            return  # nothing was written; the transaction is fenced by the next batch
        tx = _one_transaction(ours)
        if tx.sink_id != self.sink_id:
            raise RuntimeError(f"commit of sink {self.sink_id} got sink {tx.sink_id}'s rows")
        with self._client() as client:
            ranges = _ranges(ours)
            if not ranges:
                end_write(client, tx)
                return
            counts = {t: n for t, n in _counts(ours).items() if n}
            done = last_committed_batch(client, self.sink_id)
            if done is not None and done >= batchId:
                end_write(client, tx)  # published before Spark could record it: no-op
                return
            record = marker(self.sink_id, batchId, tx.write_pointer, counts)
            publish_and_commit(client, tx, ranges, (control_topic(self.sink_id), record))

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        self._abort(messages)
