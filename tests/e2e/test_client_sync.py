"""tidings.Client against a real ``tidings serve``."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime

import pytest

from tests.e2e.serverproc import ServerProcess
from tidings import (
    AVRO,
    AVRO_EXT,
    JSON,
    Client,
    EmptyPublish,
    InvalidName,
    Media,
    MessageId,
    ProducerFenced,
    Record,
    TopicAlreadyExists,
    TopicNotFound,
    TransactionCommitted,
)

pytestmark = pytest.mark.e2e


@pytest.fixture
def client(server: ServerProcess) -> Iterator[Client]:
    with Client(server.url, timeout=10) as c:
        yield c


def test_topic_admin(client: Client, topic: str) -> None:
    created = client.create_topic(topic, ttl=3600, properties={"owner": "me"})
    assert (created.name, created.ttl, created.generation) == (topic, 3600, 1)
    assert created.properties["owner"] == "me"
    with pytest.raises(TopicAlreadyExists):
        client.create_topic(topic)
    assert topic in client.list_topics()
    updated = client.update_topic(topic, ttl=60)
    assert updated.ttl == 60 and "owner" not in updated.properties  # replaces all
    assert client.get_topic(topic).ttl == 60
    client.delete_topic(topic)
    with pytest.raises(TopicNotFound):
        client.get_topic(topic)
    assert client.create_topic(topic).generation == 2
    with pytest.raises(InvalidName):
        client.create_topic("no/slashes")


@pytest.mark.parametrize("media", [JSON, AVRO_EXT, AVRO], ids=lambda m: m.name)
def test_publish_and_consume_in_every_medium(
    server: ServerProcess, topic: str, media: Media
) -> None:
    with Client(server.url, media=media) as client:
        client.create_topic(topic)
        extras = media is not AVRO
        record = Record(b"r", key=b"k", headers={"h": b"v"}) if extras else Record(b"r")
        client.publish(topic, [b"a", "b"])
        client.publish(topic, record)
        got = list(client.consume(topic, follow=False))
        assert [m.payload for m in got] == [b"a", b"b", b"r"]
        assert got[0].id < got[1].id < got[2].id
        if extras:
            assert (got[2].key, dict(got[2].headers)) == (b"k", {"h": b"v"})
        with pytest.raises(TopicNotFound):
            client.publish("missing-" + topic, b"x")
        with pytest.raises(EmptyPublish):
            client.publish(topic, [])


def test_start_positions(client: Client, topic: str) -> None:
    client.create_topic(topic)
    client.publish(topic, [b"1", b"2"])
    first, second = client.poll(topic)
    time.sleep(0.005)
    client.publish(topic, b"3")
    payloads = lambda start: [m.payload for m in client.consume(topic, start, follow=False)]  # noqa: E731
    assert payloads("earliest") == [b"1", b"2", b"3"]
    assert payloads(second.id) == [b"2", b"3"]
    assert payloads(second.id.hex) == [b"2", b"3"]
    assert payloads(first.publish_time) == [b"1", b"2", b"3"]
    assert payloads(datetime.fromtimestamp((second.publish_time + 1) / 1000)) == [b"3"]
    latest = client.consume(topic, "latest", follow=False)
    assert list(latest) == []
    client.publish(topic, b"4")
    assert [m.payload for m in client.consume(topic, "latest", follow=False)] == []
    assert [m.payload for m in client.poll(topic, first.id, inclusive=False, limit=1)] == [b"2"]


def test_long_poll_returns_when_a_message_arrives(client: Client, topic: str) -> None:
    import threading

    client.create_topic(topic)
    timer = threading.Timer(0.3, lambda: client.publish(topic, b"late"))
    timer.start()
    started = time.monotonic()
    got = client.poll(topic, wait=10)
    timer.join()
    assert [m.payload for m in got] == [b"late"]
    assert time.monotonic() - started < 5
    consumer = client.consume(topic, follow=True, wait=0.2, transactional=False)
    assert next(consumer).payload == b"late"
    assert consumer.poll() == []  # waited 0.2 s, nothing new


def test_low_level_transaction_and_rollback(client: Client, topic: str) -> None:
    client.create_topic(topic)
    client.publish(topic, b"plain")
    tx = client.begin()
    assert tx.write_pointer in client.transactions().in_progress
    info = client.publish(topic, [b"t1", b"t2"], write_pointer=tx.write_pointer)
    assert info.write_pointer == tx.write_pointer
    # Read-committed stops before the open transaction; read-uncommitted sees it.
    assert [m.payload for m in client.poll(topic, transaction=client.snapshot())] == [b"plain"]
    assert len(client.poll(topic)) == 3
    # The writer sees its own writes.
    assert len(client.poll(topic, transaction=tx)) == 3
    assert client.rollback(topic, info) == 2
    client.abort(tx)
    assert [m.payload for m in client.consume(topic, follow=False)] == [b"plain"]
    assert len(list(client.consume(topic, transactional=False, follow=False))) == 3


def test_store_then_publish_the_write_pointer(client: Client, topic: str) -> None:
    client.create_topic(topic)
    tx = client.begin()
    client.store(topic, [b"s1", b"s2"], write_pointer=tx.write_pointer)
    client.store(topic, b"s3", write_pointer=tx.write_pointer)
    assert client.poll(topic) == []  # stored payloads are invisible until published
    client.publish(topic, [], write_pointer=tx.write_pointer)
    client.commit(tx)
    got = list(client.consume(topic, follow=False))
    assert [m.payload for m in got] == [b"s1", b"s2", b"s3"]
    assert all(m.id.write_ts > 0 for m in got)
    with pytest.raises(TransactionCommitted):
        client.commit(tx)
    # Resuming inside one payload-path entry works.
    rest = client.consume(topic, got[0].id.hex, follow=False)
    assert [m.payload for m in rest] == [b"s1", b"s2", b"s3"]
    assert [m.payload for m in client.poll(topic, got[1].id, inclusive=False)] == [b"s3"]


def test_client_transaction_is_all_or_nothing_across_topics(client: Client, topic: str) -> None:
    other = topic + "-2"
    client.create_topic(topic)
    client.create_topic(other)
    # Tests sharing the server may leave their own transactions open.
    open_before = set(client.transactions().in_progress)
    with client.transaction() as tx:
        tx.publish(topic, [b"a1", b"a2"])
        tx.publish(other, b"b1")
    with pytest.raises(ZeroDivisionError), client.transaction() as tx:
        tx.publish(topic, b"never")
        _ = 1 / 0
    assert [m.payload for m in client.consume(topic, follow=False)] == [b"a1", b"a2"]
    assert [m.payload for m in client.consume(other, follow=False)] == [b"b1"]
    assert set(client.transactions().in_progress) <= open_before


def test_stats_producers_and_prune(client: Client, topic: str) -> None:
    client.create_topic(topic)
    client.publish(topic, [b"x" * 10, b"y" * 10])
    stats = client.stats(topic)
    assert stats.message_count == 2 and stats.bytes == 20
    assert isinstance(stats.newest_id, MessageId)
    with pytest.raises(TopicNotFound):
        client.stats("missing-" + topic)

    first = client.register_producer("app-" + topic)
    with client.transaction(producer=first) as tx:
        tx.publish(topic, b"by first")
    second = client.register_producer("app-" + topic)
    assert second.epoch > first.epoch
    with pytest.raises(ProducerFenced), client.transaction(producer=first):
        pass

    tx = client.begin()
    client.invalidate(tx)
    assert tx.write_pointer in client.transactions().invalid
    assert client.prune(ids=[tx.write_pointer]) == [tx.write_pointer]
    assert tx.write_pointer not in client.transactions().invalid


def test_latest_read_committed_starts_at_the_last_stable_position(
    server: ServerProcess, topic: str
) -> None:
    # A transaction open when a read-committed consumer starts at "latest" and
    # committed afterwards must reach it (Kafka's LSO); "newest" would skip it.
    with Client(server.url) as client:
        client.create_topic(topic)
        client.publish(topic, [b"before"])
        tx = client.begin()
        client.publish(topic, [b"in the open transaction"], write_pointer=tx.write_pointer)
        client.publish(topic, [b"after, committed"])
        end = client.end(topic)
        assert end.stable_known and end.last_stable_id is not None
        assert end.newest_id is not None and end.last_stable_id < end.newest_id
        assert client.stats(topic).last_stable_id == end.last_stable_id
        latest = client.consume(topic, "latest", wait=0.2)
        assert latest.poll() == []  # starts (at the open transaction) and waits there
        uncommitted = client.consume(topic, "latest", transactional=False, follow=False)
        assert list(uncommitted) == []  # read-uncommitted: after the newest, as before
        client.commit(tx)
        got: list[bytes] = []
        for _ in range(20):
            got += [m.payload for m in latest.poll()]
            if len(got) >= 2:
                break
        assert got == [b"in the open transaction", b"after, committed"]
        latest.close()
        after = client.end(topic)
        assert after.last_stable_id is None and after.newest_id == end.newest_id


def test_an_invalidated_transaction_no_longer_holds_the_last_stable_position(
    start_server: Callable[..., ServerProcess], topic: str
) -> None:
    # A server of its own: no commit after the transaction moves the read pointer past
    # it, so only its place in the invalid list says that it ended.
    with Client(start_server().url) as client:
        client.create_topic(topic)
        client.publish(topic, [b"before"])
        tx = client.begin()
        client.publish(topic, [b"in the transaction"], write_pointer=tx.write_pointer)
        client.publish(topic, [b"after"])
        held = client.end(topic).last_stable_id
        assert held is not None
        client.invalidate(tx)
        end = client.end(topic)
        assert client.transactions().read_pointer < tx.write_pointer
        assert end.stable_known and end.last_stable_id is None
        assert client.stats(topic).last_stable_id is None
        # Where a read-committed reader goes on: past the skipped message to the end.
        assert [m.payload for m in client.consume(topic, follow=False)] == [b"before", b"after"]


def test_a_follower_outlives_a_server_restart(
    start_server: Callable[..., ServerProcess], topic: str
) -> None:
    srv = start_server()
    got: list[bytes] = []
    with Client(srv.url, timeout=2.0) as client:
        client.create_topic(topic)
        client.publish(topic, [b"before"])
        follower = client.consume(topic, wait=0.5)
        got.append(next(follower).payload)
        srv.kill()

        def restart() -> None:
            time.sleep(1.0)
            srv.start()
            with Client(srv.url) as other:
                other.publish(topic, [b"after"])

        thread = threading.Thread(target=restart)
        thread.start()
        got.append(next(follower).payload)  # waits out the outage, resumes after "before"
        thread.join()
        follower.close()
    assert got == [b"before", b"after"]
