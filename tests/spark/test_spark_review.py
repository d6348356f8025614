"""Edge cases of the Spark source and sink, on the shared local SparkSession and a real
server: where a stream starts, reads against a server with small pages, and options."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.serverproc import ServerProcess
from tidings.client import Client
from tidings.spark.offsets import position_reaches
from tidings.spark.options import parse_read_options, parse_write_options
from tidings.structs import MessageId

pytestmark = pytest.mark.spark


def test_read_uncommitted_stream_from_latest_starts_after_the_newest_message(
    spark: Any, server: ServerProcess, client: Client, new_topic: Callable[[], str]
) -> None:
    # Read-uncommitted sees an open transaction's entries: "latest" is after the
    # newest message, not at the open transaction (that is read-committed's start).
    topic = new_topic()
    client.publish(topic, b"before")
    open_tx = client.begin(60)
    client.publish(topic, b"open", write_pointer=open_tx.write_pointer)
    client.publish(topic, b"after open")
    name = "ru_" + uuid.uuid4().hex[:8]
    query = (
        spark.readStream.format("tidings")
        .option("url", server.url)
        .option("topic", topic)
        .option("startingMessageId", "latest")
        .option("isolation", "read_uncommitted")
        .load()
        .writeStream.format("memory")
        .queryName(name)
        .start()
    )
    try:
        query.processAllAvailable()
        client.publish(topic, b"new")
        query.processAllAvailable()
        assert [bytes(r.value) for r in spark.table(name).collect()] == [b"new"]
    finally:
        query.stop()
        client.abort(open_tx.write_pointer)


@pytest.fixture(scope="module")
def small_pages(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A server that answers at most 5 messages per poll, whatever the limit asked."""
    where = tmp_path_factory.mktemp("small-limit")
    env = {"TIDINGS_FETCH_MAX_LIMIT": "5", "TIDINGS_FETCH_DEFAULT_LIMIT": "5"}
    proc = ServerProcess(where / "data", [], env).start()
    try:
        yield proc
    finally:
        proc.stop()


def test_bounded_batch_read_scans_past_pages_the_server_cut_short(
    spark: Any, small_pages: ServerProcess
) -> None:
    # The driver scans ids to an ending bound; a page shorter than asked (the server
    # clamps the limit) is not the topic's end.
    with Client(small_pages.url) as admin:
        admin.create_topic("bounded")
        admin.publish("bounded", [b"%02d" % i for i in range(20)])
        ids: list[MessageId] = []
        for _ in range(10):  # pages of 5
            ids += admin.poll_ids("bounded", ids[-1] if ids else None, inclusive=not ids)
    assert len(ids) == 20

    def read(**options: str) -> list[bytes]:
        reader = spark.read.format("tidings").option("url", small_pages.url)
        for k, v in {"topic": "bounded", **options}.items():
            reader = reader.option(k, v)
        return [bytes(r.value) for r in reader.load().orderBy("messageId").collect()]

    everything = [b"%02d" % i for i in range(20)]
    assert read(endingMessageId=ids[17].hex) == everything[:18]
    assert read(endingTimestamp=str(ids[-1].publish_ts + 1)) == everything


