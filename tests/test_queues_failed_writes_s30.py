"""Queue calls whose store write fails change nothing a caller can see, also for the
leases whose deadline passed while nobody took their messages: their workers may
still extend or ack them. In process, as a store write cannot be made to fail inside
a server process."""

from __future__ import annotations

from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

from tests.test_queues_failed_writes_s29 import _fail_next_write, _payloads, _queue
from tidings.errors import StoreFull


def _extend(q: Any, worker: str, ids: list[Any]) -> list[Any]:
    skipped: list[Any] = q.queues.extend("ns", "t", "q", worker, ids, ack_timeout_ms=60_000)
    return skipped


@pytest.mark.parametrize("at_once", [False, True])
def test_a_failed_write_leaves_a_lease_that_ran_out_extendable_by_its_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, at_once: bool
) -> None:
    with _queue(tmp_path, [b"a", b"b", b"c"]) as q:
        mine = q.pop("w1", 1)
        theirs = q.pop("w2", 1)
        q.now[0] += 6  # both leases ran out; nobody took their messages
        _fail_next_write(q.store, monkeypatch, at_once=at_once)
        with pytest.raises(StoreFull):
            q.queues.ack("ns", "t", "q", "w2", [theirs[0].id])
        # As without the failed ack: still each worker's to extend, then nobody else's.
        assert _extend(q, "w1", [mine[0].id]) == []
        assert _extend(q, "w2", [theirs[0].id]) == []
        assert _payloads(q.pop("w3", 10)) == [(b"c", 1)]
        stats = q.queues.describe("ns", "t", "q")
        assert stats.consumers == {"w1": 1, "w2": 1, "w3": 1}
        assert stats.expired == 2


@pytest.mark.parametrize("at_once", [False, True])
def test_a_failed_write_after_a_deadline_passed_counts_the_lease_as_run_out_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, at_once: bool
) -> None:
    with _queue(tmp_path, [b"a", b"b"]) as q:
        mine = q.pop("w1", 1)
        theirs = q.pop("w2", 1)
        _fail_next_write(q.store, monkeypatch, at_once=at_once)
        with pytest.raises(StoreFull):
            q.queues.ack("ns", "t", "q", "w2", [theirs[0].id])
        q.now[0] += 6  # w1's lease runs out after the failure, before the rebuild
        assert _extend(q, "w1", [mine[0].id]) == []
        stats = q.queues.describe("ns", "t", "q")
        assert (stats.consumers, stats.expired) == ({"w1": 1}, 2)


@pytest.mark.parametrize("at_once", [False, True])
def test_a_pop_whose_dead_lettering_fails_leaves_leases_that_ran_out_to_their_workers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, at_once: bool
) -> None:
    with _queue(tmp_path, [b"x", b"y"]) as q:
        q.pop("w1", 1, max_deliveries=2)
        q.now[0] += 6
        x = q.pop("w1", 1)  # "x" a second time: at the most
        y = q.pop("w2", 1)
        q.now[0] += 6  # both ran out
        publish = q.messaging.publish_with_future

        def fails_once(*args: Any) -> Future[Any]:
            monkeypatch.setattr(q.messaging, "publish_with_future", publish)
            if at_once:
                raise StoreFull("the store is full")
            failed: Future[Any] = Future()
            failed.set_exception(StoreFull("the store is full"))
            return failed

        monkeypatch.setattr(q.messaging, "publish_with_future", fails_once)
        with pytest.raises(StoreFull):
            q.pop("w3", 2)  # would dead-letter "x" and hand out "y"
        # As if that pop had not been made: each worker may still extend its message.
        assert _extend(q, "w1", [x[0].id]) == []
        assert _extend(q, "w2", [y[0].id]) == []
        assert q.pop("w3", 2) == []
        stats = q.queues.describe("ns", "t", "q")
        assert (stats.consumers, stats.popped, stats.dead_lettered) == (
            {"w1": 1, "w2": 1},
            3,
            0,
        )


@pytest.mark.parametrize("at_once", [False, True])
def test_a_failed_write_leaves_a_message_of_a_failed_transaction_with_its_new_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, at_once: bool
) -> None:
    # The records still hold the message under the transaction's pointer: it failed,
    # so they no longer say who has it.
    with _queue(tmp_path, [b"a", b"b"]) as q:
        first = q.pop("w1", 1)
        t = q.tx.begin()
        q.queues.ack("ns", "t", "q", "w1", [first[0].id], write_pointer=t.write_pointer)
        q.tx.invalidate(t.write_pointer)
        assert _payloads(q.pop("w2", 1)) == [(b"a", 2)]  # not written
        theirs = q.pop("w3", 1)
        _fail_next_write(q.store, monkeypatch, at_once=at_once)
        with pytest.raises(StoreFull):
            q.queues.ack("ns", "t", "q", "w3", [theirs[0].id])
        assert q.pop("w4", 10) == []
        assert q.queues.describe("ns", "t", "q").consumers == {"w2": 1, "w3": 1}


@pytest.mark.parametrize("at_once", [False, True])
def test_a_failed_transactional_ack_of_a_lease_that_ran_out_leaves_it_extendable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, at_once: bool
) -> None:
    with _queue(tmp_path, [b"a", b"b"]) as q:
        mine = q.pop("w1", 1)
        q.now[0] += 6
        t = q.tx.begin()
        _fail_next_write(q.store, monkeypatch, at_once=at_once)
        with pytest.raises(StoreFull):
            q.queues.ack("ns", "t", "q", "w1", [mine[0].id], write_pointer=t.write_pointer)
        assert _extend(q, "w1", [mine[0].id]) == []
        assert _payloads(q.pop("w2", 10)) == [(b"b", 1)]
        q.queues.ack("ns", "t", "q", "w1", [mine[0].id], write_pointer=t.write_pointer)
        q.tx.commit(t.write_pointer, [])
        stats = q.queues.describe("ns", "t", "q")
        assert (stats.consumers, stats.acked, stats.expired) == ({"w2": 1}, 1, 1)
