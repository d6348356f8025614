"""What the source's generation checks cost: a batch task checks its topic's generation
from its own polls' answers (no request more), an idle streaming query from its scans'
polls, and the interval of the requests it still needs is an option. Counted by the
server's request metrics (the shared server serves one test at a time)."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from tests.e2e.serverproc import ServerProcess
from tidings.client import Client
from tidings.errors import TopicNotFound
from tidings.spark import stream_reader
from tidings.spark.options import DEFAULT_GENERATION_CHECK_INTERVAL, parse_read_options
from tidings.spark.reader import TidingsBatchReader, read_partition
from tidings.spark.scan import Scan
from tidings.spark.stream_reader import TidingsStreamReader

pytestmark = pytest.mark.spark

_SERIES = re.compile(r'^tidings_http_requests_total\{method="(\w+)",route="([^"]+)",[^}]*\} (\S+)$')
POLL = "POST /v1/namespaces/{ns}/topics/{topic}/poll"
TOPIC = "GET /v1/namespaces/{ns}/topics/{topic}"


def _requests(server: ServerProcess) -> Counter[str]:
    """Requests answered so far, per method and route (the scrapes themselves left out)."""
    text = httpx.get(server.url + "/metrics", timeout=10).text
    counts: Counter[str] = Counter()
    for line in text.splitlines():
        found = _SERIES.match(line)
        if found and found[2] != "/metrics":
            counts[f"{found[1]} {found[2]}"] += int(float(found[3]))
    return counts


class _Counted:
    """Requests the server answered while the block ran."""

    def __init__(self, server: ServerProcess) -> None:
        self.server = server
        self.sent: Counter[str] = Counter()

    def __enter__(self) -> _Counted:
        self._before = _requests(self.server)
        return self

    def __exit__(self, *exc: object) -> None:
        self.sent = _requests(self.server) - self._before


def test_a_batch_task_checks_the_generation_with_its_reads(
    server: ServerProcess, client: Client, new_topic: Callable[[], str]
) -> None:
    topic = new_topic()
    client.publish(topic, [b"m0", b"m1", b"m2"])
    options = parse_read_options(
        {"url": server.url, "topic": topic, "minPartitions": "1"}, streaming=False
    )
    parts = TidingsBatchReader(options).partitions()
    assert len(parts) == 1
    with _Counted(server) as counted:
        rows = [r for b in read_partition(options, parts[0]) for r in b.to_pylist()]
    assert [bytes(r["value"]) for r in rows] == [b"m0", b"m1", b"m2"]
    # One poll reads the range and says the topic's generation: nothing else is asked.
    assert counted.sent == Counter({POLL: 1}), counted.sent


def test_a_topic_created_again_while_a_task_reads_fails_it(
    server: ServerProcess, client: Client, new_topic: Callable[[], str]
) -> None:
    topic = new_topic()
    client.publish(topic, [b"m0", b"m1", b"m2", b"m3", b"m4"])
    for lenient in (False, True):
        options = parse_read_options(
            {
                "url": server.url,
                "topic": topic,
                "minPartitions": "1",
                "fetchSize": "1",
                "failOnDataLoss": str(not lenient).lower(),
            },
            streaming=False,
        )
        parts = TidingsBatchReader(options).partitions()
        batches: Iterator[Any] = read_partition(options, parts[0])
        first = next(batches)  # the page after it is asked for already
        client.delete_topic(topic)
        client.create_topic(topic)
        client.publish(topic, [b"new"])
        if lenient:
            # Read what the old topic still gave, and nothing of the new one.
            rest = [bytes(r["value"]) for b in batches for r in b.to_pylist()]
            assert [bytes(r["value"]) for r in first.to_pylist()] == [b"m0"]
            assert b"new" not in rest and len(rest) <= 1
        else:
            with pytest.raises(TopicNotFound, match=r"created again \(generation 1, now 2\)"):
                list(batches)
            # The lenient round reads the topic as it is now, in its generation 2.
            client.delete_topic(topic)
            client.create_topic(topic)
            client.publish(topic, [b"m0", b"m1", b"m2", b"m3", b"m4"])


def _stream(server: ServerProcess, topic: str, **extra: str) -> TidingsStreamReader:
    options = parse_read_options({"url": server.url, "topic": topic, **extra}, streaming=True)
    return TidingsStreamReader(options)


def test_an_idle_query_asks_no_generation_of_its_own(
    server: ServerProcess, client: Client, new_topic: Callable[[], str]
) -> None:
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    topic = new_topic()
    client.publish(topic, [b"m0"])
    reader = _stream(server, topic)
    try:
        start = reader.latestOffset(reader.initialOffset(), ReadAllAvailable())
        with _Counted(server) as counted:
            for _ in range(5):
                assert reader.latestOffset(start, ReadAllAvailable()) == start
        # Per trigger: a snapshot and the topic's poll, whose answer says the generation.
        assert counted.sent[TOPIC] == 0 and counted.sent[POLL] == 5, counted.sent
        # A topic created again and left empty is noticed at the next trigger, not up to
        # a check interval later.
        client.delete_topic(topic)
        client.create_topic(topic)
        with pytest.raises(TopicNotFound, match=r"created again \(generation 1, now 2\)"):
            reader.latestOffset(start, ReadAllAvailable())
    finally:
        reader.stop()


def test_the_generation_check_interval_is_an_option(
    server: ServerProcess,
    client: Client,
    new_topic: Callable[[], str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    assert _stream(server, "t").options.generation_check_interval == 1.0
    assert DEFAULT_GENERATION_CHECK_INTERVAL == 1.0
    assert _stream(server, "t", generationCheckInterval="0").options.generation_check_interval == 0
    assert (
        _stream(server, "t", GENERATIONCHECKINTERVAL="2.5").options.generation_check_interval == 2.5
    )
    for bad in ("-1", "x", "nan", "inf"):
        with pytest.raises(ValueError, match="generationCheckInterval"):
            _stream(server, "t", generationCheckInterval=bad)
    with pytest.raises(ValueError, match="generationCheckInterval applies to streaming"):
        parse_read_options({"topic": "t", "generationCheckInterval": "1"}, streaming=False)

    # A server whose polls do not say the generation: the source asks, at most once per
    # interval for a topic with nothing new (the first time at once).
    scan = stream_reader.scan

    def untold(*args: Any, **kwargs: Any) -> Scan:
        found = scan(*args, **kwargs)
        found.generation = None
        return found

    monkeypatch.setattr(stream_reader, "scan", untold)
    topic = new_topic()
    client.publish(topic, [b"m0"])
    for interval, asked in (("0", 4), ("3600", 1)):
        reader = _stream(server, topic, generationCheckInterval=interval)
        try:
            start = reader.latestOffset(reader.initialOffset(), ReadAllAvailable())
            with _Counted(server) as counted:
                for _ in range(4):
                    reader.latestOffset(start, ReadAllAvailable())
            assert counted.sent[TOPIC] == asked, (interval, counted.sent)
        finally:
            reader.stop()


def test_a_batch_read_of_a_missing_topic_fails_whatever_failondataloss(
    server: ServerProcess,
) -> None:
    # As Spark's Kafka source (its subscribed topics are described first, and a missing
    # one fails the read): failOnDataLoss is about offsets of data that is gone, and a
    # read that never named offsets of this topic lost nothing.
    for lenient in ("true", "false"):
        options = parse_read_options(
            {"url": server.url, "topic": "s-never-made", "failOnDataLoss": lenient},
            streaming=False,
        )
        with pytest.raises(TopicNotFound, match="s-never-made"):
            TidingsBatchReader(options).partitions()
