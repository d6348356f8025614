"""The one-request transaction's steps (begin, publish, commit) and their failures.

Through the HTTP server a failing store write is hard to provoke (bad topics are refused
before anything is submitted), so these drive the route's helper directly, with a real
transaction manager and a messaging stand-in whose store write fails or succeeds later,
on another thread, as the store's writer would.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any, cast

import pytest

from tidings.errors import TopicNotFound, TransactionTimedOut
from tidings.messaging import MessagingService
from tidings.server.inbox import LoopInbox
from tidings.server.routes.transactions import _transact
from tidings.structs import Record
from tidings.tx import TransactionManager, TxConfig
from tidings.tx.visibility import is_visible

QUIET = TxConfig(sweep_interval=3600)


def later(action: Callable[[], None]) -> None:
    threading.Timer(0.01, action).start()


class Messaging:
    """Resolves each publish_all_future from a timer thread with ``outcome``."""

    def __init__(self, outcome: BaseException | None) -> None:
        self.outcome = outcome
        self.write_pointers: list[int | None] = []

    def publish_all_future(self, ns: str, batches: Any, wp: int | None) -> Future[list[None]]:
        self.write_pointers.append(wp)
        future: Future[list[None]] = Future()
        if self.outcome is None:
            later(lambda: future.set_result([None]))
        else:
            error = self.outcome
            later(lambda: future.set_exception(error))
        return future


@pytest.fixture
def manager(tmp_path: Path) -> Iterator[TransactionManager]:
    with TransactionManager(tmp_path / "tx", QUIET) as m:
        yield m


async def transact(
    manager: TransactionManager,
    messaging: Messaging,
    ended: list[str],
    *,
    timeout: float | None = None,
) -> int:
    inbox = LoopInbox(asyncio.get_running_loop())
    service = cast(MessagingService, messaging)
    batches: list[tuple[str, list[Record | bytes]]] = [("t", [b"x"])]
    snapshot = await _transact(inbox, service, manager, "ns", batches, timeout, None, None, ended)
    return snapshot.write_pointer


async def test_a_published_transaction_commits(manager: TransactionManager) -> None:
    messaging = Messaging(None)
    ended: list[str] = []
    wp = await transact(manager, messaging, ended)
    assert ended == ["begun", "committed"] and messaging.write_pointers == [wp]
    state = manager.state()
    assert wp not in state.in_progress and wp not in state.invalid
    snapshot = manager.snapshot()
    assert snapshot is not None and is_visible(snapshot, wp)


async def test_a_failed_store_write_aborts(manager: TransactionManager) -> None:
    messaging = Messaging(TopicNotFound("deleted meanwhile"))
    ended: list[str] = []
    with pytest.raises(TopicNotFound, match="deleted meanwhile"):
        await transact(manager, messaging, ended)
    assert ended == ["begun", "aborted"]
    [wp] = messaging.write_pointers
    state = manager.state()
    assert wp not in state.in_progress and wp not in state.invalid


async def test_a_failed_commit_invalidates(manager: TransactionManager) -> None:
    class SlowMessaging(Messaging):
        def publish_all_future(self, ns: str, batches: Any, wp: int | None) -> Future[list[None]]:
            self.write_pointers.append(wp)
            future: Future[list[None]] = Future()
            # Resolved after the transaction's timeout: its commit is refused.
            threading.Timer(0.3, lambda: future.set_result([None])).start()
            return future

    messaging = SlowMessaging(None)
    ended: list[str] = []
    with pytest.raises(TransactionTimedOut):
        await transact(manager, messaging, ended, timeout=0.1)
    # Invalid by its timeout already: the invalidation that makes sure of it changes
    # nothing, so it is not counted (timeouts show in tidings_transactions_invalid).
    assert ended == ["begun"]
    [wp] = messaging.write_pointers
    assert wp in manager.state().invalid
