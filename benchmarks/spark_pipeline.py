"""Throughput of the exactly-once Spark pipeline (examples/spark_pipeline.py).

Starts ``tidings serve`` on a temporary data directory, publishes ``--messages``
messages of ``--size`` bytes to a source topic, then on a ``local[2]`` SparkSession
measures, after a small warm-up run (JVM and Python workers started):

- the pipeline: read-committed stream -> upper-case -> exactly-once stream sink,
  ``Trigger.AvailableNow``, from query start to termination, in micro-batches of
  ``--max-per-trigger`` messages (0: one batch with everything);
- a batch read of the source topic (``spark.read ... .count()``);
- a batch write (``df.write``) of the source's rows to another topic, twice: the session's
  first write (which also starts the writer's workers and compiles the JVM's write
  path) and a second one, warm as the read and the pipeline are;
- in the same session, the ceiling Spark itself reaches on this machine with the same
  rows: the same pipeline between a Python data source and sink that cost nothing
  (``benchmarks/spark_null_source.py``: rows made in memory, batches dropped), which is
  the part of the pipeline's time that is Spark's own; the ``rate-micro-batch`` source
  making 1 KiB rows (from the row number, so nothing is constant-folded) -> ``upper()``
  -> the ``noop`` sink, streaming; a Parquet file of such rows -> ``upper()`` -> ``noop``,
  batch; and the same through a row-at-a-time Python UDF. Tidings is reported as a
  fraction of those.

    python benchmarks/spark_pipeline.py                     # 20,000 x 1 KiB
    python benchmarks/spark_pipeline.py --messages 200000 --max-per-trigger 50000
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.workloads import cpu_seconds

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _serve(data_dir: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log = open(data_dir.parent / "server.log", "ab")  # noqa: SIM115 - lives with the server
    proc = subprocess.Popen(
        [sys.executable, "-m", "tidings", "serve", "--host", "127.0.0.1", "--port", str(port),
         "--data-dir", str(data_dir)],
        stdout=log,
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/healthz", timeout=0.5) as answer:
                if answer.status == 200:
                    return proc, url
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("tidings serve did not start")


def _example() -> Any:
    spec = importlib.util.spec_from_file_location(
        "spark_pipeline", ROOT / "examples" / "spark_pipeline.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _publish(client: Any, topic: str, count: int, size: int) -> None:
    client.create_topic(topic)
    pad = b"x" * max(0, size - 8)
    for first in range(0, count, 1000):
        client.publish(topic, [b"%08d" % i + pad for i in range(first, min(count, first + 1000))])


def _timed(label: str, count: int, size: int, fn: Callable[[], object]) -> float:
    began = time.perf_counter()
    fn()
    seconds = time.perf_counter() - began
    rate = count / seconds
    print(
        f"{label:<44} {count:>8,} msgs {seconds:7.2f} s {rate:>9,.0f} msg/s "
        f"{rate * size / 1e6:6.1f} MB/s",
        flush=True,
    )
    return rate


def _steady(query: Any) -> tuple[int, float]:
    """Rows and seconds of a query's micro-batches after its first (the first one pays
    for planning the query, starting workers and compiling code)."""
    batches = [p for p in query.recentProgress if p["numInputRows"]][1:]
    rows = sum(p["numInputRows"] for p in batches)
    return rows, sum(p["durationMs"]["triggerExecution"] for p in batches) / 1000


def _line(label: str, count: int, seconds: float, size: int) -> float:
    rate = count / seconds if seconds else 0.0
    print(
        f"{label:<44} {count:>8,} msgs {seconds:7.2f} s {rate:>9,.0f} msg/s "
        f"{rate * size / 1e6:6.1f} MB/s",
        flush=True,
    )
    return rate


def _rows_1k(df: Any, size: int) -> Any:
    """``size``-byte string rows made from a ``value`` (long) column."""
    from pyspark.sql import functions as F

    return df.select(
        F.concat(F.lpad(F.col("value").cast("string"), 8, "0"), F.lit("x" * (size - 8))).alias(
            "value"
        )
    )


def _ceilings(spark: Any, work: Path, count: int, size: int, per_trigger: int) -> dict[str, float]:
    """Spark's own rates with the same rows on this machine (see the module docstring)."""
    from pyspark.sql import functions as F

    out: dict[str, float] = {}
    stream = (
        spark.readStream.format("rate-micro-batch")
        .option("rowsPerBatch", per_trigger)
        .option("numPartitions", 2)
        .load()
    )
    query = (
        _rows_1k(stream, size)
        .select(F.upper("value").alias("value"))
        .writeStream.format("noop")
        .option("checkpointLocation", str(work / "ckpt-rate"))
        .trigger(processingTime="0 seconds")
        .start()
    )
    try:
        # Three times the rows: the first batches also compile the JVM's code.
        while sum(p["numInputRows"] for p in query.recentProgress) < 3 * count:
            time.sleep(0.2)
    finally:
        spark.sparkContext.setLogLevel("OFF")  # stopping cancels a batch: no stack traces
        query.stop()
        spark.sparkContext.setLogLevel("ERROR")
    rows, seconds = _steady(query)
    out["stream"] = _line("ceiling: rate -> upper() -> noop, steady", rows, seconds, size)
    parquet = str(work / "rows.parquet")
    _rows_1k(spark.range(count).withColumnRenamed("id", "value"), size).write.parquet(parquet)

    def upper() -> None:
        spark.read.parquet(parquet).select(F.upper("value")).write.format("noop").mode(
            "overwrite"
        ).save()

    upper()  # warm-up
    out["batch"] = _timed("ceiling: Parquet -> upper() -> noop", count, size, upper)
    py_upper = F.udf(lambda v: v.upper(), "string")
    out["udf"] = _timed(
        "ceiling: Parquet -> Python UDF upper -> noop",
        count,
        size,
        lambda: (
            spark.read.parquet(parquet)
            .select(py_upper("value"))
            .write.format("noop")
            .mode("overwrite")
            .save()
        ),
    )
    return out


