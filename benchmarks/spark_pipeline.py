"""Throughput of the exactly-once Spark pipeline (examples/spark_pipeline.py).

Starts ``tidings serve`` on a temporary data directory, publishes ``--messages``
messages of ``--size`` bytes to a source topic, then on a ``local[2]`` SparkSession
measures, after a small warm-up run (JVM and Python workers started):

- the pipeline: read-committed stream -> upper-case -> exactly-once stream sink,
  ``Trigger.AvailableNow``, from query start to termination, in micro-batches of
  ``--max-per-trigger`` messages (0: one batch with everything);
- a batch read of the source topic (``spark.read ... .count()``);
- a batch write (``df.write``) of the source's rows to another topic.

    python benchmarks/spark_pipeline.py                     # 20,000 x 1 KiB
    python benchmarks/spark_pipeline.py --messages 100000 --max-per-trigger 20000
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
            _publish(client, "warmup", 200, args.size)
            _publish(client, "source", args.messages, args.size)
            for topic in ("warmup-out", "sink", "copy"):
                client.create_topic(topic)
            spark = example.session("tidings-benchmark")
            spark.sparkContext.setLogLevel("ERROR")
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

            pipeline("warmup", "warmup-out")  # start the JVM's and Python's workers
            print(
                f"local[2], {args.size} B messages, maxMessagesPerTrigger={per_trigger}",
                flush=True,
            )
            queries: list[Any] = []
            _timed(
                "pipeline, query start to end",
                args.messages,
                args.size,
                lambda: queries.append(pipeline("source", "sink")),
            )
            assert _count(client, "sink") == args.messages
            batches = [p for p in queries[0].recentProgress if p["numInputRows"]][1:]
            if batches:
                rows = sum(p["numInputRows"] for p in batches)
                ms = sum(p["durationMs"]["triggerExecution"] for p in batches)
                rate = rows / (ms / 1000)
                print(
                    f"{'pipeline, steady state (after 1st batch)':<44} {rows:>8,} msgs "
                    f"{ms / 1000:7.2f} s {rate:>9,.0f} msg/s {rate * args.size / 1e6:6.1f} MB/s",
                    flush=True,
                )
            source = spark.read.format("tidings").option("url", url).option("topic", "source")
            _timed("batch read (count)", args.messages, args.size, lambda: source.load().count())
            _timed(
                "batch write (df.write of the source's rows)",
                args.messages,
                args.size,
                lambda: (
                    source.load()
                    .select("key", "value", "headers")
                    .write.format("tidings")
                    .option("url", url)
                    .option("topic", "copy")
                    .mode("append")
                    .save()
                ),
            )
            assert _count(client, "copy") == args.messages
            spark.stop()
        finally:
            server.terminate()
            server.wait(30)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
