"""Streaming reads and exactly-once streaming writes on the shared local SparkSession."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql.streaming.datasource import ReadMaxRows

from tests.e2e.serverproc import ServerProcess
from tidings.client import Client
from tidings.errors import ProducerFenced, TransactionNotInProgress
from tidings.spark.offsets import decode_offset
from tidings.spark.options import parse_read_options
from tidings.spark.sink import begin_write, control_topic, publish_and_commit
from tidings.spark.stream_reader import TidingsStreamReader
from tidings.structs import Record

pytestmark = pytest.mark.spark


def _stream(spark: Any, server: ServerProcess, topic: str, **options: str) -> Any:
    reader = spark.readStream.format("tidings").option("url", server.url).option("topic", topic)
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load()


def _pipe(spark: Any, server: ServerProcess, source: str, sink: str, checkpoint: Path) -> Any:
    """Copy ``source`` to ``sink`` with the uppercased value, all available, then stop."""
    df = _stream(spark, server, source).selectExpr("key", "upper(cast(value as string)) as value")
    query = (
        df.writeStream.format("tidings")
        .option("url", server.url)
        .option("topic", sink)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    assert query.exception() is None
    return query


def test_streaming_round_trip_restarts_where_it_stopped(
    spark: Any,
    server: ServerProcess,
    client: Client,
    new_topic: Callable[[], str],
    tmp_path: Path,
) -> None:
    source, sink = new_topic(), new_topic()
    client.publish(source, [Record(f"m{i}".encode(), f"k{i}".encode()) for i in range(5)])
    _pipe(spark, server, source, sink, tmp_path / "ckpt")
    client.publish(source, [f"m{i}".encode() for i in range(5, 8)])
    _pipe(spark, server, source, sink, tmp_path / "ckpt")
    out = client.poll(sink, transaction=client.snapshot())
    assert [m.payload for m in out] == [f"M{i}".encode() for i in range(8)]
    assert [m.key for m in out[:5]] == [f"k{i}".encode() for i in range(5)]
    markers = client.poll(
        control_topic(_query_id(tmp_path / "ckpt")), transaction=client.snapshot()
    )
    assert len(markers) == 2  # one per micro-batch, committed with it


def _query_id(checkpoint: Path) -> str:
    from tidings.spark.writer import query_id_from_checkpoint

    query_id = query_id_from_checkpoint(str(checkpoint))
    assert query_id is not None
    return query_id


def test_replayed_batch_is_not_published_twice(
    spark: Any,
    server: ServerProcess,
    client: Client,
    new_topic: Callable[[], str],
    tmp_path: Path,
) -> None:
    source, sink = new_topic(), new_topic()
    client.publish(source, [f"m{i}".encode() for i in range(4)])
    checkpoint = tmp_path / "ckpt"
    _pipe(spark, server, source, sink, checkpoint)
    # Forget that Spark recorded the batch, as if the driver died right after our commit:
    # the restarted query replays batch 0 from the offset log.
    for done in (checkpoint / "commits").iterdir():
        done.unlink()
    replay = _pipe(spark, server, source, sink, checkpoint)
    assert [(p["batchId"], p["numInputRows"]) for p in replay.recentProgress][:1] == [(0, 4)]
    out = client.poll(sink, transaction=client.snapshot())
    assert [m.payload for m in out] == [b"M0", b"M1", b"M2", b"M3"]
    everything = client.poll(sink)  # read-uncommitted: the replay did not even publish
    assert [m.payload for m in everything] == [b"M0", b"M1", b"M2", b"M3"]


def test_admission_control_and_available_now(
    spark: Any, server: ServerProcess, client: Client, new_topic: Callable[[], str]
) -> None:
    a, b = new_topic(), new_topic()
    client.publish(a, [f"a{i}".encode() for i in range(7)])
    client.publish(b, [f"b{i}".encode() for i in range(3)])
    name = "adm_" + uuid.uuid4().hex[:8]
    query = (
        _stream(spark, server, f"{a},{b}", maxMessagesPerTrigger="4")
        .writeStream.format("memory")
        .queryName(name)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert sizes == [4, 4, 2]
    rows = spark.table(name).collect()
    by_topic = {t: [bytes(r.value) for r in rows if r.topic == t] for t in (a, b)}
    assert by_topic[a] == [f"a{i}".encode() for i in range(7)]
    assert by_topic[b] == [f"b{i}".encode() for i in range(3)]


def test_available_now_reads_to_the_stable_end_found_at_start_and_stops(
    spark: Any, server: ServerProcess, client: Client, new_topic: Callable[[], str]
) -> None:
    ended, waiting = new_topic(), new_topic()
    # The newest entry of `ended` is a rolled-back transaction's: nothing to read there.
    client.publish(ended, [b"e1", b"e2", b"e3"])
    aborted = client.begin(60)
    info = client.publish(ended, b"aborted", write_pointer=aborted.write_pointer)
    client.rollback(ended, info)
    client.abort(aborted.write_pointer)
    # In `waiting`, w2 comes after a transaction still open: not stable yet.
    client.publish(waiting, b"w1")
    pending = client.begin(60)
    client.publish(waiting, b"open", write_pointer=pending.write_pointer)
    client.publish(waiting, b"w2")
    try:
        name = "now_" + uuid.uuid4().hex[:8]
        query = (
            _stream(spark, server, f"{ended},{waiting}", maxMessagesPerTrigger="1")
            .writeStream.format("memory")
            .queryName(name)
            .trigger(availableNow=True)
            .start()
        )
        assert query.awaitTermination(120)
        assert query.exception() is None
        rows = spark.table(name).collect()
        by_topic = {t: [bytes(r.value) for r in rows if r.topic == t] for t in (ended, waiting)}
        assert by_topic == {ended: [b"e1", b"e2", b"e3"], waiting: [b"w1"]}
    finally:
        client.abort(pending.write_pointer)


def test_a_short_batch_end_found_ahead_is_looked_for_again(
    server: ServerProcess, client: Client, new_topic: Callable[[], str]
) -> None:
    # Each batch's end is looked for ahead, while the batch before runs. One found when
    # the topic had fewer messages than the limit must not hide what came since; a
    # full one is taken as it is.
    topic = new_topic()
    options = {"url": server.url, "topic": topic, "maxMessagesPerTrigger": "3"}
    reader = TidingsStreamReader(parse_read_options(options, streaming=True))
    limit = ReadMaxRows(3)
    try:
        client.publish(topic, [b"a", b"b", b"c", b"d"])
        ids = [m.id.hex for m in client.poll(topic)]
        first = reader.latestOffset(reader.initialOffset(), limit)
        assert decode_offset(first) == {topic: ids[2]}
        second = reader.latestOffset(first, limit)  # found ahead: one message, short
        assert decode_offset(second) == {topic: ids[3]}
        client.publish(topic, [b"e", b"f", b"g", b"h"])
        ids = [m.id.hex for m in client.poll(topic)]
        third = reader.latestOffset(second, limit)  # the short scan ahead is not reused
        assert decode_offset(third) == {topic: ids[6]}
        fourth = reader.latestOffset(third, limit)
        assert decode_offset(fourth) == {topic: ids[7]}
    finally:
        reader.stop()


def test_read_committed_stream_skips_aborted_and_never_skips_ahead(
    spark: Any, server: ServerProcess, client: Client, new_topic: Callable[[], str]
) -> None:
    topic = new_topic()
    name = "rc_" + uuid.uuid4().hex[:8]
    query = (
        _stream(spark, server, topic)
        .writeStream.format("memory")
        .queryName(name)
        .trigger(processingTime="200 milliseconds")
        .start()
    )

    def seen() -> list[bytes]:
        query.processAllAvailable()
        return [bytes(r.value) for r in spark.table(name).orderBy("messageId").collect()]

    try:
        client.publish(topic, b"m1")
        pending = client.begin(60)
        client.store(topic, [b"m2a", b"m2b"], write_pointer=pending.write_pointer)
        client.publish(topic, [], write_pointer=pending.write_pointer)
        client.publish(topic, b"m3")
        assert seen() == [b"m1"]  # m3 waits behind the transaction in progress
        client.commit(pending.write_pointer)
        assert seen() == [b"m1", b"m2a", b"m2b", b"m3"]

        timing_out = client.begin(1)
        client.publish(topic, b"timed out", write_pointer=timing_out.write_pointer)
        client.publish(topic, b"m4")
        aborted = client.begin(60)
        info = client.publish(topic, b"aborted", write_pointer=aborted.write_pointer)
        client.rollback(topic, info)  # Tephra: roll back, then abort
        client.abort(aborted.write_pointer)
        invalidated = client.begin(60)
        client.publish(topic, b"invalidated", write_pointer=invalidated.write_pointer)
        client.invalidate(invalidated.write_pointer)
        client.publish(topic, b"m5")
        deadline = time.monotonic() + 30
        while (
            time.monotonic() < deadline
            and timing_out.write_pointer not in client.transactions().invalid
        ):
            time.sleep(0.2)
        assert seen() == [b"m1", b"m2a", b"m2b", b"m3", b"m4", b"m5"]
    finally:
        query.stop()


def test_a_fenced_sink_cannot_commit(
    server: ServerProcess, client: Client, new_topic: Callable[[], str]
) -> None:
    out = new_topic()
    sink_id = "fence-" + uuid.uuid4().hex[:8]
    old = begin_write(client, 60, sink_id)
    client.store(out, [b"zombie"], write_pointer=old.write_pointer)
    new = begin_write(client, 60, sink_id)  # a restarted query registers again
    assert new.epoch is not None and old.epoch is not None and new.epoch > old.epoch
    with pytest.raises((ProducerFenced, TransactionNotInProgress)):
        publish_and_commit(client, old, [out])
    assert client.poll(out, transaction=client.snapshot()) == []
    client.store(out, [b"fresh"], write_pointer=new.write_pointer)
    publish_and_commit(client, new, [out])
    assert [m.payload for m in client.poll(out, transaction=client.snapshot())] == [b"fresh"]


def test_a_topic_added_on_restart_is_read_from_its_start(
    spark: Any,
    server: ServerProcess,
    client: Client,
    new_topic: Callable[[], str],
    tmp_path: Path,
) -> None:
    first, added, sink = new_topic(), new_topic(), new_topic()
    client.publish(first, [b"a0", b"a1"])
    client.publish(added, [b"b0", b"b1"])
    _pipe(spark, server, first, sink, tmp_path / "ckpt")
    client.publish(first, b"a2")
    _pipe(spark, server, f"{first},{added}", sink, tmp_path / "ckpt")
    out = [m.payload for m in client.poll(sink, transaction=client.snapshot())]
    assert out[:2] == [b"A0", b"A1"]
    assert sorted(out[2:]) == [b"A2", b"B0", b"B1"]


def test_register_is_the_same_source(
    spark: Any, server: ServerProcess, client: Client, new_topic: Callable[[], str]
) -> None:
    import tidings.spark

    topic = new_topic()
    client.publish(topic, b"x")
    tidings.spark.register(spark)
    df = spark.read.format("tidings").option("url", server.url).option("topic", topic).load()
    assert [bytes(r.value) for r in df.collect()] == [b"x"]


def test_latest_starts_at_the_last_stable_position(
    spark: Any,
    server: ServerProcess,
    client: Client,
    new_topic: Callable[[], str],
    tmp_path: Path,
) -> None:
    # A transaction open when the stream starts at "latest" and committed afterwards
    # is read, not skipped (Kafka's read_committed consumers start at the LSO).
    source, sink = new_topic(), new_topic()
    client.publish(source, [b"before"])
    tx = client.begin()
    client.publish(source, [b"open"], write_pointer=tx.write_pointer)

    def run() -> None:
        df = _stream(spark, server, source, startingMessageId="latest")
        query = (
            df.selectExpr("key", "upper(cast(value as string)) as value")
            .writeStream.format("tidings")
            .option("url", server.url)
            .option("topic", sink)
            .option("checkpointLocation", str(tmp_path / "ckpt"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(120)
        assert query.exception() is None

    run()  # starts at the open transaction and stops there
    client.commit(tx)
    client.publish(source, [b"after"])
    run()
    out = [m.payload for m in client.poll(sink, transaction=client.snapshot())]
    assert out == [b"OPEN", b"AFTER"]
