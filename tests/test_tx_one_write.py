"""One-write commits: a one-request transaction's commit decided last in the store
write of its messages and made durable by that write (``commit_in_write``).

What must hold: the commit is durable when the write is (the file log may lack it, a
restart reads it from the store), a refused commit writes nothing, a write that fails
after the decision stops the log (fail-stop), the held commit stays out of the file
and out of every snapshot until its write commits, a retried group decides once, and
a rotating log sends the commit the usual way. With the log in the store (PostgreSQL's
layout), the write puts the log's own records, in order.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

from tidings.clock import FakeClock
from tidings.errors import (
    LogFailed,
    ServerError,
    TransactionAborted,
    TransactionCommitted,
    TransactionTimedOut,
)
from tidings.messaging import MessagingService
from tidings.store.backend import Store, WriteView
from tidings.store.backends.lmdb import LmdbStore
from tidings.tx import TransactionManager, TxConfig
from tidings.tx.durable import TAIL_MARKER
from tidings.tx.log import TAIL_PREFIX, read_log
from tidings.tx.manager import OneWriteCommit
from tidings.tx.records import Abort, Commit, decode_record

QUIET = TxConfig(sweep_interval=3600)
NS = "ns"


class Both:
    """What ``tidings serve`` runs with role ``all`` over LMDB, in process."""

    def __init__(self, root: Path, config: TxConfig = QUIET, clock: FakeClock | None = None):
        self.root = root
        self.store = LmdbStore(str(root / "store"))
        self.messaging = MessagingService(self.store)
        self.tx = TransactionManager(root / "tx", config, clock, message_store=self.store)
        self.tx.start()
        self.messaging.guard_publishes(self.tx.check_writable)

    def close(self) -> None:
        self.tx.close()
        self.messaging.close()
        self.store.close()

    def publish(self, wp: int, then: Callable[[WriteView], None], n: int = 3) -> Future[list[Any]]:
        batches = [("a", [b"a%d" % i for i in range(n)]), ("b", [b"b%d" % i for i in range(n)])]
        return self.messaging.publish_all_future(NS, batches, wp, then=then)

    def step(self, wp: int) -> OneWriteCommit:
        step = self.tx.commit_in_write(wp)
        assert step is not None
        return step

    def visible(self, topic: str) -> list[bytes]:
        snapshot = self.tx.snapshot()
        return [m.payload for m in self.messaging.fetch(NS, topic, transaction=snapshot)]

    def written(self, topic: str) -> list[bytes]:
        return [m.payload for m in self.messaging.fetch(NS, topic)]

    def file_records(self) -> list[object]:
        return [
            decode_record(p) for path in sorted((self.root / "tx").glob("wal-*.log"))
            for p in read_log(path)
        ]  # fmt: skip


@pytest.fixture
def both(tmp_path: Path) -> Iterator[Both]:
    b = Both(tmp_path)
    b.messaging.create_topic(NS, "a")
    b.messaging.create_topic(NS, "b")
    try:
        yield b
    finally:
        b.close()


def test_the_commit_is_durable_with_the_messages_and_not_flushed_to_the_file(
    both: Both,
) -> None:
    wp = both.tx.begin().write_pointer
    step = both.step(wp)
    step.watch(both.publish(wp, step)).result(5)
    assert both.visible("a") == [b"a0", b"a1", b"a2"]
    assert both.visible("b") == [b"b0", b"b1", b"b2"]
    with pytest.raises(TransactionCommitted):
        both.tx.commit(wp)
    # One fsync: the store's. The file has not been flushed since (nothing waited)...
    assert not any(isinstance(r, Commit) for r in both.file_records())
    # ... and the store write holds the commit record.
    carried = [decode_record(bytes(v)) for _, v in both.store.scan_list("tx", TAIL_PREFIX, b"u")]
    assert [r.write_pointer for r in carried if isinstance(r, Commit)] == [wp]
    # A later flush writes it to the file too (the file alone is complete again).
    both.tx.abort(both.tx.begin().write_pointer)
    assert [r.write_pointer for r in both.file_records() if isinstance(r, Commit)] == [wp]


def test_a_refused_commit_writes_nothing(tmp_path: Path) -> None:
    clock = FakeClock()
    b = Both(tmp_path, clock=clock)
    try:
        b.messaging.create_topic(NS, "a")
        b.messaging.create_topic(NS, "b")
        wp = b.tx.begin(timeout=1).write_pointer
        clock.advance(2000)
        step = b.step(wp)
        with pytest.raises(TransactionTimedOut):
            step.watch(b.publish(wp, step)).result(5)
        assert step.refused and not step.decided
        assert b.written("a") == [] and b.written("b") == []  # nothing of it
        assert wp in b.tx.state().invalid
        # The manager goes on.
        again = b.tx.begin().write_pointer
        step = b.step(again)
        step.watch(b.publish(again, step)).result(5)
        assert b.visible("a") == [b"a0", b"a1", b"a2"]
    finally:
        b.close()


def test_a_failed_write_after_the_decision_stops_the_log(tmp_path: Path) -> None:
    b = Both(tmp_path)
    b.messaging.create_topic(NS, "a")
    b.messaging.create_topic(NS, "b")
    wp = b.tx.begin().write_pointer
    step = b.step(wp)

    def then(view: WriteView) -> None:
        step(view)
        raise OSError("the disk went away")  # as a failed commit: nothing of it stays

    with pytest.raises(OSError, match="disk went away"):
        step.watch(b.publish(wp, then)).result(5)
    assert step.decided
    # Memory has the commit, the disk never will: every call fails from now on.
    with pytest.raises(LogFailed):
        b.tx.begin()
    with pytest.raises(ServerError):
        b.tx.state()
    b.close()
    # The file may lack acknowledged commits: a restart needs the store.
    assert (tmp_path / "tx" / TAIL_MARKER).exists()
    b = Both(tmp_path)
    try:
        assert b.written("a") == [] and b.written("b") == []
        # Not committed: still open (its begin was durable) or invalid (it was not).
        state = b.tx.state()
        assert wp in state.in_progress or wp in state.invalid
    finally:
        b.close()


def test_the_held_commit_stays_out_of_the_file_and_of_snapshots_until_its_write_commits(
    both: Both,
) -> None:
    other = both.tx.begin().write_pointer
    both.tx.snapshot()  # every change so far durable
    wp = both.tx.begin().write_pointer
    step = both.step(wp)
    decided, gate = threading.Event(), threading.Event()

    def then(view: WriteView) -> None:
        step(view)
        decided.set()
        gate.wait(10)  # the store write has not committed yet

    committed = step.watch(both.publish(wp, then))
    assert decided.wait(5)
    aborted = threading.Thread(target=both.tx.abort, args=(other,))
    aborted.start()
    try:
        time.sleep(0.2)
        # A flush for the abort must not take the held commit (nor what follows) to disk.
        assert aborted.is_alive()
        assert not any(isinstance(r, (Commit, Abort)) for r in both.file_records())
        # Nothing a reader is given rests on the commit yet.
        assert both.tx.snapshot(wait=False) is None
        assert wp in both.tx.begin().in_progress
    finally:
        gate.set()
    committed.result(5)
    aborted.join(5)
    assert not aborted.is_alive()
    kinds = [
        (type(r), r.write_pointer) for r in both.file_records() if isinstance(r, Commit | Abort)
    ]
    assert kinds == [(Commit, wp), (Abort, other)]
    snapshot = both.tx.snapshot(wait=False)
    assert snapshot is not None and wp not in snapshot.in_progress
    assert both.visible("a") == [b"a0", b"a1", b"a2"]


def test_a_retried_group_decides_once(both: Both) -> None:
    wp = both.tx.begin().write_pointer
    step = both.step(wp)
    gate = threading.Event()
    both.store.submit(lambda view: gate.wait(10))  # holds the writer: the rest is one group
    ours = step.watch(both.publish(wp, step))

    def boom(view: WriteView) -> None:
        raise ValueError("this one fails, the group runs again")

    failed = both.store.submit(boom)
    gate.set()
    ours.result(5)
    with pytest.raises(ValueError):
        failed.result(5)
    assert both.visible("a") == [b"a0", b"a1", b"a2"]  # once, not twice
    with pytest.raises(TransactionCommitted):
        both.tx.commit(wp)
    both.tx.state()  # the log did not stop


def test_a_rotating_log_defers_to_the_usual_path(both: Both) -> None:
    wp = both.tx.begin().write_pointer
    step = both.step(wp)
    with both.tx._lock:  # as take_snapshot holds it while it rotates
        both.tx._rotating = True
        try:
            with pytest.raises(Exception, match="rotating"):
                step.watch(both.publish(wp, step)).result(5)
        finally:
            both.tx._rotating = False
    assert step.deferred and not step.decided and not step.refused
    assert both.written("a") == []
    both.messaging.publish_all_future(NS, [("a", [b"x"])], wp).result(5)
    both.tx.commit(wp)
    assert both.visible("a") == [b"x"]


def test_no_one_write_without_a_message_store(tmp_path: Path) -> None:
    with TransactionManager(tmp_path / "tx", QUIET) as m:
        assert m.commit_in_write(m.begin().write_pointer) is None
    with TransactionManager(None, QUIET) as m:
        assert m.commit_in_write(m.begin().write_pointer) is None


_CRASHING = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path
    sys.path.insert(0, sys.argv[2])
    from tests.test_tx_one_write import Both, NS
    from tidings.tx import TxConfig

    # Small snapshots: rotations happen among the one-write commits.
    b = Both(Path(sys.argv[1]), TxConfig(sweep_interval=3600, snapshot_every=16))
    b.messaging.create_topic(NS, "a")
    b.messaging.create_topic(NS, "b")
    def one() -> None:
        wp = b.tx.begin().write_pointer
        step = b.tx.commit_in_write(wp)
        try:
            step.watch(b.publish(wp, step, n=1)).result(5)
        except Exception:
            if not step.deferred:
                raise
            # The log was rotating (nothing written): publish, then commit, as the
            # server does then.
            b.messaging.publish_all_future(NS, [("a", [b"a0"]), ("b", [b"b0"])], wp).result(5)
            b.tx.commit(wp)
        print(wp, flush=True)  # acknowledged

    for i in range(55):
        one()
    # No more rotations (each flushes the file): the last commits are in the store only.
    b.tx.config = TxConfig(sweep_interval=3600, snapshot_every=10**6)
    time.sleep(0.3)
    for i in range(5):
        one()
    os._exit(0)  # no clean stop
    """
)


