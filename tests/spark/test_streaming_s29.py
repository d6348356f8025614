"""A topic deleted and created again but left empty under a streaming query, on the
shared local SparkSession: noticed as a re-created topic with messages is, not only
once a message arrives."""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import StreamingQueryException

from tests.e2e.serverproc import ServerProcess
from tidings.client import Client

pytestmark = pytest.mark.spark


def _stream(spark: Any, server: ServerProcess, topic: str, **options: str) -> Any:
    reader = spark.readStream.format("tidings").option("url", server.url).option("topic", topic)
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load()


def test_a_running_query_fails_when_its_topic_is_created_again_empty(
    spark: Any, server: ServerProcess, client: Client, new_topic: Callable[[], str]
) -> None:
    topic = new_topic()
    client.publish(topic, [b"old0", b"old1"])
    name = "empty_regen_" + uuid.uuid4().hex[:8]
    query = (
        _stream(spark, server, topic)
        .writeStream.format("memory")
        .queryName(name)
        .trigger(processingTime="0.2 seconds")
        .start()
    )
    try:
        deadline = time.monotonic() + 60
        while spark.table(name).count() < 2:
            assert query.isActive and time.monotonic() < deadline, query.exception()
            time.sleep(0.1)
        client.delete_topic(topic)
        client.create_topic(topic)  # and nothing published to it
        with pytest.raises(StreamingQueryException) as failed:
            query.awaitTermination(20)  # False: the query went on as if nothing happened
        error = str(failed.value)
        assert repr(topic) in error and "generation 1, now 2" in error, error
    finally:
        query.stop()


def test_a_query_restarted_on_a_topic_created_again_empty_fails_or_starts_it_over(
    spark: Any,
    server: ServerProcess,
    client: Client,
    new_topic: Callable[[], str],
    tmp_path: Path,
) -> None:
    source, sink = new_topic(), new_topic()
    client.publish(source, [b"old0", b"old1"])

    def run(**options: str) -> Any:
        query = (
            _stream(spark, server, source, **options)
            .writeStream.format("tidings")
            .option("url", server.url)
            .option("topic", sink)
            .option("checkpointLocation", str(tmp_path / "ckpt"))
            .trigger(availableNow=True)
            .start()
        )
        with contextlib.suppress(StreamingQueryException):  # query.exception() has it
            query.awaitTermination(120)
        return query

    assert run().exception() is None
    client.publish(source, [b"old2"])  # never read: lost with the old topic
    client.delete_topic(source)
    client.create_topic(source)
    refused = run()  # finished without a word before: the offsets are the old topic's
    assert refused.exception() is not None
    assert "generation 1, now 2" in str(refused.exception()), refused.exception()
    assert run(failOnDataLoss="false").exception() is None
    client.publish(source, [b"new0"])
    assert run().exception() is None  # the checkpoint now has the new generation
    out = [m.payload for m in client.poll(sink, transaction=client.snapshot())]
    assert out == [b"old0", b"old1", b"new0"]


def test_a_stream_started_from_a_checkpointed_offset_checks_its_generations(
    server: ServerProcess, client: Client, new_topic: Callable[[], str]
) -> None:
    """The planner on its own (no Spark): a start taken from another query's checkpoint
    is of the generation that offset records."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    from tidings.errors import TopicNotFound
    from tidings.spark.options import parse_read_options
    from tidings.spark.stream_reader import TidingsStreamReader

    topic = new_topic()
    client.publish(topic, [b"old0"])
    old = client.poll(topic)[-1].id.hex
    client.delete_topic(topic)
    client.create_topic(topic)
    offset = json.dumps({topic: old, "@generations": {topic: 1}})
    options = {"url": server.url, "topic": topic, "startingMessageId": offset}
    reader = TidingsStreamReader(parse_read_options(options, streaming=True))
    try:
        start = reader.initialOffset()
        assert start == {topic: old, "@generations": {topic: 1}}
        with pytest.raises(TopicNotFound, match=r"generation 1, now 2"):
            reader.latestOffset(start, ReadAllAvailable())
    finally:
        reader.stop()
