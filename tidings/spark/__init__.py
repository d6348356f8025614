"""Tidings for Apache Spark: the ``tidings`` data source (PySpark Python Data Source API).

``spark.read``/``spark.readStream.format("tidings")`` read topics (read-committed by
default); ``df.write``/``df.writeStream.format("tidings")`` write them transactionally,
exactly once per micro-batch. After ``pip install tidings[spark]`` Spark finds the
format by itself (the top-level module :mod:`pyspark_tidings`); :func:`register` does
the same explicitly for one session. See docs/spark.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tidings.spark.schema import READ_SCHEMA
from tidings.spark.source import TidingsDataSource

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["READ_SCHEMA", "TidingsDataSource", "register"]


def register(spark: SparkSession) -> None:
    """Register the ``tidings`` format with ``spark`` (needed only when Spark cannot
    find :mod:`pyspark_tidings` by itself, e.g. under a default editable install)."""
    spark.dataSource.register(TidingsDataSource)
