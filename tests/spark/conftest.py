"""One local SparkSession and one ``tidings serve`` for every Spark test.

Starting Spark costs seconds, so the whole run shares one ``local[2,2]`` session: two
threads, and a failed task is tried once more as on a cluster (plain ``local[2]`` never
retries a task). It never calls ``tidings.spark.register``, so every test also checks
that Spark finds the ``tidings`` format by itself (``pyspark_tidings``). Tests use their
own topics.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.serverproc import ServerProcess
from tidings.client import Client

ROOT = Path(__file__).resolve().parents[2]


def spark_env() -> dict[str, str]:
    """Environment for a Spark driver: Python workers run this interpreter and can
    import this checkout (and so find ``pyspark_tidings``) whatever the install."""
    path = os.environ.get("PYTHONPATH", "")
    return {
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), path) if p),
    }


def build_session(app: str) -> Any:
    """A small ``local[2,2]`` session (a task may fail once) bound to 127.0.0.1 with no UI."""
    from pyspark.sql import SparkSession

    return (
        SparkSession.builder.master("local[2,2]")
        .appName(app)
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.sql.streaming.stopTimeout", "10s")
        .config("spark.sql.session.timeZone", "UTC")
        # The tests' queries are small and short: the driver JVM's start-up and first
        # queries, not its steady state, are their cost. The optimising compiler's and
        # the parallel collector's threads would compete with them (and with the
        # server) for the two cores; the quick compiler alone and one collector thread
        # roughly halve a session's start and first job there.
        .config("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
        .getOrCreate()
    )


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """The one SparkSession of the test run."""
    os.environ.update(spark_env())
    session = build_session("tidings-tests")
    session.sparkContext.setLogLevel("ERROR")
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A ``tidings serve`` shared by the Spark tests (1 s transaction sweeps)."""
    proc = ServerProcess(tmp_path_factory.mktemp("spark-server") / "data").start()
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture
def client(server: ServerProcess) -> Iterator[Client]:
    with Client(server.url) as c:
        yield c


@pytest.fixture
def new_topic(client: Client) -> Callable[[], str]:
    """Create topics no other test uses."""

    def make() -> str:
        name = "s-" + uuid.uuid4().hex[:12]
        client.create_topic(name)
        return name

    return make