def _null_pipeline(spark: Any, example: Any, work: Path, args: Any, per_trigger: Any) -> Any:
    """The pipeline's transform between the costless Python source and sink."""
    reader = spark.readStream.format("tidings-null").option("rows", args.messages)
    reader = reader.option("size", args.size)
    if per_trigger:
        reader = reader.option("maxMessagesPerTrigger", per_trigger)
    query = (
        example.transform(reader.load())
        .writeStream.format("tidings-null")
        .option("checkpointLocation", str(work / f"ckpt-null-{time.monotonic_ns()}"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    if query.exception() is not None:
        raise RuntimeError(query.exception())
    return query


def _server_cpu(label: str, server: subprocess.Popen[bytes], count: int, since: float) -> float:
    used = cpu_seconds(server.pid) - since
    print(f"  server CPU during {label}: {used * 1e6 / count:.1f} us per message", flush=True)
    return cpu_seconds(server.pid)


def _count(client: Any, topic: str) -> int:
    total, start, tx = 0, None, client.snapshot()
    while True:
        page = client.poll(topic, start, inclusive=start is None, limit=10_000, transaction=tx)
        total += len(page)
        if len(page) < 10_000:
            return total
        start = page[-1].id


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--max-per-trigger", type=int, default=5_000)
    parser.add_argument(
        "--warmup", type=int, default=20_000, help="messages through the pipeline first"
    )
    parser.add_argument(
        "--arrow-batch",
        type=int,
        default=2_000,
        help="spark.sql.execution.arrow.maxRecordsPerBatch (0: Spark's default)",
    )
    parser.add_argument("--no-ceilings", action="store_true", help="measure Tidings only")
    parser.add_argument("--verbose", action="store_true", help="print each micro-batch")
    args = parser.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p
    )
    from tidings.client import Client

    example = _example()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        server, url = _serve(work / "data")
        try:
            client = Client(url, timeout=120)
            _publish(client, "warmup", args.warmup, args.size)
            _publish(client, "source", args.messages, args.size)
            for topic in ("warmup-out", "sink", "copy"):
                client.create_topic(topic)
            spark = example.session("tidings-benchmark")
            spark.sparkContext.setLogLevel("ERROR")
            if args.arrow_batch:
                # Rows reach a Python writer in Arrow batches of this many: smaller than
                # a micro-batch, so the sink stores while the source still reads.
                spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", args.arrow_batch)
            per_trigger = args.max_per_trigger or None

            def pipeline(source: str, sink: str) -> Any:
                query = example.start_pipeline(
                    spark,
                    url=url,
                    source=source,
                    sink=sink,
                    checkpoint=str(work / f"ckpt-{sink}"),
                    max_per_trigger=per_trigger,
                    available_now=True,
                )
                query.awaitTermination()
                if query.exception() is not None:
                    raise RuntimeError(query.exception())
                return query

            from benchmarks.spark_null_source import NullSource

            spark.dataSource.register(NullSource)
            # Starts the JVM's and Python's workers and lets the JVM compile its hot code.
            pipeline("warmup", "warmup-out")
            if not args.no_ceilings:
                _null_pipeline(spark, example, work, args, per_trigger)
            print(
                f"local[2], {args.size} B messages, maxMessagesPerTrigger={per_trigger}, "
                f"arrow batches of {args.arrow_batch or 'Spark default'}",
                flush=True,
            )
            queries: list[Any] = []
            rates: dict[str, float] = {}
            cpu = cpu_seconds(server.pid)
            rates["start-to-end"] = _timed(
                "pipeline, query start to end",
                args.messages,
                args.size,
                lambda: queries.append(pipeline("source", "sink")),
            )
            cpu = _server_cpu("the pipeline", server, args.messages, cpu)
            assert _count(client, "sink") == args.messages
            if args.verbose:
                for p in queries[0].recentProgress:
                    if p["numInputRows"]:
                        print(f"  batch {p['batchId']}: {p['numInputRows']} {p['durationMs']}")
            rows, seconds = _steady(queries[0])
            if rows:
                rates["steady"] = _line(
                    "pipeline, steady state (after 1st batch)", rows, seconds, args.size
                )
            ceiling: dict[str, float] = {}
            if not args.no_ceilings:
                nulls: list[Any] = []
                ceiling["null-start-to-end"] = _timed(
                    "ceiling: same pipeline, costless Python source and sink",
                    args.messages,
                    args.size,
                    lambda: nulls.append(_null_pipeline(spark, example, work, args, per_trigger)),
                )
                rows, seconds = _steady(nulls[0])
                if rows:
                    ceiling["null-steady"] = _line(
                        "ceiling: the same, steady state", rows, seconds, args.size
                    )
            source = spark.read.format("tidings").option("url", url).option("topic", "source")
            # Warm, as the costless source's read below is: the first batch read of a
            # session starts its planner and reader workers.
            spark.read.format("tidings").option("url", url).option("topic", "warmup").load().count()
            cpu = cpu_seconds(server.pid)
            rates["read"] = _timed(
                "batch read (count)", args.messages, args.size, lambda: source.load().count()
            )
            cpu = _server_cpu("the batch read", server, args.messages, cpu)

            def batch_write() -> None:
                source.load().select("key", "value", "headers").write.format("tidings").option(
                    "url", url
                ).option("topic", "copy").mode("append").save()

            # The session's first write also starts its writer's workers and compiles the
            # JVM's write path; the second is timed as the reads are, warm.
            rates["write-first"] = _timed(
                "batch write, the session's first", args.messages, args.size, batch_write
            )
            cpu = _server_cpu("the first batch write", server, args.messages, cpu)
            rates["write"] = _timed(
                "batch write (df.write of the source's rows)",
                args.messages,
                args.size,
                batch_write,
            )
            _server_cpu("the batch write", server, args.messages, cpu)
            assert _count(client, "copy") == 2 * args.messages
            if not args.no_ceilings:
                null = spark.read.format("tidings-null").option("rows", args.messages)
                null = null.option("size", args.size)
                null.load().count()  # warm-up
                ceiling["null-read"] = _timed(
                    "ceiling: batch read, costless Python source",
                    args.messages,
                    args.size,
                    lambda: null.load().count(),
                )

                def null_write() -> None:
                    null.load().select("key", "value", "headers").write.format("tidings-null").mode(
                        "append"
                    ).save()

                ceiling["null-write-first"] = _timed(
                    "ceiling: batch write, costless, the first",
                    args.messages,
                    args.size,
                    null_write,
                )
                ceiling["null-write"] = _timed(
                    "ceiling: batch write, costless source and sink",
                    args.messages,
                    args.size,
                    null_write,
                )
            if not args.no_ceilings:
                ceiling.update(
                    _ceilings(spark, work, args.messages, args.size, per_trigger or 50_000)
                )
                for what, against in (
                    ("steady", "null-steady"),
                    ("start-to-end", "null-start-to-end"),
                    ("read", "null-read"),
                    ("write-first", "null-write-first"),
                    ("write", "null-write"),
                    ("steady", "stream"),
                    ("start-to-end", "stream"),
                    ("read", "batch"),
                    ("write", "batch"),
                ):
                    if what in rates and ceiling.get(against):
                        print(
                            f"  {what} = {rates[what] / ceiling[against]:.1%} of the {against} "
                            f"ceiling, {rates[what] / ceiling['udf']:.0%} of the Python UDF's",
                            flush=True,
                        )
            spark.stop()
        finally:
            server.terminate()
            server.wait(30)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
