"""Consume, transform, produce on Spark -- exactly once, end to end.

Reads topic ``--source`` (read-committed), upper-cases each message, and writes it to
``--sink``, keeping keys and headers and adding a ``source-id`` header. Run it, kill it
at any moment (even ``kill -9``), run it again with the same ``--checkpoint``: the sink
topic holds every source message exactly once, in source order.

    tidings serve &
    tidings topics create orders && tidings topics create orders-loud
    python examples/spark_pipeline.py --source orders --sink orders-loud \\
        --checkpoint /tmp/orders-loud.ckpt --available-now

Why it is exactly once: Spark records each micro-batch's source range in the
checkpoint before running it, and a batch of a read-committed Tidings source reads the
same messages whenever it runs again; the sink publishes a batch and a marker of its id
in one transaction, and skips a batch whose marker is already there (docs/spark.md).

Output order follows input order because the source reads each topic's batch in one
task by default (``minPartitions`` unset) and the transform keeps rows in place.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any


def transform(df: Any) -> Any:
    """The pipeline's business logic: a row-by-row map, so row order is kept."""
    from pyspark.sql import functions as F

    source_id = F.struct(
        F.lit("source-id").alias("key"), F.encode("messageId", "UTF-8").alias("value")
    )
    return df.select(
        "key",
        F.encode(F.upper(F.decode("value", "UTF-8")), "UTF-8").alias("value"),
        F.concat(F.coalesce("headers", F.array()), F.array(source_id)).alias("headers"),
    )


def start_pipeline(
    spark: Any,
    *,
    url: str,
    source: str,
    sink: str,
    checkpoint: str,
    namespace: str = "default",
    max_per_trigger: int | None = None,
    available_now: bool = False,
    sink_format: str = "tidings",
    sink_options: dict[str, Any] | None = None,
) -> Any:
    """Start the streaming query; returns the ``StreamingQuery``."""
    reader = (
        spark.readStream.format("tidings")
        .option("url", url)
        .option("namespace", namespace)
        .option("topic", source)
    )
    if max_per_trigger is not None:
        reader = reader.option("maxMessagesPerTrigger", str(max_per_trigger))
    writer = (
        transform(reader.load())
        .writeStream.format(sink_format)
        .option("url", url)
        .option("namespace", namespace)
        .option("topic", sink)
        .option("checkpointLocation", checkpoint)
    )
    for key, value in (sink_options or {}).items():
        writer = writer.option(key, str(value))
    writer = (
        writer.trigger(availableNow=True)
        if available_now
        else writer.trigger(processingTime="500 milliseconds")
    )
    return writer.start()


def session(app: str = "tidings-pipeline") -> Any:
    """A local Spark session for the example (``local[2]``, no UI)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    return (
        SparkSession.builder.master(os.environ.get("SPARK_MASTER", "local[2]"))
        .appName(app)
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8470")
    parser.add_argument("--namespace", default="default")
    parser.add_argument("--source", required=True)
    parser.add_argument("--sink", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--max-per-trigger", type=int, default=None)
    parser.add_argument(
        "--available-now", action="store_true", help="process what is there, then stop"
    )
    args = parser.parse_args(argv)
    spark = session()
    spark.sparkContext.setLogLevel("WARN")
    query = start_pipeline(
        spark,
        url=args.url,
        namespace=args.namespace,
        source=args.source,
        sink=args.sink,
        checkpoint=args.checkpoint,
        max_per_trigger=args.max_per_trigger,
        available_now=args.available_now,
    )
    try:
        query.awaitTermination()
    except KeyboardInterrupt:
        query.stop()
    spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
