"""Batch reads given offsets that carry the topics' generations, as a streaming
checkpoint records them: as Spark's Kafka source does with offsets out of range, the
read fails naming the topic where it was deleted or created again since
(``failOnDataLoss``), or reads the topic as it is now."""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import StreamingQueryException

from tests.e2e.serverproc import ServerProcess
from tidings.client import Client
from tidings.errors import TopicNotFound
from tidings.spark.options import Bound, Start, parse_read_options
from tidings.spark.reader import TidingsBatchReader, read_partition

pytestmark = pytest.mark.spark

ID_A, ID_B = "0" * 39 + "a", "0" * 39 + "b"


def test_a_checkpointed_offset_is_read_as_the_stream_reads_it() -> None:
    offset = json.dumps({"t": ID_A, "u": "time:5", "@generations": {"t": 2, "u": 1}})
    o = parse_read_options(
        {"topic": "t,u,v", "startingMessageId": offset, "failOnDataLoss": "false"},
        streaming=False,
    )
    assert o.starts == {"t": Start("after", ID_A), "u": Start("time", 5), "v": Start("earliest")}
    assert o.generations == {"t": 2, "u": 1} and not o.fail_on_data_loss
    ending = json.dumps({"t": ID_B, "u": "earliest", "@generations": {"t": 2}})
    o = parse_read_options({"topic": "t,u", "endingMessageId": ending}, streaming=False)
    assert o.ends == {"t": Bound("id", ID_B), "u": Bound("time", 0)}  # "earliest": none read
    # Without @generations an id still starts at that message, as documented.
    plain = parse_read_options(
        {"topic": "t", "startingMessageId": f'{{"t": "{ID_A}"}}'}, streaming=False
    )
    assert plain.starts["t"] == Start("id", ID_A) and plain.generations == {}
    for bad, why in [
        ({"startingMessageId": '{"t": "x", "@generations": {"t": 1}}'}, "startingMessageId"),
        ({"startingMessageId": f'{{"t": "{ID_A}", "@generations": {{"w": 1}}}}'}, "'w'"),
        ({"startingMessageId": f'{{"t": "{ID_A}", "@generations": {{"t": "1"}}}}'}, "positive"),
        ({"startingMessageId": f'{{"t": "{ID_A}", "@generations": []}}'}, "@generations"),
        (
            {
                "startingMessageId": f'{{"t": "{ID_A}", "@generations": {{"t": 1}}}}',
                "endingMessageId": f'{{"t": "{ID_B}", "@generations": {{"t": 2}}}}',
            },
            "two generations",
        ),
    ]:
        with pytest.raises(ValueError, match=why):
            parse_read_options({"topic": "t", **bad}, streaming=False)


def _offsets(checkpoint: Path) -> list[str]:
    """The source offsets a streaming query checkpointed, one per micro-batch."""
    files = [f for f in (checkpoint / "offsets").iterdir() if f.name.isdigit()]
    files.sort(key=lambda f: int(f.name))
    return [f.read_text().strip().splitlines()[-1] for f in files]


def test_batch_reads_with_checkpointed_offsets_check_generations(
    spark: Any,
    server: ServerProcess,
    client: Client,
    new_topic: Callable[[], str],
    tmp_path: Path,
) -> None:
    topic = new_topic()
    client.publish(topic, [b"a0", b"a1", b"a2"])
    name = "ckpt_" + uuid.uuid4().hex[:8]
    query = (
        spark.readStream.format("tidings")
        .option("url", server.url)
        .option("topic", topic)
        .option("maxMessagesPerTrigger", "2")
        .load()
        .writeStream.format("memory")
        .queryName(name)
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(availableNow=True)
        .start()
    )
    with contextlib.suppress(StreamingQueryException):
        query.awaitTermination(120)
    assert query.exception() is None
    first, second = _offsets(tmp_path / "ckpt")[:2]
    assert json.loads(first)["@generations"] == {topic: 1}

    def read(**options: str) -> list[bytes]:
        reader = spark.read.format("tidings").option("url", server.url).option("topic", topic)
        for k, v in options.items():
            reader = reader.option(k, v)
        return sorted(bytes(r.value) for r in reader.load().collect())

    # What the second micro-batch read, and on from where the first ended.
    assert read(startingMessageId=first, endingMessageId=second) == [b"a2"]
    client.delete_topic(topic)
    client.create_topic(topic)
    client.publish(topic, [b"n0"])
    for options in ({"startingMessageId": first}, {"endingMessageId": second}):
        with pytest.raises(Exception, match=r"created again \(generation 1, now 2\)") as failed:
            read(**options)  # read the new topic as if it were the old one
        assert repr(topic) in str(failed.value)
    assert read(startingMessageId=first, failOnDataLoss="false") == [b"n0"]
    assert read(startingMessageId=first, endingMessageId=second, failOnDataLoss="false") == []
    client.delete_topic(topic)
    with pytest.raises(Exception, match=r"was deleted \(generation 1\)"):
        read(startingMessageId=first)
    assert read(startingMessageId=first, failOnDataLoss="false") == []


def test_a_batch_task_whose_topic_was_created_again_since_planning_fails(
    server: ServerProcess, client: Client, new_topic: Callable[[], str]
) -> None:
    topic = new_topic()
    client.publish(topic, [b"old0"])
    options = parse_read_options({"url": server.url, "topic": topic}, streaming=False)
    parts = TidingsBatchReader(options).partitions()
    assert parts
    client.delete_topic(topic)
    client.create_topic(topic)
    client.publish(topic, [b"new0"])
    with pytest.raises(TopicNotFound, match=r"created again \(generation 1, now 2\) since"):
        for part in parts:
            list(read_partition(options, part))
    lenient = parse_read_options(
        {"url": server.url, "topic": topic, "failOnDataLoss": "false"}, streaming=False
    )
    assert [b for part in parts for b in read_partition(lenient, part)] == []
