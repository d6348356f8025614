"""Consumers against a fake client: resuming after the last id, snapshots, waits."""

from __future__ import annotations

from typing import Any, cast

import pytest

from tidings.client import AsyncClient, AsyncConsumer, Client, Consumer
from tidings.client.api import PollPage
from tidings.client.cursor import ConsumerCursor
from tidings.codec.wire import JSON, encode_messages
from tidings.structs import Message, MessageId, TopicEnd, TopicStats, Transaction


def mid(n: int) -> MessageId:
    return MessageId(1000 + n, 0)


class FakeClient:
    """Serves ``messages`` like the server: from a start id, exclusive or not."""

    server_snapshots = False  # the consumer takes its snapshots itself

    def __init__(self, messages: list[Message]) -> None:
        self.messages = messages
        self.polls: list[dict[str, Any]] = []
        self.snapshots = 0
        self.open_from: MessageId | None = None

    def stats(self, topic: str) -> TopicStats:
        newest = self.messages[-1].id if self.messages else None
        return TopicStats("ns", topic, 0, 0, None, newest, None, None, 0, 0, 0, 0.0, 0.0)

    def end(self, topic: str) -> TopicEnd:
        newest = self.messages[-1].id if self.messages else None
        return TopicEnd(newest, self.open_from)

    def snapshot(self) -> Transaction:
        self.snapshots += 1
        return Transaction(self.snapshots, 2**63 - 1)

    def poll(self, topic: str, start: Any, **kw: Any) -> list[Message]:
        self.polls.append({"start": start, **kw})
        if isinstance(start, int):
            start = MessageId(start, 0)
        out = [
            m
            for m in self.messages
            if start is None or (m.id >= start if kw["inclusive"] else m.id > start)
        ]
        return out[: kw["limit"]]

    def poll_page(self, topic: str, start: Any, **kw: Any) -> PollPage:
        # An undecoded page without extent headers, as a server without them sends.
        return PollPage(encode_messages(self.poll(topic, start, **kw), JSON), JSON, None, None)


def messages(n: int) -> list[Message]:
    return [Message(mid(i), str(i).encode()) for i in range(n)]


def test_iterates_everything_then_stops_without_follow() -> None:
    client = FakeClient(messages(7))
    consumer = Consumer(cast(Client, client), "t", batch_size=3, follow=False)
    assert [m.payload for m in consumer] == [str(i).encode() for i in range(7)]
    assert consumer.position == mid(6)
    starts = [(p["start"], p["inclusive"]) for p in client.polls]
    assert starts == [(None, True), (mid(2), False), (mid(5), False), (mid(6), False)]
    assert all(p["wait"] == 0 for p in client.polls)


def test_snapshot_is_reused_while_pages_are_full() -> None:
    client = FakeClient(messages(7))
    consumer = Consumer(cast(Client, client), "t", batch_size=3, follow=False)
    list(consumer)
    # Two full pages share the first snapshot; a short page ends it.
    assert [p["transaction"].read_pointer for p in client.polls] == [1, 1, 1, 2]


def test_resume_after_a_saved_position() -> None:
    client = FakeClient(messages(4))
    first = Consumer(cast(Client, client), "t", follow=False)
    assert next(first).payload == b"0" and next(first).payload == b"1"
    saved = first.position
    resumed = Consumer(cast(Client, client), "t", saved, inclusive=False, follow=False)
    assert resumed.position == saved
    assert [m.payload for m in resumed] == [b"2", b"3"]


def test_loops_and_next_share_one_place_across_pages() -> None:
    # A loop left with ``break`` keeps the place (and the position) of the last
    # message it took; ``next()`` and a second loop go on from there, across pages.
    client = FakeClient(messages(8))
    consumer = Consumer(cast(Client, client), "t", batch_size=3, follow=False)
    taken = []
    for m in consumer:
        taken.append(m.payload)
        if m.payload == b"3":
            break
    assert consumer.position == mid(3)
    taken.append(next(consumer).payload)
    assert consumer.position == mid(4)
    for m in consumer:
        taken.append(m.payload)
        if m.payload == b"5":
            break
    assert consumer.position == mid(5)
    taken += [m.payload for m in consumer]
    assert taken == [str(i).encode() for i in range(8)]
    assert consumer.position == mid(7)
    with pytest.raises(StopIteration):
        next(consumer)


def test_uncommitted_polls_carry_no_transaction() -> None:
    client = FakeClient(messages(2))
    list(Consumer(cast(Client, client), "t", transactional=False, follow=False))
    assert client.snapshots == 0 and all(p["transaction"] is None for p in client.polls)


def test_latest_starts_after_the_newest_entry() -> None:
    client = FakeClient(messages(3))
    consumer = Consumer(cast(Client, client), "t", "latest", follow=False)
    assert list(consumer) == []
    assert client.polls[0]["start"] == mid(2) and not client.polls[0]["inclusive"]


def test_latest_read_committed_starts_at_the_last_stable_position() -> None:
    client = FakeClient(messages(5))
    client.open_from = mid(2)  # a transaction still open from the third message on
    consumer = Consumer(cast(Client, client), "t", "latest", follow=False)
    list(consumer)
    assert client.polls[0]["start"] == mid(2) and client.polls[0]["inclusive"]
    uncommitted = Consumer(cast(Client, client), "t", "latest", transactional=False, follow=False)
    list(uncommitted)
    assert client.polls[-1]["start"] == mid(4) and not client.polls[-1]["inclusive"]