def test_stream_batches_fill_the_limit_on_a_server_with_short_pages(
    spark: Any, small_pages: ServerProcess
) -> None:
    with Client(small_pages.url) as admin:
        admin.create_topic("limited")
        admin.publish("limited", [b"%02d" % i for i in range(20)])
    name = "lim_" + uuid.uuid4().hex[:8]
    query = (
        spark.readStream.format("tidings")
        .option("url", small_pages.url)
        .option("topic", "limited")
        .option("maxMessagesPerTrigger", "8")
        .load()
        .writeStream.format("memory")
        .queryName(name)
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(120)
    assert query.exception() is None
    sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert sizes == [8, 8, 4]
    rows = spark.table(name).orderBy("messageId").collect()
    assert [bytes(r.value) for r in rows] == [b"%02d" % i for i in range(20)]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"startingOffsets": "latest"}, "unknown option 'startingoffsets'.*startingMessageId"),
        ({"maxOffsetsPerTrigger": "5"}, "unknown option.*maxMessagesPerTrigger"),
        ({"fetchsise": "5"}, "unknown option 'fetchsise'"),
        ({"path": "orders"}, "takes no path"),
    ],
)
def test_an_unknown_read_option_is_refused(options: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_read_options({"topic": "a", **options}, streaming=True)


def test_write_options_spark_adds_are_accepted_and_unknown_ones_refused() -> None:
    o = parse_write_options({"topic": "a", "queryname": "q", "checkpointlocation": "/c"})
    assert o.topic == "a" and o.checkpoint_location == "/c"
    with pytest.raises(ValueError, match="unknown option 'sink_id'"):
        parse_write_options({"topic": "a", "sink_id": "s"})


def test_a_misspelt_option_fails_the_read_instead_of_reading_from_the_start(
    spark: Any, server: ServerProcess, client: Client, new_topic: Callable[[], str]
) -> None:
    topic = new_topic()
    client.publish(topic, [b"old"])
    reader = (
        spark.read.format("tidings")
        .option("url", server.url)
        .option("topic", topic)
        .option("startingOffsets", "latest")
    )
    with pytest.raises(Exception, match="unknown option 'startingoffsets'"):
        reader.load().collect()
    writer = spark.createDataFrame([(b"x",)], "value binary").write.format("tidings")
    with pytest.raises(Exception, match="unknown option 'storebatch'"):
        (
            writer.mode("append")
            .option("url", server.url)
            .option("topic", topic)
            .option("storeBatch", "10")
            .save()
        )
    assert [m.payload for m in client.poll(topic)] == [b"old"]


def test_a_read_starting_past_an_open_transaction_reads_what_follows(
    spark: Any, server: ServerProcess, client: Client, new_topic: Callable[[], str]
) -> None:
    # A read-committed read stops at the first open entry it meets. Starting after the
    # oldest open transaction's first entry, it reads on, as a consumer does; it read
    # nothing when its end was taken from the topic's oldest open transaction.
    topic = new_topic()
    client.publish(topic, b"m1")
    stuck = client.begin(60)
    client.publish(topic, b"open", write_pointer=stuck.write_pointer)
    client.publish(topic, b"m2")
    time.sleep(0.005)  # m3 in a later millisecond than m2: startingTimestamp picks m3
    client.publish(topic, [b"m3", b"m4"])
    start = client.poll(topic)[3]
    assert start.payload == b"m3"
    assert start.id.publish_ts > client.poll(topic)[2].id.publish_ts
    expected = [b"m3", b"m4"]
    try:
        assert [
            m.payload for m in client.poll(topic, start.id, transaction=client.snapshot())
        ] == expected
        for option, value in (
            ("startingMessageId", start.id.hex),
            ("startingTimestamp", str(start.id.publish_ts)),
        ):
            df = (
                spark.read.format("tidings")
                .option("url", server.url)
                .option("topic", topic)
                .option(option, value)
                .load()
            )
            assert [bytes(r.value) for r in df.orderBy("messageId").collect()] == expected
        name = "past_" + uuid.uuid4().hex[:8]
        query = (
            spark.readStream.format("tidings")
            .option("url", server.url)
            .option("topic", topic)
            .option("startingMessageId", start.id.hex)
            .load()
            .writeStream.format("memory")
            .queryName(name)
            .trigger(availableNow=True)
            .start()
        )
        assert query.awaitTermination(120)
        assert query.exception() is None
        rows = spark.table(name).orderBy("messageId").collect()
        assert [bytes(r.value) for r in rows] == expected
    finally:
        client.abort(stuck.write_pointer)


def test_position_reaches() -> None:
    mid = MessageId(1_000, 5, 0, 0)
    assert position_reaches("earliest", mid)
    assert position_reaches("time:1000", mid) and not position_reaches("time:1001", mid)
    assert position_reaches(f"at:{mid.hex}", mid) and not position_reaches(mid.hex, mid)
    assert position_reaches(mid.previous().hex, mid)
    assert not position_reaches(f"at:{MessageId(1_000, 6, 0, 0).hex}", mid)


def test_a_named_streaming_write_with_a_checkpoint_is_accepted(
    spark: Any, server: ServerProcess, client: Client, new_topic: Callable[[], str], tmp_path: Path
) -> None:
    # Spark adds queryName and checkpointLocation to the sink's options itself.
    source, sink = new_topic(), new_topic()
    client.publish(source, [b"a", b"b"])
    query = (
        spark.readStream.format("tidings")
        .option("url", server.url)
        .option("topic", source)
        .load()
        .writeStream.format("tidings")
        .queryName("named_" + uuid.uuid4().hex[:8])
        .option("url", server.url)
        .option("topic", sink)
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(120)
    assert query.exception() is None
    assert [m.payload for m in client.poll(sink, transaction=client.snapshot())] == [b"a", b"b"]
