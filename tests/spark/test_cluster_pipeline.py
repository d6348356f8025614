"""The exactly-once Spark pipeline with its source on one instance and its sink on
another, both on one PostgreSQL database (one leads, the other forwards)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import fresh_database
from tests.e2e.serverproc import ServerProcess
from tidings.client import Client
from tidings.structs import Record

pytestmark = pytest.mark.spark


@pytest.fixture
def two_instances(
    tmp_path: Path, postgres_url: str
) -> Iterator[tuple[ServerProcess, ServerProcess]]:
    url = fresh_database(postgres_url)
    made = [
        ServerProcess(tmp_path / f"node{n}", ["--store", url, "--lease-seconds", "3"]).start()
        for n in range(2)
    ]
    try:
        yield made[0], made[1]
    finally:
        for proc in made:
            proc.kill()


def _pipe(spark: Any, source_url: str, sink_url: str, checkpoint: Path) -> None:
    df = (
        spark.readStream.format("tidings")
        .option("url", source_url)
        .option("topic", "in")
        .load()
        .selectExpr("key", "upper(cast(value as string)) as value")
    )
    query = (
        df.writeStream.format("tidings")
        .option("url", sink_url)
        .option("topic", "out")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(180)
    assert query.exception() is None


def test_source_and_sink_on_different_instances(
    spark: Any, two_instances: tuple[ServerProcess, ServerProcess], tmp_path: Path
) -> None:
    leader, other = two_instances
    assert httpx.get(other.url + "/readyz", timeout=5).json()["status"] == "forwarding"
    with Client(leader.url) as client:
        client.create_topic("in")
        client.create_topic("out")
        client.publish("in", [Record(f"m{i}".encode(), f"k{i}".encode()) for i in range(6)])
    checkpoint = tmp_path / "ckpt"
    # Read through the leader, write through the other instance; then the other way.
    _pipe(spark, leader.url, other.url, checkpoint)
    with Client(other.url) as client:
        client.publish("in", [f"m{i}".encode() for i in range(6, 9)])
    _pipe(spark, other.url, leader.url, checkpoint)
    with Client(leader.url) as a, Client(other.url) as b:
        seen_a = [m.payload for m in a.poll("out", transaction=a.snapshot())]
        seen_b = [m.payload for m in b.poll("out", transaction=b.snapshot())]
    assert seen_a == seen_b == [f"M{i}".encode() for i in range(9)]
