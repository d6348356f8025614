"""A Python data source that costs nothing: Spark's own ceiling for a Python source and sink.

``format("tidings-null")`` reads rows of the ``tidings`` schema made in memory (1 KiB
values, 20-byte ids, no network, no server) and writes by dropping every Arrow batch it
is handed. A query through it -- the streaming pipeline with the same transform, a batch
read in as many tasks as the tidings source plans, a batch write -- measures what Spark
spends moving rows between the JVM and Python workers on this machine: Tidings' figure
as a fraction of this one is the part that is ours.

Options: ``rows`` (how many rows the source holds, default 200,000), ``partitions``
(tasks of a batch read, default 4, as the tidings source),
``maxMessagesPerTrigger`` (rows per micro-batch, default all), ``size`` (value bytes,
default 1024). The executors import this module, so ``benchmarks`` must be on their
``PYTHONPATH`` (``benchmarks/spark_pipeline.py`` sets it).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

PAGE = 10_000  # rows per Arrow batch read, as the tidings source's polls


@dataclass
class _Rows(InputPartition):
    first: int
    end: int


@dataclass
class _Dropped(WriterCommitMessage):
    rows: int


def _page(first: int, end: int, size: int) -> Any:
    """Rows ``first`` to ``end`` as the tidings source builds them from a poll."""
    from tidings.spark.bodies import PollColumns, poll_batch
    from tidings.spark.schema import arrow_read_schema

    count = end - first
    pad = b"x" * max(0, size - 8)
    ids = [
        (1_700_000_000_000 + i // 1000).to_bytes(8, "big") + (i % 1000).to_bytes(4, "big")
        + bytes(8)
        for i in range(first, end)
    ]  # fmt: skip
    columns = PollColumns(
        ids, [b"%08d" % i + pad for i in range(first, end)], [None] * count, [0] * (count + 1),
        [], [],
    )  # fmt: skip
    return poll_batch(columns, count, "source", "default", arrow_read_schema())


class _Reader(DataSourceStreamReader, SupportsTriggerAvailableNow):  # type: ignore[misc]
    def __init__(self, rows: int, per_trigger: int | None, size: int) -> None:
        self.rows, self.per_trigger, self.size = rows, per_trigger, size

    def initialOffset(self) -> dict[str, int]:
        return {"row": 0}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadAllAvailable() if self.per_trigger is None else ReadMaxRows(self.per_trigger)

    def prepareForTriggerAvailableNow(self) -> None:
        return None

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        budget = limit.max_rows if isinstance(limit, ReadMaxRows) else self.rows
        return {"row": min(self.rows, start["row"] + budget)}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[InputPartition]:
        return [_Rows(start["row"], end["row"])]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, _Rows)
        for first in range(partition.first, partition.end, PAGE):
            yield _page(first, min(partition.end, first + PAGE), self.size)

    def commit(self, end: dict[str, int]) -> None:
        return None


class _BatchReader(DataSourceReader):  # type: ignore[misc]
    def __init__(self, rows: int, partitions: int, size: int) -> None:
        self.rows, self.tasks, self.size = rows, partitions, size

    def partitions(self) -> list[InputPartition]:
        cuts = [self.rows * i // self.tasks for i in range(self.tasks + 1)]
        return [_Rows(first, end) for first, end in pairwise(cuts)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, _Rows)
        for first in range(partition.first, partition.end, PAGE):
            yield _page(first, min(partition.end, first + PAGE), self.size)


class _BatchWriter(DataSourceArrowWriter):  # type: ignore[misc]
    def write(self, iterator: Iterator[Any]) -> _Dropped:
        return _Dropped(sum(batch.num_rows for batch in iterator))


class _Writer(DataSourceStreamArrowWriter):  # type: ignore[misc]
    def write(self, iterator: Iterator[Any]) -> _Dropped:
        return _Dropped(sum(batch.num_rows for batch in iterator))

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        return None

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        return None


class NullSource(DataSource):  # type: ignore[misc]
    """``format("tidings-null")``: see the module docstring."""

    @classmethod
    def name(cls) -> str:
        return "tidings-null"

    def schema(self) -> StructType:
        from tidings.spark.schema import READ_SCHEMA

        return READ_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return _BatchReader(
            int(self.options.get("rows", 200_000)),
            int(self.options.get("partitions", 4)),
            int(self.options.get("size", 1024)),
        )

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceArrowWriter:
        return _BatchWriter()

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        per = self.options.get("maxMessagesPerTrigger")
        return _Reader(
            int(self.options.get("rows", 200_000)),
            int(per) if per else None,
            int(self.options.get("size", 1024)),
        )

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamArrowWriter:
        return _Writer()
