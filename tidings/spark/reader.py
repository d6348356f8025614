"""``spark.read.format("tidings")``: a bounded read of one or more topics.

Planning (on the driver) fixes, per topic, where the read starts and the last message
it returns -- for read-committed the last *stable* one, so the read stops before the
first entry of a transaction still in progress, as every transactional consumer does
(invariant 3) -- then cuts each topic's range into slices by publish time that tasks
read in parallel with the same snapshot (:mod:`tidings.spark.scan`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSourceReader, InputPartition

from tidings.spark.bodies import poll_batch
from tidings.spark.offsets import EARLIEST, slices
from tidings.spark.options import Bound, ReadOptions, Start
from tidings.spark.scan import TopicRange, connect, plan_ranges, read_range_columns, scan, snapshot
from tidings.spark.schema import arrow_read_schema
from tidings.structs import MessageId

if TYPE_CHECKING:
    import pyarrow as pa  # type: ignore[import-untyped,unused-ignore]

__all__ = ["DEFAULT_BATCH_SLICES", "TidingsBatchReader", "read_partition", "start_position"]

#: Slices per topic of a batch read unless ``minPartitions`` says otherwise.
DEFAULT_BATCH_SLICES = 4


def start_position(start: Start) -> str:
    """The position a configured start stands for (``latest`` is resolved elsewhere)."""
    if start.kind == "time":
        return f"time:{start.value}"
    if start.kind == "id":
        return f"at:{start.value}"
    return EARLIEST


def read_partition(options: ReadOptions, part: InputPartition) -> Iterator[pa.RecordBatch]:
    """The rows of one planned range, an Arrow batch per poll (runs on executors)."""
    if not isinstance(part, TopicRange):
        raise TypeError(f"not a tidings partition: {part!r}")
    schema = arrow_read_schema()
    with connect(options) as client:
        for page, rows in read_range_columns(client, part, options.fetch_size):
            yield poll_batch(page, rows, part.topic, options.namespace, schema)


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
        pieces = slices_per_topic(o, DEFAULT_BATCH_SLICES)
        parts: list[InputPartition] = []
        with connect(o) as client:
            tx = snapshot(client, o.committed)
            for topic in o.topics:
                start = o.starts[topic]
                if start.kind == "latest":
                    continue  # a bounded read from the end reads nothing
                position = start_position(start)
                bound = o.ends[topic]
                found = scan(
                    client,
                    topic,
                    position,
                    tx,
                    fetch_size=o.fetch_size,
                    **_bound_args(bound),
                )
                if found.last is None:
                    continue
                cuts = slices(found.first_ts, found.last.publish_ts, pieces)
                parts.extend(plan_ranges(topic, position, found.last, cuts, tx))
        return parts

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, TopicRange):
            return iter(())  # nothing planned: Spark reads one InputPartition(None) instead
        return read_partition(self.options, partition)


def _bound_args(bound: Bound) -> dict[str, Any]:
    if bound.kind == "id":
        return {"stop_after": MessageId.from_hex(str(bound.value))}
    if bound.kind == "time":
        return {"stop_before_ts": int(bound.value or 0)}
    return {}
