"""``spark.read.format("tidings")``: a bounded read of one or more topics.

Planning (on the driver) fixes, per topic, where the read starts and the last message
it returns -- for read-committed the last *stable* one, so the read stops before the
first entry of a transaction still in progress, as every transactional consumer does
(invariant 3) -- then cuts each topic's range into slices by publish time that tasks
read in parallel with the same snapshot (:mod:`tidings.spark.scan`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSourceReader, InputPartition

from tidings.client import Client
from tidings.errors import TopicNotFound
from tidings.spark.bodies import poll_batch
from tidings.spark.offsets import EARLIEST, poll_start, position_reaches, slices
from tidings.spark.options import Bound, ReadOptions, Start
from tidings.spark.scan import (
    Scan,
    TopicRange,
    connect,
    plan_ranges,
    read_range_columns,
    scan,
    snapshot,
)
from tidings.spark.schema import arrow_read_schema
from tidings.structs import MessageId, TopicEnd, Transaction

if TYPE_CHECKING:
    import pyarrow as pa  # type: ignore[import-untyped,unused-ignore]

__all__ = [
    "DEFAULT_BATCH_SLICES",
    "TidingsBatchReader",
    "data_loss_message",
    "default_batch_slices",
    "read_partition",
    "start_position",
]

#: Slices per topic of a batch read unless ``minPartitions`` says otherwise (at most:
#: see :func:`default_batch_slices`).
DEFAULT_BATCH_SLICES = 4


def default_batch_slices() -> int:
    """Slices per topic of a batch read without ``minPartitions``: four, or one per
    core of a driver with fewer. On a smaller machine in local mode (its cores are the
    executors') four slices run in waves, and each wave costs Spark's scheduling of the
    next tasks: on two cores, 200,000 messages read as two slices 15-40 % faster than
    as four (BENCHMARKS.md, "Batch reads in one wave")."""
    return max(1, min(DEFAULT_BATCH_SLICES, os.cpu_count() or DEFAULT_BATCH_SLICES))


def start_position(start: Start) -> str:
    """The position a configured start stands for (``latest`` is resolved elsewhere)."""
    if start.kind == "time":
        return f"time:{start.value}"
    if start.kind == "id":
        return f"at:{start.value}"
    if start.kind == "after":
        return str(start.value)
    return EARLIEST


def read_partition(options: ReadOptions, part: InputPartition) -> Iterator[pa.RecordBatch]:
    """The rows of one planned range, an Arrow batch per poll (runs on executors)."""
    if not isinstance(part, TopicRange):
        raise TypeError(f"not a tidings partition: {part!r}")
    schema = arrow_read_schema()
    told = False  # whether a poll answer said its page's generation

    def accept(now: int | None) -> bool:
        # Each poll answer says the generation its page was read from, so the check
        # costs no request of its own; a page of another topic of that name is never
        # handed to Spark.
        nonlocal told
        if now is None or part.generation is None:
            return True
        told = True
        if now == part.generation:
            return True
        if options.fail_on_data_loss:
            raise TopicNotFound(
                data_loss_message(
                    options.namespace, part.topic, part.generation, now,
                    streaming=options.streaming,
                )
            )  # fmt: skip
        return False  # what the range held is gone: read nothing more of it

    with connect(options) as client:
        try:
            for page, rows in read_range_columns(client, part, options.fetch_size, accept):
                yield poll_batch(page, rows, part.topic, options.namespace, schema)
            if part.generation is not None and not told:
                # A server whose polls do not say: asked after reading, the same
                # generation means every poll read the topic the range was planned in
                # (generations only grow).
                accept(client.get_topic(part.topic).generation)
        except TopicNotFound:
            # Deleted since the range was planned: what it held is gone, which a
            # streaming read with failOnDataLoss=false goes on without.
            if options.fail_on_data_loss:
                raise


def data_loss_message(
    namespace: str,
    topic: str,
    recorded: int | None,
    current: int | None,
    *,
    streaming: bool = True,
) -> str:
    """Why a read stops where ``topic`` (of ``recorded`` generation) was deleted
    (``current`` None) or created again."""
    what = "deleted" if current is None else "deleted and created again"
    then = "" if recorded is None else f" (generation {recorded}"
    then += "" if not then else (")" if current is None else f", now {current})")
    if not streaming:
        return (
            f"topic {topic!r} of namespace {namespace!r} was {what}{then} since the "
            "offsets given to the read were taken, or since the read was planned: the "
            "messages they name are lost, and offsets of the old topic do not apply to a "
            "new one. Read with offsets of the topic as it is now, or set the option "
            "failOnDataLoss to false to read a new topic of that name from its start."
        )
    return (
        f"topic {topic!r} of namespace {namespace!r} was {what}{then} while the streaming "
        "query read it: messages it had not read are lost, and the offsets of the old "
        "topic do not apply to a new one. Start the query again with a new checkpoint, "
        "or set the option failOnDataLoss to false to read a new topic of that name "
        "from its start."
    )


def slices_per_topic(options: ReadOptions, default: int) -> int:
    """How many slices each topic's range is cut into."""
    if options.min_partitions is None:
        return default
    return max(1, -(-options.min_partitions // len(options.topics)))


class TidingsBatchReader(DataSourceReader):
    """The batch reader: plans on the driver, reads on executors."""

    def __init__(self, options: ReadOptions) -> None:
        self.options = options

    def partitions(self) -> list[InputPartition]:
        o = self.options
        pieces = slices_per_topic(o, default_batch_slices())
        parts: list[InputPartition] = []
        with connect(o) as client:
            # Asked first: a topic created again after this is then caught by the tasks.
            generations = {
                t: self._generation(client, t) for t in o.topics if o.starts[t].kind != "latest"
            }
            topics = [t for t in o.topics if t in generations and generations[t] is not None]
            # Where each topic ends, asked before the snapshot is taken: see _find.
            ends = {t: client.end(t) for t in topics if o.ends[t].kind == "latest"}
            tx = snapshot(client, o.committed)
            for topic in topics:
                position = start_position(o.starts[topic])
                if o.generations.get(topic, generations[topic]) != generations[topic]:
                    position = EARLIEST  # created again: read the new topic from its start
                found = _find(client, o, topic, position, tx, ends.get(topic))
                if found.last is None:
                    continue
                cuts = slices(found.first_ts, found.last.publish_ts, pieces)
                for part in plan_ranges(topic, position, found.last, cuts, tx):
                    part.generation = generations[topic]
                    parts.append(part)
        return parts

    def _generation(self, client: Client, topic: str) -> int | None:
        """``topic``'s generation now, checked against the one its offsets were taken
        in: as Spark's Kafka source, a read whose offsets are out of range fails
        (``failOnDataLoss``), or else reads what there is (None: nothing, the topic is
        gone). A topic that was never read from is just not found."""
        recorded = self.options.generations.get(topic)
        try:
            current: int | None = client.get_topic(topic).generation
        except TopicNotFound:
            if recorded is None:
                raise
            current = None
        if recorded is not None and current != recorded and self.options.fail_on_data_loss:
            raise TopicNotFound(
                data_loss_message(self.options.namespace, topic, recorded, current, streaming=False)
            )
        return current

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, TopicRange):
            return iter(())  # nothing planned: Spark reads one InputPartition(None) instead
        return read_partition(self.options, partition)


def _find(
    client: Client,
    o: ReadOptions,
    topic: str,
    position: str,
    tx: Transaction | None,
    end: TopicEnd | None,
) -> Scan:
    """Where the read of ``topic`` from ``position`` starts (its first message's
    publish time) and ends (an id at or after its last message).

    Without a bound, from where the topic ends (``end``, which the server seeks) and
    one poll of one id: a scan of every id took 0.8 s per 200,000 messages, a third of
    the whole read (BENCHMARKS.md, "Batch reads planned without a scan"). That end was
    asked for before the snapshot ``tx`` was taken, so it is not past what ``tx`` reads
    as stable: every entry before the last stable position then belonged to a
    transaction already ended, and every entry written later has a greater id. With a
    bound, where the server cannot tell the last stable position, or where the read
    starts past it, the ids are scanned as before."""
    stop = end.last_stable_id if end is not None and o.committed else None
    if (
        end is None
        or (o.committed and not end.stable_known)
        # A read starting past the oldest open transaction's first entry does not
        # stop there but at the first open entry after its start, which only a
        # scan finds (as a read-committed consumer starting there reads on).
        or (stop is not None and not position_reaches(position, stop))
    ):
        bound = o.ends[topic]
        return scan(client, topic, position, tx, fetch_size=o.fetch_size, **_bound_args(bound))
    last: MessageId | None = end.newest_id
    if stop is not None:
        last = stop.previous()  # up to the oldest open transaction
    if last is None:
        return Scan()
    start, inclusive = poll_start(position)
    first = client.poll_ids(topic, start, inclusive=inclusive, limit=1, transaction=tx)
    if not first or first[0] > last:
        return Scan()
    return Scan(count=1, first_ts=first[0].publish_ts, last=last)


def _bound_args(bound: Bound) -> dict[str, Any]:
    if bound.kind == "id":
        return {"stop_after": MessageId.from_hex(str(bound.value))}
    if bound.kind == "time":
        return {"stop_before_ts": int(bound.value or 0)}
    return {}