def test_start_from_an_id_or_a_time() -> None:
    client = FakeClient(messages(5))
    assert [m.payload for m in Consumer(cast(Client, client), "t", mid(3).hex, follow=False)] == [
        b"3",
        b"4",
    ]
    assert client.polls[0]["start"] == mid(3) and client.polls[0]["inclusive"]
    assert len(list(Consumer(cast(Client, client), "t", 1004, follow=False))) == 1


def test_follow_waits_long_polls_and_caps_committed_waits() -> None:
    cursor = ConsumerCursor(
        None, transactional=True, batch_size=10, wait=30, committed_wait=0.5, follow=True
    )
    assert cursor.poll_wait() == 0.5
    cursor.transactional = False
    assert cursor.poll_wait() == 30
    cursor.advance([])
    assert not cursor.exhausted  # following never ends


def test_cursor_validates() -> None:
    with pytest.raises(ValueError):
        ConsumerCursor(
            None, transactional=True, batch_size=0, wait=1, committed_wait=1, follow=True
        )


class AsyncFakeClient:
    server_snapshots = False

    def __init__(self, inner: FakeClient) -> None:
        self.inner = inner

    async def stats(self, topic: str) -> TopicStats:
        return self.inner.stats(topic)

    async def end(self, topic: str) -> TopicEnd:
        return self.inner.end(topic)

    async def snapshot(self) -> Transaction:
        return self.inner.snapshot()

    async def poll_page(self, topic: str, start: Any, **kw: Any) -> PollPage:
        return self.inner.poll_page(topic, start, **kw)


async def test_async_consumer() -> None:
    inner = FakeClient(messages(5))
    consumer = AsyncConsumer(
        cast(AsyncClient, AsyncFakeClient(inner)), "t", batch_size=2, follow=False
    )
    assert [m.payload async for m in consumer] == [str(i).encode() for i in range(5)]
    assert consumer.position == mid(4)


def _page(count: int | None, last: MessageId | None) -> Any:
    from tidings.client.api import PollPage
    from tidings.codec.wire import AVRO

    return PollPage(b"", AVRO, count, last)


def test_read_ahead_only_after_full_pages_and_only_if_it_is_the_next_poll() -> None:
    cursor = ConsumerCursor(
        "earliest", transactional=True, batch_size=3, wait=1, committed_wait=0.5, follow=False
    )
    cursor.snapshot = Transaction(5, 2**63 - 1)
    assert cursor.ahead_of(_page(2, mid(1))) is None  # short page
    assert cursor.ahead_of(_page(None, None)) is None  # no headers
    key = cursor.ahead_of(_page(3, mid(2)))
    assert key == (mid(2), False, cursor.snapshot, None)
    assert key is not None
    full = [Message(mid(i), b"") for i in range(3)]
    cursor.advance(full)
    assert cursor.accepts(key, _page(3, mid(5)))
    assert cursor.accepts(key, _page(0, None))  # not following: empty is the answer
    assert not cursor.accepts(key, None)  # the read-ahead failed
    cursor.follow = True
    assert not cursor.accepts(key, _page(0, None))  # following: poll again, waiting
    cursor.follow = False
    cursor.advance(full[:1])  # shorter than the header said: snapshot dropped
    assert not cursor.accepts(key, _page(3, mid(5)))


def test_read_ahead_after_a_page_that_reached_its_byte_bound() -> None:
    from tidings.client.api import PollPage
    from tidings.codec.wire import AVRO

    cursor = ConsumerCursor(
        "earliest", transactional=True, batch_size=3, wait=1, committed_wait=0.5, follow=False
    )
    snapshot = cursor.snapshot = Transaction(5, 2**63 - 1)
    cut = PollPage(b"", AVRO, 1, mid(0), more=True)
    key = cursor.ahead_of(cut)
    assert key == (mid(0), False, snapshot, None)
    # Not caught up: the snapshot stays, so the poll sent ahead is the next one.
    cursor.advance([Message(mid(0), b"")], more=True)
    assert cursor.snapshot is snapshot
    assert key is not None and cursor.accepts(key, _page(1, mid(1)))
    cursor.advance([Message(mid(1), b"")])  # short, and not at its bound: caught up
    assert cursor.snapshot is None


def test_poll_page_headers() -> None:
    from tidings.client.api import _poll_page
    from tidings.client.transports import Response
    from tidings.codec.wire import AVRO

    def page(headers: dict[str, str]) -> tuple[int | None, MessageId | None]:
        p = _poll_page(Response(200, b"\x00", AVRO.value, headers), AVRO)
        return p.count, p.last_id

    assert page({"tidings-count": "3", "tidings-last-id": mid(2).hex}) == (3, mid(2))
    assert page({"tidings-count": "0"}) == (0, None)
    assert page({}) == (None, None)
    assert page({"tidings-count": "3"}) == (None, None)
    assert page({"tidings-count": "x", "tidings-last-id": mid(2).hex}) == (None, None)
    assert page({"tidings-count": "3", "tidings-last-id": "zz"}) == (None, None)

    def more(headers: dict[str, str]) -> bool:
        return _poll_page(Response(200, b"\x00", AVRO.value, headers), AVRO).more

    last = {"tidings-count": "1", "tidings-last-id": mid(0).hex}
    assert more({**last, "tidings-more": "true"})
    assert not more(last)
    assert not more({**last, "tidings-more": "yes"})
    assert not more({"tidings-count": "0", "tidings-more": "true"})  # no extent, no more
