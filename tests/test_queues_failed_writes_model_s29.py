"""A queue whose calls' store writes fail behaves as a twin queue to which those calls
were never made: the same leases per worker, depth and counters, and the same answers
(payloads and delivery counts) to every later call, also once both restart (their
memory read back from what each wrote). A transaction whose queue rollback fails is
invalidated, as the clients do; the twin only invalidates it. In process, as a store
write cannot be made to fail inside a server process. Knobs:
TIDINGS_QUEUE_FAILURES_EXAMPLES, TIDINGS_QUEUE_FAILURES_STEPS (derandomized by
default, so a run in the suite is repeatable; TIDINGS_QUEUE_FAILURES_RANDOM=1 explores)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from tidings.consumers.queues import QueueCoordinator
from tidings.errors import AckConflict, StoreFull, TidingsError
from tidings.messaging import MessagingService
from tidings.store.backend import WriteView
from tidings.store.backends.memory import MemoryStore
from tidings.structs import Message, MessageId
from tidings.tx import TransactionManager, TxConfig

T = TypeVar("T")
WORKERS = ("w1", "w2", "w3")
CALLS = (
    "pop", "ack", "tx_ack", "nack", "release", "extend", "rollback", "purge",
    # The event loop's paths: a pop carrying acks (the acks first, then the pop), and
    # a transactional ack as the one-request transaction makes it.
    "ack_next", "tx_ack_nowait",
)  # fmt: skip


class _Twin:
    def __init__(self, root: Path, now: list[float]) -> None:
        self.store = MemoryStore()
        self.messaging = MessagingService(self.store)
        self.messaging.create_topic("ns", "t")
        self.tx = TransactionManager(root, TxConfig(sweep_interval=3600)).__enter__()
        self.queues = QueueCoordinator(self.store, self.messaging, self.tx, clock=lambda: now[0])
        self.ids: dict[bytes, MessageId] = {}
        self.open_tx: int | None = None
        self.fail_at_once = False

    def restart(self, now: list[float]) -> None:
        self.queues = QueueCoordinator(self.store, self.messaging, self.tx, clock=lambda: now[0])

    def fail_next(self, at_once: bool) -> None:
        """The next queue write fails (its dead-lettering too, for a pop)."""
        store, messaging = self.store, self.messaging
        submit, publish = store.submit, messaging.publish_with_future

        def restore() -> None:
            store.submit = submit  # type: ignore[method-assign]
            messaging.publish_with_future = publish  # type: ignore[method-assign]

        def failed() -> Future[Any]:
            restore()
            if at_once:
                raise StoreFull("the store is full")
            done: Future[Any] = Future()
            done.set_exception(StoreFull("the store is full"))
            return done

        def full_submit(fn: Callable[[WriteView], T]) -> Future[T]:
            return failed()

        def full_publish(*args: Any, **kwargs: Any) -> Future[Any]:
            return failed()

        store.submit = full_submit  # type: ignore[method-assign]
        messaging.publish_with_future = full_publish  # type: ignore[method-assign]
        self.restore = restore

    def call(self, name: str, worker: str, payloads: list[bytes], n: int) -> object:
        """The call's answer as comparable between twins (payloads, not ids), or its
        error's type."""
        q, ids = self.queues, [self.ids[p] for p in payloads]
        try:
            if name == "pop":
                snap = self.tx.snapshot()
                assert snap is not None
                got: list[Message] = q.pop(
                    "ns", "t", "q", worker, max_messages=n, snapshot=snap,
                    ack_timeout_ms=5000, max_deliveries=3,
                )  # fmt: skip
                return [(m.payload, m.delivery_count) for m in got]
            if name == "ack":
                q.ack("ns", "t", "q", worker, ids)
            elif name == "tx_ack":
                if self.open_tx is None:
                    self.open_tx = self.tx.begin().write_pointer
                q.ack("ns", "t", "q", worker, ids, write_pointer=self.open_tx)
            elif name == "tx_ack_nowait":
                if self.open_tx is None:
                    self.open_tx = self.tx.begin().write_pointer
                wp = self.open_tx
                try:
                    self._ack_nowait(worker, ids, wp)
                except AckConflict:
                    self.tx.invalidate(wp)  # left to the caller on the event loop
                    raise
            elif name == "ack_next":
                self._ack_nowait(worker, ids, None)
                return self.call("pop", worker, [], n)
            elif name == "nack":
                return self._payloads(q.nack("ns", "t", "q", worker, ids))
            elif name == "release":
                return q.release("ns", "t", "q", worker)
            elif name == "extend":
                return self._payloads(
                    q.extend("ns", "t", "q", worker, ids, ack_timeout_ms=1000 * n)
                )
            elif name == "rollback":
                if self.open_tx is None:
                    return None
                return q.rollback("ns", "t", "q", self.open_tx, keep_leases=n % 2 == 0)
            else:
                return q.purge("ns", "t", "q")
        except TidingsError as exc:
            return type(exc)
        return None

    def _ack_nowait(self, worker: str, ids: list[MessageId], wp: int | None) -> None:
        """An ack as the event loop makes it: on a worker thread where the queue is
        not in memory (or is to be rebuilt)."""
        snap = self.tx.snapshot()
        assert snap is not None
        q = self.queues
        done = q.ack_nowait("ns", "t", "q", worker, ids, snapshot=snap, write_pointer=wp)
        if done is None:
            q.ack("ns", "t", "q", worker, ids, write_pointer=wp)
        else:
            done.result()

    def _payloads(self, ids: list[MessageId]) -> list[bytes]:
        by_id = {v: k for k, v in self.ids.items()}
        return [by_id[m] for m in ids]

    def seen(self) -> tuple[object, ...]:
        s = self.queues.describe("ns", "t", "q")
        return (
            s.consumers,
            s.pending,
            s.waiting,
            (s.popped, s.acked, s.nacked, s.redelivered, s.dead_lettered, s.expired),
        )


