"""Option parsing of the tidings data source (no Spark session needed)."""

from __future__ import annotations

import pytest

from tidings.names import DEFAULT_URL
from tidings.spark.options import (
    DEFAULT_NAMESPACE,
    Bound,
    Start,
    parse_read_options,
    parse_write_options,
)

pytestmark = pytest.mark.spark

ID = "0000018c2f6b1a000001" + "0" * 20


def test_read_defaults() -> None:
    o = parse_read_options({"topic": "a"}, streaming=True)
    assert o.url == DEFAULT_URL and o.namespace == DEFAULT_NAMESPACE
    assert o.topics == ("a",)
    assert o.starts == {"a": Start("earliest")}
    assert o.isolation == "read_committed" and o.committed
    assert o.max_messages_per_trigger is None


def test_keys_are_case_insensitive_and_topics_a_list() -> None:
    o = parse_read_options(
        {"TOPIC": "a, b,a", "Isolation": "READ_UNCOMMITTED", "maxMessagesPerTrigger": "7"},
        streaming=True,
    )
    assert o.topics == ("a", "b")
    assert not o.committed
    assert o.max_messages_per_trigger == 7


def test_starting_positions() -> None:
    o = parse_read_options({"topic": "a,b", "startingMessageId": ID}, streaming=True)
    assert o.starts == {"a": Start("id", ID), "b": Start("id", ID)}
    o = parse_read_options({"topic": "a,b", "startingMessageId": '{"b": "latest"}'}, streaming=True)
    assert o.starts == {"a": Start("earliest"), "b": Start("latest")}
    o = parse_read_options({"topic": "a", "startingTimestamp": "1700000000000"}, streaming=True)
    assert o.starts == {"a": Start("time", 1700000000000)}


def test_ending_positions_are_for_batch_reads() -> None:
    o = parse_read_options({"topic": "a", "endingTimestamp": "5"}, streaming=False)
    assert o.ends == {"a": Bound("time", 5)}
    o = parse_read_options({"topic": "a", "endingMessageId": ID.upper()}, streaming=False)
    assert o.ends == {"a": Bound("id", ID)}
    with pytest.raises(ValueError, match="batch reads only"):
        parse_read_options({"topic": "a", "endingTimestamp": "5"}, streaming=True)
    with pytest.raises(ValueError, match="streaming reads only"):
        parse_read_options({"topic": "a", "maxMessagesPerTrigger": "5"}, streaming=False)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, "topic is required"),
        ({"topic": "a b"}, "option topic"),
        ({"topic": "a", "isolation": "serializable"}, "isolation"),
        ({"topic": "a", "startingMessageId": "abc"}, "startingMessageId"),
        ({"topic": "a", "startingTimestamp": "yesterday"}, "startingTimestamp"),
        ({"topic": "a", "startingTimestamp": "1", "startingMessageId": ID}, "exclude"),
        ({"topic": "a", "startingMessageId": '{"zzz": "latest"}'}, "not read"),
        ({"topic": "a", "maxMessagesPerTrigger": "0"}, "positive"),
        ({"topic": "a", "url": "ftp://x"}, "url"),
        ({"topic": "a", "namespace": "n/s"}, "namespace"),
        ({"topic": "a", "sinkId": "s"}, "writes only"),
    ],
)
def test_bad_read_options(options: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_read_options(options, streaming=True)


def test_write_options() -> None:
    o = parse_write_options(
        {"topic": "out", "sinkid": "s-1", "checkpointlocation": "/tmp/c", "url": "http://h:1/"}
    )
    assert (o.topic, o.sink_id, o.checkpoint_location, o.url) == (
        "out",
        "s-1",
        "/tmp/c",
        "http://h:1",
    )
    assert parse_write_options({}).topic is None


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"topic": "a,b"}, "one topic"),
        ({"sinkId": "x" * 114}, "sinkId"),
        ({"sinkId": "a.b"}, "sinkId"),
        ({"transactionTimeout": "-1"}, "transactionTimeout"),
        ({"startingMessageId": ID}, "reads only"),
    ],
)
def test_bad_write_options(options: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_write_options(options)
