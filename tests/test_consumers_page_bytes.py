"""Group polls and queue pops bounded by bytes, in process: each answer stops after
the message that reaches the bound, members and workers still get every message once,
and a group's lag stays exact when the server's pages stop at their byte bound."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tidings.consumers.groups import GroupCoordinator
from tidings.consumers.queues import QueueCoordinator
from tidings.errors import BadRequest
from tidings.messaging import MessagingConfig, MessagingService
from tidings.store.backends.memory import MemoryStore
from tidings.structs import Message, Record, Transaction
from tidings.tx import TransactionManager, TxConfig

#: The server's bound: its own group pages stop there too.
SERVER_BYTES = 700


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


Parts = tuple[MemoryStore, MessagingService, TransactionManager]


@pytest.fixture
def parts(tmp_path: Path) -> Iterator[Parts]:
    store = MemoryStore()
    messaging = MessagingService(store, MessagingConfig(fetch_max_bytes=SERVER_BYTES))
    messaging.create_topic("ns", "t")
    with TransactionManager(tmp_path / "tx", TxConfig(sweep_interval=3600)) as tx:
        yield store, messaging, tx


def snapshot(tx: TransactionManager) -> Transaction:
    s = tx.snapshot()
    assert s is not None
    return s


def size(message: Message) -> int:
    return len(message.payload) + (len(message.key) if message.key is not None else 0)


def fill(messaging: MessagingService, n: int = 120) -> list[Record]:
    records = [Record(b"m%03d" % i + b"." * (i % 50), b"k%d" % (i % 5)) for i in range(n)]
    for at in range(0, n, 30):
        messaging.publish("ns", "t", records[at : at + 30])
    return records


@pytest.mark.parametrize("members", [1, 2, 3])
def test_members_pages_stop_at_their_bound_and_miss_nothing(parts: Parts, members: int) -> None:
    store, messaging, tx = parts
    records = fill(messaging)
    groups = GroupCoordinator(store, messaging, tx, clock=Clock())
    ids = [groups.join("ns", "t", "g", partitions=8).member_id for _ in range(members)]
    seen: dict[str, list[Message]] = {m: [] for m in ids}
    for _ in range(200):
        polled = 0
        for member in ids:
            page, _ = groups.poll(
                "ns", "t", "g", member, limit=40, snapshot=snapshot(tx), max_bytes=90
            )
            assert sum(map(size, page[:-1])) < 90
            if len(page) < 40 and page:
                # Short of the limit: the bound was reached, or the member's share ended.
                total = sum(map(size, page))
                assert total >= 90 or len(seen[member]) + len(page) == _share(groups, member)
            seen[member] += page
            polled += len(page)
        if not polled:
            break
    got = sorted(m.payload for ms in seen.values() for m in ms)
    assert got == sorted(r.payload for r in records)  # every message, once
    for member_messages in seen.values():  # per key in the topic's order
        for key in {m.key for m in member_messages}:
            order = [m.id for m in member_messages if m.key == key]
            assert order == sorted(order)


def _share(groups: GroupCoordinator, member: str) -> int:
    """How many of the topic's messages fall in ``member``'s partitions."""
    info = groups.describe("ns", "t", "g")
    owned = set(info.members[member])
    return sum(p.lag for p in info.partitions if p.partition in owned)


def test_lag_counts_every_message_past_pages_cut_by_bytes(parts: Parts) -> None:
    store, messaging, tx = parts
    fill(messaging, 400)  # ~30 KB: dozens of server pages of at most 700 bytes
    groups = GroupCoordinator(store, messaging, tx, clock=Clock())
    groups.join("ns", "t", "g", partitions=4)
    info = groups.describe("ns", "t", "g")
    assert sum(p.lag for p in info.partitions) == 400
    assert all(p.lag_exact for p in info.partitions)


def test_a_bad_bound_is_refused_before_anything_moves(parts: Parts) -> None:
    store, messaging, tx = parts
    fill(messaging, 10)
    groups = GroupCoordinator(store, messaging, tx, clock=Clock())
    member = groups.join("ns", "t", "g", partitions=1).member_id
    for bad in (0, -5, True):
        with pytest.raises(BadRequest):
            groups.poll("ns", "t", "g", member, limit=5, snapshot=snapshot(tx), max_bytes=bad)
    page, _ = groups.poll("ns", "t", "g", member, limit=5, snapshot=snapshot(tx))
    assert [m.payload[:4] for m in page] == [b"m%03d" % i for i in range(5)]


def test_pops_stop_at_their_bound_and_redeliveries_count(parts: Parts) -> None:
    store, messaging, tx = parts
    messaging.publish("ns", "t", [b"x" * 100] * 20)
    queues = QueueCoordinator(store, messaging, tx, clock=Clock())
    first = queues.pop("ns", "t", "q", "w1", max_messages=10, snapshot=snapshot(tx), max_bytes=250)
    assert len(first) == 3  # 100 + 100 + 100 reaches 250
    queues.nack("ns", "t", "q", "w1", [m.id for m in first])
    # The three given back come first, and count against the bound.
    again = queues.pop("ns", "t", "q", "w2", max_messages=10, snapshot=snapshot(tx), max_bytes=350)
    assert [m.id for m in again[:3]] == [m.id for m in first]
    assert len(again) == 4
    rest = queues.pop("ns", "t", "q", "w2", max_messages=100, snapshot=snapshot(tx))
    assert len(rest) == 7  # the server's 700 bytes
    with pytest.raises(BadRequest):
        queues.pop("ns", "t", "q", "w2", max_messages=1, snapshot=snapshot(tx), max_bytes=0)
