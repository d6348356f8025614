"""A topic deleted and created again under a streaming query, on the shared local
SparkSession: the query fails naming the topic, unless failOnDataLoss=false says to
read the new topic from its start."""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import StreamingQueryException

from tests.e2e.serverproc import ServerProcess
from tidings.client import Client
from tidings.errors import TopicNotFound
from tidings.spark.offsets import GENERATIONS, decode_generations, decode_offset, encode_offset
from tidings.spark.options import parse_read_options

pytestmark = pytest.mark.spark


def _stream(spark: Any, server: ServerProcess, topic: str, **options: str) -> Any:
    reader = spark.readStream.format("tidings").option("url", server.url).option("topic", topic)
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load()


def _recreate(client: Client, topic: str, payloads: list[bytes]) -> None:
    client.delete_topic(topic)
    client.create_topic(topic)
    client.publish(topic, payloads)


def test_a_topic_created_again_under_a_running_query_fails_it_naming_the_topic(
    spark: Any, server: ServerProcess, client: Client, new_topic: Callable[[], str]
) -> None:
    topic = new_topic()
    client.publish(topic, [b"old0", b"old1", b"old2"])
    name = "regen_" + uuid.uuid4().hex[:8]
    query = (
        _stream(spark, server, topic)
        .writeStream.format("memory")
        .queryName(name)
        .trigger(processingTime="0.5 seconds")
        .start()
    )
    try:
        deadline = time.monotonic() + 60
        while spark.table(name).count() < 3:
            assert query.isActive and time.monotonic() < deadline, query.exception()
            time.sleep(0.2)
        _recreate(client, topic, [b"new0", b"new1"])
        with pytest.raises(StreamingQueryException) as failed:
            query.awaitTermination(60)  # False, not raising: it read the new topic on
        error = str(failed.value)
        assert repr(topic) in error and "failOnDataLoss" in error, error
        rows = [bytes(r.value) for r in spark.table(name).collect()]
        assert rows == [b"old0", b"old1", b"old2"]  # nothing of the new topic
    finally:
        query.stop()


def test_fail_on_data_loss_false_reads_the_new_topic_from_its_start(
    spark: Any,
    server: ServerProcess,
    client: Client,
    new_topic: Callable[[], str],
    tmp_path: Path,
) -> None:
    source, sink = new_topic(), new_topic()
    client.publish(source, [b"old0", b"old1", b"old2"])

    def run(**options: str) -> Any:
        query = (
            _stream(spark, server, source, **options)
            .selectExpr("key", "upper(cast(value as string)) as value")
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
    # Published before the deletion, after the query stopped: lost with the old topic.
    client.publish(source, [b"old3"])
    _recreate(client, source, [b"new0", b"new1"])
    refused = run()  # restarted from the checkpoint, failOnDataLoss by default
    assert refused.exception() is not None and repr(source) in str(refused.exception())
    assert run(failOnDataLoss="false").exception() is None
    out = [m.payload for m in client.poll(sink, transaction=client.snapshot())]
    assert out == [b"OLD0", b"OLD1", b"OLD2", b"NEW0", b"NEW1"]
    client.publish(source, [b"new2"])  # and on from there, in the new topic
    assert run(failOnDataLoss="false").exception() is None
    out = [m.payload for m in client.poll(sink, transaction=client.snapshot())]
    assert out[5:] == [b"NEW2"]
    client.delete_topic(source)  # gone: nothing to read, and no failure ...
    assert run(failOnDataLoss="false").exception() is None
    client.create_topic(source)  # ... until it is back
    client.publish(source, [b"third0"])
    assert run(failOnDataLoss="false").exception() is None
    out = [m.payload for m in client.poll(sink, transaction=client.snapshot())]
    assert out[6:] == [b"THIRD0"]


def test_fail_on_data_loss_is_a_read_option() -> None:
    assert parse_read_options({"topic": "t"}, streaming=True).fail_on_data_loss
    off = parse_read_options({"topic": "t", "FAILONDATALOSS": "False"}, streaming=True)
    assert not off.fail_on_data_loss
    with pytest.raises(ValueError, match="failOnDataLoss must be true or false"):
        parse_read_options({"topic": "t", "failondataloss": "maybe"}, streaming=True)
    # Batch reads too, as Spark's Kafka source: offsets given may be out of date.
    batch = parse_read_options({"topic": "t", "failondataloss": "false"}, streaming=False)
    assert not batch.fail_on_data_loss
    with pytest.raises(ValueError, match="applies to reads only"):
        from tidings.spark.options import parse_write_options

        parse_write_options({"topic": "t", "failondataloss": "false"})


def test_offsets_record_generations_and_read_older_ones() -> None:
    offset = encode_offset({"b": "earliest", "a": "earliest"}, {"b": 2, "a": 1})
    assert list(offset) == ["a", "b", GENERATIONS]
    assert decode_offset(offset) == {"a": "earliest", "b": "earliest"}
    assert decode_generations(offset) == {"a": 1, "b": 2}
    assert decode_generations({"a": "earliest"}) == {}  # checkpointed before
    with pytest.raises(ValueError):
        decode_generations({"a": "earliest", GENERATIONS: {"a": "1"}})


def test_a_task_whose_topic_was_created_again_since_planning_fails(
    server: ServerProcess, client: Client, new_topic: Callable[[], str]
) -> None:
    from tidings.spark.reader import read_partition
    from tidings.spark.scan import TopicRange

    topic = new_topic()
    client.publish(topic, [b"old0"])
    planned_end = client.poll(topic)[-1].id
    _recreate(client, topic, [b"new0"])  # between planning and the task's read
    part = TopicRange(topic=topic, start="earliest", end=planned_end.hex, generation=1)
    options = parse_read_options({"url": server.url, "topic": topic}, streaming=True)
    with pytest.raises(TopicNotFound, match=r"created again \(generation 1, now 2\)"):
        list(read_partition(options, part))
    lenient = parse_read_options(
        {"url": server.url, "topic": topic, "failOnDataLoss": "false"}, streaming=True
    )
    assert list(read_partition(lenient, part)) == []
    # The range planned in the topic as it is now reads as before.
    now = TopicRange(topic=topic, start="earliest", end="f" * 40, generation=2)
    rows = [row for batch in read_partition(options, now) for row in batch.to_pylist()]
    assert [bytes(r["value"]) for r in rows] == [b"new0"]
