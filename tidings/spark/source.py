"""The ``tidings`` data source: what Spark instantiates for ``format("tidings")``."""

from __future__ import annotations

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from tidings.spark.options import parse_read_options, parse_write_options
from tidings.spark.reader import TidingsBatchReader
from tidings.spark.schema import READ_SCHEMA, check_read_schema
from tidings.spark.stream_reader import TidingsStreamReader
from tidings.spark.writer import TidingsBatchWriter, TidingsStreamWriter

__all__ = ["TidingsDataSource"]


class TidingsDataSource(DataSource):
    """Batch and streaming reads and writes of Tidings topics (docs/spark.md)."""

    @classmethod
    def name(cls) -> str:
        return "tidings"

    def schema(self) -> StructType:
        return READ_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        check_read_schema(schema)
        return TidingsBatchReader(parse_read_options(self.options, streaming=False))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        check_read_schema(schema)
        return TidingsStreamReader(parse_read_options(self.options, streaming=True))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        if overwrite:
            raise ValueError(
                'tidings topics are append-only: write with .mode("append"), not overwrite'
            )
        return TidingsBatchWriter(parse_write_options(self.options), schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        return TidingsStreamWriter(parse_write_options(self.options), schema)
