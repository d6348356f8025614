"""Consumer groups as a user meets them, through the real server, client and command
line: lag where nothing is committed, and the like."""

from __future__ import annotations

import json
from datetime import datetime

import httpx
import pytest
from click.testing import CliRunner

from tests.e2e.serverproc import ServerProcess
from tidings import Client
from tidings.cli import main
from tidings.codec.groups import partition_of
from tidings.errors import BadRequest
from tidings.structs import MessageId, Record

pytestmark = pytest.mark.e2e


def _cli(server: ServerProcess, *args: str) -> str:
    result = CliRunner().invoke(main, list(args), env={"TIDINGS_URL": server.url})
    assert result.exit_code == 0, (result.output, result.exception)
    return result.output


def _lag_lines(server: ServerProcess, topic: str) -> list[str]:
    metrics = httpx.get(server.url + "/metrics", timeout=30).text
    return [
        line
        for line in metrics.splitlines()
        if line.startswith("tidings_group_lag{") and f'topic="{topic}"' in line
    ]


def test_a_group_starting_at_latest_that_committed_nothing_shows_no_lag_not_zero(
    server: ServerProcess, topic: str
) -> None:
    """kafka-consumer-groups shows CURRENT-OFFSET "-" and LAG "-" for a partition with
    no committed offset; a 0 would read as "caught up" however far the group fell
    behind. Every surface says the same: describe, topic stats, /metrics, the CLI."""
    with Client(server.url) as client:
        client.create_topic(topic)
        client.publish(topic, [Record(b"before", b"k0")])
        member = client.consume(
            topic, "latest", group="late", follow=False, partitions=2, batch_size=1
        )
        assert member.poll() == []  # joined, at the end
        later = [Record(b"v%d" % i, b"k%d" % i) for i in range(6)]
        client.publish(topic, later)

        info = client.describe_group(topic, "late")
        assert [p.position for p in info.partitions] == [None, None]
        assert [p.lag for p in info.partitions] == [None, None]
        assert info.lag is None
        assert client.stats(topic).group_lags == {"late": None}
        described = httpx.get(
            f"{server.url}/v1/namespaces/default/topics/{topic}/groups/late", timeout=30
        ).json()
        assert described["lag"] is None
        assert [p["lag"] for p in described["partitions"]] == [None, None]
        assert _lag_lines(server, topic) == []  # no series: unknown, not 0
        shown = _cli(server, "groups", "describe", topic, "late")
        assert "lag -" in shown
        as_json = _cli(server, "groups", "describe", topic, "late", "--json")
        assert json.loads(as_json)["lag"] is None
        stats = _cli(server, "stats", topic)
        assert "lag of group late" in stats

        # Once one partition commits, it has a lag; the other still has none.
        (first,) = member.poll()
        member.commit()
        member.close()
        committed_p = partition_of(first, 2)
        published = client.poll(topic, first.id, inclusive=False)
        assert len(published) == 5
        behind = sum(1 for m in published if partition_of(m, 2) == committed_p)
        info = client.describe_group(topic, "late")
        lags = {p.partition: p.lag for p in info.partitions}
        assert lags == {committed_p: behind, 1 - committed_p: None}
        assert info.lag == behind
        assert client.stats(topic).group_lags == {"late": behind}
        (line,) = _lag_lines(server, topic)
        assert line.endswith(f" {float(behind)}")
        assert "1 partition(s) with no committed position" in _cli(
            server, "groups", "describe", topic, "late"
        )


def test_a_group_starting_at_earliest_that_committed_nothing_counts_every_message(
    server: ServerProcess, topic: str
) -> None:
    """Where a member would start is well defined for "earliest": every message is
    still to be read, and that is the lag."""
    with Client(server.url) as client:
        client.create_topic(topic)
        client.publish(topic, [Record(b"v%d" % i, b"k%d" % i) for i in range(5)])
        member = client.consume(topic, group="early", follow=False, partitions=2)
        member.heartbeat()
        info = client.describe_group(topic, "early")
        assert info.lag == 5 and all(p.lag is not None for p in info.partitions)
        assert client.stats(topic).group_lags == {"early": 5}
        member.close()


