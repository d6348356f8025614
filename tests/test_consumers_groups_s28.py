"""The group coordinator in process, where a race is needed to show a fault."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tidings.consumers.groups import GroupCoordinator
from tidings.messaging import MessagingService
from tidings.store.backends.memory import MemoryStore
from tidings.structs import Record
from tidings.tx import TransactionManager, TxConfig


@pytest.fixture
def coordinator(tmp_path: Path) -> Iterator[tuple[GroupCoordinator, MessagingService]]:
    store = MemoryStore()
    messaging = MessagingService(store)
    with TransactionManager(tmp_path / "tx", TxConfig(sweep_interval=3600)) as tx:
        yield GroupCoordinator(store, messaging, tx), messaging


def test_lags_skip_a_topic_deleted_while_they_are_counted(
    coordinator: tuple[GroupCoordinator, MessagingService],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """/metrics and topic stats count every group's lag; a topic deleted between its
    listing and its count made the whole count, and so the scrape, fail with
    TopicNotFound."""
    groups, messaging = coordinator
    for topic in ("gone", "kept"):
        messaging.create_topic("ns", topic)
        messaging.publish("ns", topic, [Record(b"m", b"k")])
        groups.join("ns", topic, "g")
    positions = groups.positions
    gone = messaging.identity("ns", "gone")[0]

    def deleted_meanwhile(gid: tuple[int, int, str], snapshot: object) -> object:
        if gid[0] == gone:
            messaging.delete_topic("ns", "gone")
        return positions(gid, snapshot)  # type: ignore[arg-type]

    monkeypatch.setattr(groups, "positions", deleted_meanwhile)
    assert [(t, g, lag) for _, t, g, lag, _ in groups.lags()] == [("kept", "g", 1)]
