"""The queue coordinator in process, where a failure cannot be brought about through
the server: memory must not run ahead of a store write that never happened."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import TypeVar

import pytest

from tidings.consumers.queues import QueueCoordinator
from tidings.errors import ServerError
from tidings.messaging import MessagingService
from tidings.store.backend import WriteView
from tidings.store.backends.memory import MemoryStore
from tidings.structs import Message, Record
from tidings.tx import TransactionManager, TxConfig

T = TypeVar("T")


class _DeadLetterFailsOnce(MessagingService):
    """A messaging core whose first dead-letter publish is refused at once (as when the
    dead-letter topic is deleted between its creation and the publish)."""

    failed = False

    def publish_with_future(
        self,
        namespace: str,
        topic: str,
        messages: Sequence[Record | bytes],
        also: Callable[[WriteView], T],
    ) -> Future[T]:
        if not self.failed:
            self.failed = True
            raise ServerError("the dead-letter topic went away")
        return super().publish_with_future(namespace, topic, messages, also)


def test_a_dead_letter_publish_refused_at_once_loses_no_message(tmp_path: Path) -> None:
    store = MemoryStore()
    messaging = _DeadLetterFailsOnce(store)
    messaging.create_topic("ns", "t")
    messaging.publish("ns", "t", [b"poison", b"fine"])
    with TransactionManager(tmp_path / "tx", TxConfig(sweep_interval=3600)) as tx:
        queues = QueueCoordinator(store, messaging, tx)

        def pop(n: int) -> list[Message]:
            snap = tx.snapshot()
            assert snap is not None
            return queues.pop("ns", "t", "q", "w1", max_messages=n, snapshot=snap, max_deliveries=1)

        poison = pop(1)
        queues.nack("ns", "t", "q", "w1", [poison[0].id])
        with pytest.raises(ServerError):
            pop(1)
        # The next pop dead-letters it after all, and hands out the rest.
        assert [m.payload for m in pop(5)] == [b"fine"]
        assert [m.payload for m in messaging.fetch("ns", "t-dlq")] == [b"poison"]