def test_reset_to_latest_on_an_empty_topic_is_a_position(server: ServerProcess, topic: str) -> None:
    """A reset is a committed position even where the topic has no message yet: what is
    published next is the group's lag (it was "no lag" for a group starting at latest,
    and 0 before that)."""
    with Client(server.url) as client:
        client.create_topic(topic)
        joined = client.consume(topic, "latest", group="g", follow=False, partitions=2)
        joined.heartbeat()  # joins: the group exists
        joined.close()
        client.reset_group(topic, "g", "latest")
        client.publish(topic, [Record(b"a", b"k1"), Record(b"b", b"k2")])
        assert client.describe_group(topic, "g").lag == 2
        member = client.consume(topic, group="g", follow=False)
        assert [m.payload for m in member.poll()] == [b"a", b"b"]
        member.close()


def test_a_reset_to_an_id_past_the_end_goes_to_the_end_not_into_the_future(
    server: ServerProcess, topic: str
) -> None:
    """An id newer than every message (another topic's, a typo) parked the group there:
    every message published until that time was skipped without a word. As Kafka moves
    an offset past the log end to the log end, the group goes to the end."""
    with Client(server.url) as client:
        client.create_topic(topic)
        client.publish(topic, [Record(b"old")])
        joined = client.consume(topic, group="g", follow=False, partitions=1)
        joined.heartbeat()
        joined.close()
        future = MessageId(2**62, 0)
        client.reset_group(topic, "g", future)
        (p,) = client.describe_group(topic, "g").partitions
        assert p.position is not None and p.position < future and p.lag == 0
        client.publish(topic, [Record(b"new")])
        member = client.consume(topic, group="g", follow=False)
        assert [m.payload for m in member.poll()] == [b"new"]
        member.close()
        # Through the command line too (a 40-hex id).
        result = _cli(server, "groups", "reset", topic, "g", "--to", "f" * 40)
        assert "reset group g" in result
        assert client.describe_group(topic, "g").lag == 0


@pytest.mark.parametrize("auto_commit", [False, True])
def test_a_following_member_outlives_its_group_being_deleted(
    server: ServerProcess, topic: str, auto_commit: bool
) -> None:
    """Deleting a group (to start it over) made a following member with auto_commit end
    with GroupNotFound, its commit of what it had returned finding no group, while one
    without auto_commit joins again and goes on; both join again now, and close()
    after the topic is deleted is quiet, as the leave in it is."""
    with Client(server.url) as client:
        client.create_topic(topic)
        client.publish(topic, [Record(b"a"), Record(b"b")])
        member = client.consume(
            topic, group="g", partitions=1, auto_commit=auto_commit, wait=0.2, batch_size=1
        )
        messages = iter(member)
        assert next(messages).payload == b"a"
        client.delete_group(topic, "g")
        # Delivered again from the start of the group joined anew (at least once).
        rest = [next(messages).payload for _ in range(2)]
        assert sorted(rest) == [b"a", b"b"]
        assert client.groups(topic) == ["g"]
        client.delete_topic(topic)
        member.close()  # nothing to commit to nor to leave: no error


def test_reset_group_takes_what_consume_and_the_command_line_take(
    server: ServerProcess, topic: str
) -> None:
    """``client.reset_group(t, g, "-1h")`` (or a 40-hex id, an ISO time, a datetime) was
    refused with BadRequest, while ``tidings groups reset --to -1h`` and
    ``consume(t, "-1h")`` take it."""
    with Client(server.url) as client:
        client.create_topic(topic)
        client.publish(topic, [Record(b"a"), Record(b"b"), Record(b"c")])
        joined = client.consume(topic, group="g", follow=False, partitions=1)
        joined.heartbeat()
        joined.close()
        first, second, _ = client.poll(topic)

        def lag() -> int | None:
            return client.describe_group(topic, "g").lag

        client.reset_group(topic, "g", "latest")
        client.reset_group(topic, "g", "-1h")
        assert lag() == 3
        client.reset_group(topic, "g", "end")
        client.reset_group(topic, "g", first.id.hex)
        assert lag() == 2
        client.reset_group(topic, "g", datetime.fromtimestamp(second.id.publish_ts / 1000))
        assert lag() in (2, 3)  # the three may share a millisecond
        client.reset_group(topic, "g", "latest")
        for bad in ("middle", "-1y", True):
            with pytest.raises(BadRequest):
                client.reset_group(topic, "g", bad)  # type: ignore[arg-type]
        assert lag() == 0  # unchanged
