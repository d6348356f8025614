"""The example pipeline as a driver process the crash tests kill with SIGKILL.

    python tests/spark/crash_pipeline.py URL SOURCE SINK CHECKPOINT MODE BATCH

``MODE`` is where, in the sink's commit of micro-batch ``BATCH``, the whole driver
(this process group: Python, JVM, planner workers) is killed:

- ``before-commit``: the executors have stored the batch, the sink has not committed;
- ``after-commit``: the sink published and committed, Spark has not recorded the batch;
- ``none``: run to the end (Trigger.AvailableNow).

The test starts this script in a new session, so the process group is exactly this
driver's; the daemon's forked workers live in their own group and die with the JVM.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import sys
from typing import Any

from pyspark.sql.datasource import DataSourceStreamWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from tests.spark.conftest import ROOT, build_session, spark_env
from tidings.spark.options import parse_write_options
from tidings.spark.source import TidingsDataSource
from tidings.spark.writer import TidingsStreamWriter

_spec = importlib.util.spec_from_file_location(
    "spark_pipeline", ROOT / "examples/spark_pipeline.py"
)
assert _spec is not None and _spec.loader is not None
pipeline = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(pipeline)


def _die() -> None:
    os.killpg(int(os.environ["TIDINGS_CRASH_PGID"]), signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


class CrashingWriter(TidingsStreamWriter):
    def __init__(self, options: Any, schema: StructType, mode: str, batch: int) -> None:
        super().__init__(options, schema)
        self.mode, self.batch = mode, batch

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        if batchId == self.batch and self.mode == "before-commit":
            _die()
        super().commit(messages, batchId)
        if batchId == self.batch and self.mode == "after-commit":
            _die()


class CrashingSource(TidingsDataSource):
    @classmethod
    def name(cls) -> str:
        return "tidings_crashing"

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        mode = self.options.get("crashmode", "none")
        batch = int(self.options.get("crashbatch", "-1"))
        # The crash options are this test source's own, not the connector's.
        options = {k: v for k, v in self.options.items() if k not in ("crashmode", "crashbatch")}
        return CrashingWriter(parse_write_options(options), schema, mode, batch)


def main() -> int:
    url, source, sink, checkpoint, mode, batch = sys.argv[1:7]
    os.environ.update(spark_env())
    os.environ["TIDINGS_CRASH_PGID"] = str(os.getpgid(0))
    spark = build_session("tidings-crash")
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(CrashingSource)
    query = pipeline.start_pipeline(
        spark,
        url=url,
        source=source,
        sink=sink,
        checkpoint=checkpoint,
        max_per_trigger=4,
        available_now=True,
        sink_format="tidings_crashing",
        sink_options={"crashMode": mode, "crashBatch": batch},
    )
    query.awaitTermination()
    spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
