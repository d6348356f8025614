"""Batch reads and writes on a real local SparkSession."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from typing import Any

import pytest

from tests.e2e.serverproc import ServerProcess
from tidings.client import Client
from tidings.structs import Record

pytestmark = pytest.mark.spark


def _read(spark: Any, server: ServerProcess, topic: str, **options: str) -> list[Any]:
    reader = spark.read.format("tidings").option("url", server.url).option("topic", topic)
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load().orderBy("topic", "messageId").collect()


def test_batch_read_round_trip_with_keys_and_headers(
    spark: Any, server: ServerProcess, client: Client, new_topic: Callable[[], str]
) -> None:
    topic = new_topic()
    client.publish(topic, [Record(b"v0", b"k0", {"h": b"1"}), Record(b"v1")])
    tx = client.begin(30)
    client.store(
        topic,
        [Record(f"p{i}".encode(), None, {"i": bytes([i])}) for i in range(5)],
        write_pointer=tx.write_pointer,
    )
    client.publish(topic, [], write_pointer=tx.write_pointer)
    client.commit(tx.write_pointer)
    expected = client.poll(topic)
    rows = _read(spark, server, topic, minPartitions="3")
    assert [r.messageId for r in rows] == [m.id.hex for m in expected]
    assert [bytes(r.value) for r in rows] == [b"v0", b"v1", b"p0", b"p1", b"p2", b"p3", b"p4"]
    assert rows[0].key == b"k0" and rows[1].key is None
    assert [(h.key, bytes(h.value)) for h in rows[0].headers] == [("h", b"1")]
    assert {r.topic for r in rows} == {topic} and {r.namespace for r in rows} == {"default"}
    assert int(rows[0].publishTime.timestamp() * 1000) == expected[0].id.publish_ts


def test_batch_write_round_trip(
    spark: Any, server: ServerProcess, client: Client, new_topic: Callable[[], str]
) -> None:
    out, other = new_topic(), new_topic()
    rows = [
        (f"k{i}".encode(), f"value {i}".encode(), [("n", str(i).encode())], out if i % 3 else other)
        for i in range(30)
    ]
    df = spark.createDataFrame(
        rows,
        "key binary, value binary, headers array<struct<key:string,value:binary>>, topic string",
    ).repartition(2)
    df.write.format("tidings").option("url", server.url).mode("append").save()
    got = {t: client.poll(t, transaction=client.snapshot()) for t in (out, other)}
    assert sorted(m.payload for m in got[out] + got[other]) == sorted(r[1] for r in rows)
    for topic, messages in got.items():
        for m in messages:
            i = int(m.payload.split()[1])
            assert (m.key, dict(m.headers), topic) == (
                f"k{i}".encode(),
                {"n": str(i).encode()},
                rows[i][3],
            )
    # all of it came from one transaction: one entry per topic
    assert len({m.id.publish_ts for m in got[out]}) == 1


def test_batch_write_with_topic_option_and_strings(
    spark: Any, server: ServerProcess, client: Client, new_topic: Callable[[], str]
) -> None:
    out = new_topic()
    df = spark.createDataFrame([("a", "x"), ("b", "y")], "value string, topic string")
    (
        df.coalesce(1)
        .write.format("tidings")
        .option("url", server.url)
        .option("topic", out)
        .mode("append")
        .save()
    )
    assert [m.payload for m in client.poll(out)] == [b"a", b"b"]


def test_failed_batch_write_publishes_nothing(
    spark: Any, server: ServerProcess, client: Client, new_topic: Callable[[], str]
) -> None:
    out = new_topic()
    df = spark.createDataFrame([(b"ok",), (None,)], "value binary").repartition(2)
    with pytest.raises(Exception, match="must not be null"):
        df.write.format("tidings").option("url", server.url).option("topic", out).mode(
            "append"
        ).save()
    assert client.poll(out) == []  # not even read-uncommitted: nothing was published


def test_overwrite_and_bad_options_fail_at_planning(
    spark: Any, server: ServerProcess, new_topic: Callable[[], str]
) -> None:
    df = spark.createDataFrame([(b"x",)], "value binary")
    with pytest.raises(Exception, match="append-only"):
        df.write.format("tidings").option("topic", new_topic()).mode("overwrite").save()
    with pytest.raises(Exception, match="isolation"):
        spark.read.format("tidings").option("topic", "t").option(
            "isolation", "dirty"
        ).load().collect()


def test_read_committed_stops_at_a_transaction_in_progress(
    spark: Any, server: ServerProcess, client: Client, new_topic: Callable[[], str]
) -> None:
    topic = new_topic()
    client.publish(topic, b"before")
    open_tx = client.begin(60)
    client.publish(topic, b"open", write_pointer=open_tx.write_pointer)
    client.publish(topic, b"after")
    committed = [bytes(r.value) for r in _read(spark, server, topic, minPartitions="4")]
    everything = [
        bytes(r.value)
        for r in _read(spark, server, topic, isolation="read_uncommitted", minPartitions="4")
    ]
    client.commit(open_tx.write_pointer)
    assert committed == [b"before"]
    assert everything == [b"before", b"open", b"after"]
    assert [bytes(r.value) for r in _read(spark, server, topic)] == [b"before", b"open", b"after"]


def test_slices_end_where_the_oldest_open_transaction_begins(
    spark: Any, server: ServerProcess, client: Client, new_topic: Callable[[], str]
) -> None:
    # Messages over several milliseconds, so the read is cut into several time slices;
    # none of them may read past the open transaction (not even its later slices,
    # which start after it).
    topic = new_topic()
    before = []
    for i in range(12):
        before.append(f"before-{i}".encode())
        client.publish(topic, before[-1])
        time.sleep(0.003)
    open_tx = client.begin(60)
    client.publish(topic, b"open", write_pointer=open_tx.write_pointer)
    after = []
    for i in range(12):
        time.sleep(0.003)
        after.append(f"after-{i}".encode())
        client.publish(topic, after[-1])
    committed = [bytes(r.value) for r in _read(spark, server, topic, minPartitions="4")]
    dirty = _read(spark, server, topic, isolation="read_uncommitted", minPartitions="4")
    client.invalidate(open_tx.write_pointer)
    assert committed == before
    assert [bytes(r.value) for r in dirty] == [*before, b"open", *after]
    # Once it ended (invalid: its message is skipped), the read goes on to the end.
    assert [bytes(r.value) for r in _read(spark, server, topic, minPartitions="4")] == [
        *before,
        *after,
    ]
    assert [bytes(r.value) for r in _read(spark, server, new_topic())] == []


def test_starting_and_ending_bounds(
    spark: Any, server: ServerProcess, client: Client, new_topic: Callable[[], str]
) -> None:
    topic = new_topic()
    for i in range(6):
        client.publish(topic, str(i).encode())
    ids = [m.id for m in client.poll(topic)]

    def values(**options: str) -> list[bytes]:
        return [bytes(r.value) for r in _read(spark, server, topic, **options)]

    assert values(startingMessageId=ids[2].hex, endingMessageId=ids[4].hex) == [b"2", b"3", b"4"]
    assert values(startingTimestamp=str(ids[3].publish_ts)) == [
        str(i).encode() for i in range(6) if ids[i].publish_ts >= ids[3].publish_ts
    ]
    assert values(endingTimestamp=str(ids[0].publish_ts)) == []
    assert values(startingMessageId="latest") == []


def _payload_rows(server: ServerProcess, topic: str) -> int:
    """Payload Table rows of ``topic``, published or not, read from the server's store
    (LMDB allows a read-only reader next to the running server)."""
    from tidings.codec import keys, values
    from tidings.store.backends.lmdb import LmdbStore

    data = server.data_dir
    store = LmdbStore(data if (data / "data.mdb").exists() else data / "store", readonly=True)
    try:
        with store.read() as view:
            record = view.get("metadata", keys.topic_record_key("default", topic))
            assert record is not None
            topic_id, _ = values.decode_topic_record(record)
            raw_state = view.get("metadata", keys.state_key(topic_id))
            assert raw_state is not None
            lo, hi = keys.generation_range(topic_id, values.decode_state(raw_state).generation)
            return sum(1 for _ in view.scan("payloads", lo, hi))
    finally:
        store.close()


def test_a_task_retried_after_storing_commits_every_row_once(
    spark: Any, server: ServerProcess, client: Client, new_topic: Callable[[], str]
) -> None:
    out = new_topic()

    def flaky(batches: Any) -> Any:
        # Partition 0's first attempt ends with a null value: the writer has stored the
        # rows before it (storeBatchSize 2) when that row fails the task; the retry
        # (attempt 1) writes the partition again, without it.
        import pyarrow as pa
        from pyspark import TaskContext

        ctx = TaskContext.get()
        assert ctx is not None
        for batch in batches:
            ids = batch.column("id").to_pylist()
            yield pa.record_batch([pa.array([b"%d" % i for i in ids], pa.binary())], ["value"])
        if ctx.partitionId() == 0 and ctx.attemptNumber() == 0:
            yield pa.record_batch([pa.array([None], pa.binary())], ["value"])

    df = spark.range(0, 12, 1, 2).mapInArrow(flaky, "value binary")
    (
        df.write.format("tidings")
        .option("url", server.url)
        .option("topic", out)
        .option("storeBatchSize", "2")
        .mode("append")
        .save()
    )
    got = [m.payload for m in client.poll(out, transaction=client.snapshot())]
    assert sorted(got) == sorted(b"%d" % i for i in range(12))  # every row exactly once
    # Partition 0 (six rows) was stored twice: the failed attempt's rows are there,
    # under the same write pointer, and stay unseen -- even read-uncommitted.
    assert _payload_rows(server, out) == 18
    assert sorted(m.payload for m in client.poll(out)) == sorted(got)


def test_batch_read_and_write_with_a_token(
    spark: Any, tmp_path_factory: pytest.TempPathFactory
) -> None:
    token = "spark-token-0123456789"
    where = tmp_path_factory.mktemp("secured")
    auth = where / "auth.toml"
    digest = hashlib.sha256(token.encode()).hexdigest()
    auth.write_text(f'[[principal]]\nname = "spark"\ntoken_sha256 = "{digest}"\nadmin = true\n')
    secured = ServerProcess(where / "data", ["--auth-file", str(auth)]).start()
    try:
        with Client(secured.url, token=token) as admin:
            admin.create_topic("in")
            admin.create_topic("out")
            admin.publish("in", [b"a", b"b"])
        rows = _read(spark, secured, "in", token=token)
        assert [bytes(r.value) for r in rows] == [b"a", b"b"]
        with pytest.raises(Exception, match="Unauthorized"):
            _read(spark, secured, "in")
        df = spark.createDataFrame([(b"x",)], "value binary")
        (df.write.format("tidings").option("url", secured.url).option("topic", "out")
         .option("token", token).mode("append").save())  # fmt: skip
        with Client(secured.url, token=token) as admin:
            assert [m.payload for m in admin.poll("out")] == [b"x"]
    finally:
        secured.stop()


def test_batch_read_across_pages_cut_by_bytes(
    spark: Any, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A server whose pages hold about four of these messages: every range is read
    through page after page, and every row comes once, in order."""
    where = tmp_path_factory.mktemp("small-pages")
    small = ServerProcess(where / "data", [], {"TIDINGS_FETCH_MAX_BYTES": "4096"}).start()
    try:
        with Client(small.url) as admin:
            admin.create_topic("big")
            for batch in range(6):
                admin.publish("big", [b"%03d" % (50 * batch + i) * 333 for i in range(50)])
            tx = admin.begin(30)
            admin.store("big", [b"s" * 1500] * 7, write_pointer=tx.write_pointer)
            admin.publish("big", [], write_pointer=tx.write_pointer)
            admin.commit(tx.write_pointer)
        rows = _read(spark, small, "big", minPartitions="3")
        assert len(rows) == 307
        assert [bytes(r.value)[:3] for r in rows[:300]] == [b"%03d" % i for i in range(300)]
        assert [bytes(r.value) for r in rows[300:]] == [b"s" * 1500] * 7
    finally:
        small.stop()
