"""Edge cases of the Spark source and sink, on the shared local SparkSession and a real
server: where a stream starts, reads against a server with small pages, and options."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest

from tests.e2e.serverproc import ServerProcess
from tidings.client import Client

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