class FailedWrites(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.root = Path(tempfile.mkdtemp(prefix="queue-failures-"))
        self.now = [1000.0]
        self.failing = _Twin(self.root / "a", self.now)
        self.reference = _Twin(self.root / "b", self.now)
        self.twins = (self.failing, self.reference)
        self.published = 0
        self.publish(3)
        for twin in self.twins:  # the queue exists from here on
            assert twin.call("pop", "w1", [], 1) == [(b"0", 1)]
            twin.call("nack", "w1", [b"0"], 1)

    def teardown(self) -> None:
        for twin in self.twins:
            twin.tx.__exit__(None, None, None)
        shutil.rmtree(self.root, ignore_errors=True)

    @rule(n=st.integers(1, 3))
    def publish(self, n: int) -> None:
        payloads = [b"%d" % (self.published + i) for i in range(n)]
        self.published += n
        for twin in self.twins:
            twin.messaging.publish("ns", "t", payloads)
            got = twin.messaging.fetch("ns", "t", limit=1000, count=False)
            twin.ids.update((m.payload, m.id) for m in got)

    def _both(self, name: str, worker: str, payloads: list[bytes], n: int) -> None:
        answers = [twin.call(name, worker, payloads, n) for twin in self.twins]
        assert answers[0] == answers[1], (name, worker, payloads, answers)

    @rule(
        name=st.sampled_from(CALLS),
        worker=st.sampled_from(WORKERS),
        data=st.data(),
        n=st.integers(1, 4),
    )
    def call(self, name: str, worker: str, data: st.DataObject, n: int) -> None:
        payloads = self._some(data)
        self._both(name, worker, payloads, n)

    @rule(
        name=st.sampled_from(CALLS),
        worker=st.sampled_from(WORKERS),
        data=st.data(),
        n=st.integers(1, 4),
        at_once=st.booleans(),
    )
    def call_whose_write_fails(
        self, name: str, worker: str, data: st.DataObject, n: int, at_once: bool
    ) -> None:
        payloads = self._some(data)
        twin = self.failing
        before = twin.seen()
        twin.fail_next(at_once)
        try:
            answer = twin.call(name, worker, payloads, n)
        finally:
            twin.restore()
        if answer is StoreFull:
            assert twin.seen() == before, (name, worker, payloads)
            if name.startswith("tx_ack") and twin.open_tx and self.reference.open_tx is None:
                # The transaction began on the failing twin only: begin it on the other.
                self.reference.open_tx = self.reference.tx.begin().write_pointer
            return
        # Nothing to write (or refused before writing): the reference makes it too.
        assert self.reference.call(name, worker, payloads, n) == answer

    @rule(commit=st.booleans())
    def end_transaction(self, commit: bool) -> None:
        outcomes: list[object] = []
        for twin in self.twins:
            wp = twin.open_tx
            if wp is None:
                outcomes.append(None)
                continue
            twin.open_tx = None
            try:
                if commit:
                    twin.tx.commit(wp, [])
                else:
                    twin.queues.rollback("ns", "t", "q", wp)
                    twin.tx.abort(wp)
                outcomes.append("ended")
            except TidingsError as exc:  # a purge invalidated it, say
                outcomes.append(type(exc))
        assert outcomes[0] == outcomes[1], outcomes

    @rule(keep_leases=st.booleans(), at_once=st.booleans())
    def end_transaction_whose_rollback_fails(self, keep_leases: bool, at_once: bool) -> None:
        """The transaction is ended as the clients and the one-request transaction end
        one whose queue rollback failed: invalidated, not aborted. The failed rollback
        changes nothing: the twin that never made it ends the same way."""
        if self.failing.open_tx is None:
            return
        twin = self.failing
        before = twin.seen()
        twin.fail_next(at_once)
        try:
            answer = twin.call("rollback", "w1", [], 2 if keep_leases else 1)
        finally:
            twin.restore()
        if answer is StoreFull:
            assert twin.seen() == before
        else:  # nothing to write: the reference makes it too
            assert self.reference.call("rollback", "w1", [], 2 if keep_leases else 1) == answer
        outcomes: list[object] = []
        for each in self.twins:
            wp = each.open_tx
            assert wp is not None
            each.open_tx = None
            try:
                if answer is StoreFull:
                    each.tx.invalidate(wp)
                else:
                    each.tx.abort(wp)
                outcomes.append("ended")
            except TidingsError as exc:
                outcomes.append(type(exc))
        assert outcomes[0] == outcomes[1], outcomes

    @rule()
    def restart(self) -> None:
        """Both queues' memory is dropped and read back from the store: what the
        failing one wrote after its rebuilds must read back as the twin's does."""
        for twin in self.twins:
            twin.restart(self.now)

    @rule(seconds=st.integers(1, 6))
    def time_passes(self, seconds: int) -> None:
        self.now[0] += seconds

    def _some(self, data: st.DataObject) -> list[bytes]:
        known = sorted(self.reference.ids)
        return data.draw(st.lists(st.sampled_from(known), min_size=1, max_size=3, unique=True))

    @invariant()
    def twins_agree(self) -> None:
        assert self.failing.seen() == self.reference.seen()


def test_calls_whose_writes_fail_leave_the_queue_as_if_never_made() -> None:
    run_state_machine_as_test(
        FailedWrites,
        settings=settings(
            max_examples=int(os.environ.get("TIDINGS_QUEUE_FAILURES_EXAMPLES", "25")),
            stateful_step_count=int(os.environ.get("TIDINGS_QUEUE_FAILURES_STEPS", "30")),
            deadline=None,
            derandomize=os.environ.get("TIDINGS_QUEUE_FAILURES_RANDOM") != "1",
            suppress_health_check=list(HealthCheck),
        ),
    )