def test_a_crash_recovers_commits_only_the_store_holds(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-c", _CRASHING, str(tmp_path), os.getcwd()],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    acknowledged = [int(line) for line in out.split()]
    assert len(acknowledged) == 60
    in_file = {
        record.write_pointer
        for path in sorted((tmp_path / "tx").glob("wal-*.log"))
        for record in map(decode_record, read_log(path))
        if isinstance(record, Commit)
    }
    assert in_file < set(acknowledged)
    assert not set(acknowledged[-5:]) & in_file  # only the store holds these
    assert (tmp_path / "tx" / TAIL_MARKER).exists()
    # The transaction service alone cannot recover this directory: it would lose them.
    with pytest.raises(ServerError, match="role `all`"):
        TransactionManager(tmp_path / "tx", QUIET).start()
    b = Both(tmp_path)
    try:
        for wp in acknowledged:
            with pytest.raises(TransactionCommitted):
                b.tx.commit(wp)
        assert b.visible("a") == [b"a0"] * 60
        assert b.visible("b") == [b"b0"] * 60
    finally:
        b.close()
    # A clean stop leaves a complete file: the marker goes, the service alone may start.
    assert not (tmp_path / "tx" / TAIL_MARKER).exists()
    with TransactionManager(tmp_path / "tx", QUIET) as m:
        assert m.state().read_pointer >= max(acknowledged)


# --- the log in the store (PostgreSQL's layout; every backend) ----------------------


def test_one_write_with_the_log_in_the_store(store: Store) -> None:
    messaging = MessagingService(store)
    tm = TransactionManager(None, QUIET, store=store)
    tm.start()
    messaging.guard_publishes(tm.check_writable)
    messaging.create_topic(NS, "a")
    try:
        committed = []
        for i in range(20):
            wp = tm.begin().write_pointer
            step = tm.commit_in_write(wp)
            assert step is not None
            write = messaging.publish_all_future(NS, [("a", [b"%d" % i])], wp, then=step)
            step.watch(write).result(5)
            committed.append(wp)
        # Another call's record queued behind the write that carries it: the write puts
        # it first (log order), its own write puts it again, which changes nothing.
        other = tm.begin().write_pointer
        wp = tm.begin().write_pointer
        gate = threading.Event()
        # The memory store runs a write in the caller's thread: a timer opens its gate
        # (the other stores queue the write, and the gate opens below, before the timer).
        threading.Timer(0.5, gate.set).start()
        store.submit(lambda view: gate.wait(10))
        step = tm.commit_in_write(wp)
        assert step is not None
        write = messaging.publish_all_future(NS, [("a", [b"last"])], wp, then=step)
        aborted = threading.Thread(target=tm.abort, args=(other,))
        aborted.start()
        time.sleep(0.1)
        gate.set()
        step.watch(write).result(5)
        aborted.join(5)
        committed.append(wp)
        # The log in the store replays as one order: a new manager finds every commit.
        with TransactionManager(None, QUIET, store=store) as again:
            for wp in committed:
                with pytest.raises(TransactionCommitted):
                    again.commit(wp)
            with pytest.raises(TransactionAborted):
                again.commit(other)
            snapshot = again.snapshot()
        payloads = [m.payload for m in messaging.fetch(NS, "a", transaction=snapshot)]
        assert payloads == [b"%d" % i for i in range(20)] + [b"last"]
    finally:
        tm.close()
        messaging.close()


def test_a_failed_write_stops_the_log_in_the_store(store: Store) -> None:
    messaging = MessagingService(store)
    tm = TransactionManager(None, QUIET, store=store)
    tm.start()
    messaging.create_topic(NS, "a")
    try:
        wp = tm.begin().write_pointer
        step = tm.commit_in_write(wp)
        assert step is not None

        def then(view: WriteView) -> None:
            step(view)
            raise OSError("the database went away")

        write = messaging.publish_all_future(NS, [("a", [b"x"])], wp, then=then)
        with pytest.raises(OSError):
            step.watch(write).result(5)
        with pytest.raises(LogFailed):
            tm.begin()
        with TransactionManager(None, QUIET, store=store) as again:
            assert wp in again.state().in_progress  # not committed
    finally:
        tm.close()
        messaging.close()
