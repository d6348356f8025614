"""The queue coordinator in process: a random run of pops, acks, nacks, lease expiry,
transactions and restarts keeps the queue's promises (property-tested)."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import TypeVar

import pytest
from hypothesis import given, note, settings
from hypothesis import strategies as st

from tidings.consumers import queues as queues_module
from tidings.consumers.queues import QueueCoordinator
from tidings.errors import AckConflict, NotDelivered
from tidings.messaging import MessagingService
from tidings.store.backend import WriteView
from tidings.store.backends.memory import MemoryStore
from tidings.structs import Message, MessageId
from tidings.tx import TransactionManager, TxConfig

T = TypeVar("T")


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


WORKERS = ("w1", "w2", "w3")
steps = st.lists(
    st.one_of(
        st.tuples(st.just("pop"), st.sampled_from(WORKERS), st.integers(1, 5)),
        st.tuples(st.just("popnow"), st.sampled_from(WORKERS), st.integers(1, 5)),
        st.tuples(st.just("ack"), st.sampled_from(WORKERS), st.integers(1, 5)),
        st.tuples(st.just("acknow"), st.sampled_from(WORKERS), st.integers(1, 5)),
        st.tuples(st.just("nack"), st.sampled_from(WORKERS), st.integers(1, 5)),
        st.tuples(st.just("tx"), st.sampled_from(WORKERS), st.booleans()),
        st.tuples(st.just("publish"), st.just(""), st.integers(1, 4)),
        st.tuples(st.just("wait"), st.just(""), st.integers(1, 3)),
        st.tuples(st.just("restart"), st.just(""), st.just(0)),
        st.tuples(st.just("close"), st.sampled_from(WORKERS), st.just(0)),
    ),
    max_size=40,
)


@settings(max_examples=60, deadline=None)
@given(steps)
def test_a_random_run_delivers_every_message_and_acks_each_once(
    run: list[tuple[str, str, int | bool]],
) -> None:
    note(repr(run))
    with tempfile.TemporaryDirectory() as tmp:
        store = MemoryStore()
        messaging = MessagingService(store)
        messaging.create_topic("ns", "t")
        clock = Clock()
        with TransactionManager(Path(tmp) / "tx", TxConfig(sweep_interval=3600)) as tx:
            queues = QueueCoordinator(store, messaging, tx, clock=clock)
            published: list[MessageId] = []
            # Per worker, what it popped and has not settled (a message popped again
            # after its lease ran out is held once).
            held: dict[str, dict[MessageId, Message]] = {w: {} for w in WORKERS}
            deadline: dict[tuple[str, MessageId], float] = {}
            acked: list[MessageId] = []

            def publish(n: int) -> None:
                start = len(published)
                messaging.publish("ns", "t", [f"m{start + i}".encode() for i in range(n)])
                page = messaging.fetch("ns", "t", limit=10_000)
                published[:] = [m.id for m in page]

            def pop(worker: str, n: int, nowait: bool = False) -> list[Message]:
                snap = tx.snapshot()
                assert snap is not None
                found = None
                if nowait:
                    # The event loop's call: it declines only where the queue is not
                    # in memory (no dead letters here), and then changes nothing.
                    found = queues.pop_nowait(
                        "ns", "t", "q", worker, max_messages=n, ack_timeout_ms=1000,
                        snapshot=snap, max_deliveries=1000,
                    )  # fmt: skip
                    assert (found is None) == (not loaded())
                got = found.messages() if found is not None else queues.pop(
                    "ns", "t", "q", worker, max_messages=n, ack_timeout_ms=1000, snapshot=snap,
                    max_deliveries=1000,
                )  # fmt: skip
                assert [m.id for m in got] == sorted(m.id for m in got)
                for other, messages in held.items():
                    for m in messages.values():
                        if m.id in {g.id for g in got}:
                            # Never leased twice at once: only after that lease ran out.
                            assert clock.now >= deadline.get((other, m.id), 0), (other, worker)
                for m in got:
                    deadline[(worker, m.id)] = clock.now + 1.0
                return got

            def loaded() -> bool:
                return bool(queues._queues)

            def ack(worker: str, ids: list[MessageId], nowait: bool) -> None:
                snap = tx.snapshot()
                assert snap is not None
                done = (
                    queues.ack_nowait("ns", "t", "q", worker, ids, snapshot=snap)
                    if nowait
                    else None
                )
                if done is None:
                    queues.ack("ns", "t", "q", worker, ids)
                else:
                    done.result()

            publish(3)
            forgotten: set[MessageId] = set()
            for op, worker, arg in run:
                if op == "publish":
                    publish(int(arg))
                elif op in ("pop", "popnow"):
                    got = pop(worker, int(arg), nowait=op == "popnow")
                    held[worker].update((m.id, m) for m in got)
                elif op in ("ack", "acknow", "nack") and held[worker]:
                    batch = list(held[worker].values())[: int(arg)]
                    for m in batch:
                        del held[worker][m.id]
                    try:
                        if op != "nack":
                            ack(worker, [m.id for m in batch], nowait=op == "acknow")
                            # An ack of a message acked before a restart is answered as
                            # done (the restart forgot who acked it): not a second ack.
                            acked.extend(m.id for m in batch if m.id not in forgotten)
                        else:
                            queues.nack("ns", "t", "q", worker, [m.id for m in batch])
                    except (AckConflict, NotDelivered):
                        pass  # its lease ran out and passed on: refused, nothing changed
                elif op == "tx" and held[worker]:
                    batch = list(held[worker].values())
                    held[worker] = {}
                    t = tx.begin()
                    try:
                        queues.ack(
                            "ns", "t", "q", worker, [m.id for m in batch],
                            write_pointer=t.write_pointer,
                        )  # fmt: skip
                    except (AckConflict, NotDelivered):
                        continue
                    if arg:
                        tx.commit(t.write_pointer, [])
                        acked.extend(m.id for m in batch)
                    else:
                        queues.rollback("ns", "t", "q", t.write_pointer)
                        tx.abort(t.write_pointer)
                elif op == "wait":
                    clock.now += float(arg)  # leases of 1 s run out
                elif op == "restart":
                    queues = QueueCoordinator(store, messaging, tx, clock=clock)
                    forgotten.update(acked)
                    # Leases not written yet (popped since the last ack, nack or
                    # close) are forgotten: their messages may go out again at once.
                    deadline.clear()
                elif op == "close":
                    if queues.names("ns", "t"):
                        queues.release("ns", "t", "q", worker)
                    held[worker] = {}
            # Whatever happened, the rest comes out once every lease has run out.
            clock.now += 10
            queues = QueueCoordinator(store, messaging, tx, clock=clock)
            rest: list[Message] = []
            while batch := pop("w1", 7):
                rest.extend(batch)
                queues.ack("ns", "t", "q", "w1", [m.id for m in batch])
            assert len(acked) == len(set(acked))  # no message acked twice
            assert sorted(acked + [m.id for m in rest]) == sorted(published)
            stats = queues.describe("ns", "t", "q")
            assert (stats.pending, stats.waiting, stats.ack_state) == (0, 0, 0)


def test_an_ack_writes_the_other_workers_leases_with_the_read_position(tmp_path: Path) -> None:
    store = MemoryStore()
    messaging = MessagingService(store)
    messaging.create_topic("ns", "t")
    messaging.publish("ns", "t", [b"a", b"b", b"c", b"d", b"e"])
    clock = Clock()
    with TransactionManager(tmp_path / "tx", TxConfig(sweep_interval=3600)) as tx:
        queues = QueueCoordinator(store, messaging, tx, clock=clock)

        def pop(q: QueueCoordinator, worker: str, n: int) -> list[Message]:
            snap = tx.snapshot()
            assert snap is not None
            return q.pop("ns", "t", "q", worker, max_messages=n, snapshot=snap)

        first = pop(queues, "w1", 2)
        second = pop(queues, "w2", 2)
        queues.ack("ns", "t", "q", "w1", [m.id for m in first])
        pop(queues, "w3", 1)  # popped after the last write: forgotten by a restart
        restarted = QueueCoordinator(store, messaging, tx, clock=clock)
        # w2's lease was written with w1's ack: it keeps its deadline; "e" comes again.
        e = pop(restarted, "w4", 5)
        assert [m.payload for m in e] == [b"e"]
        restarted.ack("ns", "t", "q", "w4", [e[0].id])
        clock.now += 31  # past the default ack timeout of 30 s
        again = pop(restarted, "w4", 5)
        assert [m.id for m in again] == [m.id for m in second]
        assert [m.delivery_count for m in again] == [2, 2]


def test_a_message_queued_twice_is_handed_out_once(tmp_path: Path) -> None:
    # Found by the property test: a lease runs out (the message is queued), its worker
    # acks it in a transaction that rolls back (queued again): one pop, one copy.
    store = MemoryStore()
    messaging = MessagingService(store)
    messaging.create_topic("ns", "t")
    messaging.publish("ns", "t", [b"a", b"b"])
    clock = Clock()
    with TransactionManager(tmp_path / "tx", TxConfig(sweep_interval=3600)) as tx:
        queues = QueueCoordinator(store, messaging, tx, clock=clock)

        def pop(n: int) -> list[Message]:
            snap = tx.snapshot()
            assert snap is not None
            return queues.pop(
                "ns", "t", "q", "w1", max_messages=n, ack_timeout_ms=1000, snapshot=snap
            )

        first = pop(1)
        clock.now += 1.5
        t = tx.begin()
        queues.ack("ns", "t", "q", "w1", [first[0].id], write_pointer=t.write_pointer)
        queues.rollback("ns", "t", "q", t.write_pointer)
        tx.abort(t.write_pointer)
        again = pop(5)
        assert [m.payload for m in again] == [b"a", b"b"]
        assert again[0].delivery_count == 2


class _GatedStore(MemoryStore):
    """A store whose writes wait until released (as a busy writer's queue would)."""

    def __init__(self) -> None:
        super().__init__()
        self.gated = False
        self.held: list[tuple[Callable[[WriteView], object], Future[object]]] = []

    def submit(self, fn: Callable[[WriteView], T]) -> Future[T]:
        if not self.gated:
            return super().submit(fn)
        outer: Future[T] = Future()
        self.held.append((fn, outer))  # type: ignore[arg-type]
        return outer

    def release(self) -> None:
        self.gated = False
        for fn, outer in self.held:
            if not outer.set_running_or_notify_cancel():
                continue  # cancelled while it waited: never applied
            try:
                outer.set_result(super().submit(fn).result())
            except Exception as exc:  # handed on as it is
                outer.set_exception(exc)
        self.held = []


def test_a_cancelled_wait_for_an_ack_does_not_cancel_its_write(tmp_path: Path) -> None:
    # The event loop's ack hands back a future; a request cancelled while it waits
    # cancels that future. The store write must land anyway: memory is ahead of it
    # (here it names w2's lease as written, and a later write of the read position
    # past that lease would otherwise make w2's messages count as acked).
    store = _GatedStore()
    messaging = MessagingService(store)
    messaging.create_topic("ns", "t")
    messaging.publish("ns", "t", [b"a", b"b", b"c", b"d", b"e", b"f"])
    clock = Clock()
    with TransactionManager(tmp_path / "tx", TxConfig(sweep_interval=3600)) as tx:
        queues = QueueCoordinator(store, messaging, tx, clock=clock)

        def pop(q: QueueCoordinator, worker: str, n: int) -> list[Message]:
            snap = tx.snapshot()
            assert snap is not None
            return q.pop("ns", "t", "q", worker, max_messages=n, snapshot=snap)

        first = pop(queues, "w1", 2)
        second = pop(queues, "w2", 2)
        store.gated = True
        snap = tx.snapshot()
        assert snap is not None
        waiting = queues.ack_nowait("ns", "t", "q", "w1", [m.id for m in first], snapshot=snap)
        assert waiting is not None and waiting.cancel()
        store.release()
        third = pop(queues, "w3", 2)
        queues.ack("ns", "t", "q", "w3", [m.id for m in third])  # writes the read position
        restarted = QueueCoordinator(store, messaging, tx, clock=clock)
        clock.now += 31  # past w2's lease
        again = pop(restarted, "w4", 10)
        assert [m.payload for m in again] == [m.payload for m in second]


def test_acks_are_remembered_up_to_the_bound_and_the_oldest_forgotten(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A retried ack of one of the last acks is answered as done, and an ack of a message
    # another worker acked is a conflict; past the bound, the oldest are forgotten in
    # bulk, so what is remembered stays between the bound and twice it.
    monkeypatch.setattr(queues_module, "_RECENT_ACKS", 10)
    store = MemoryStore()
    messaging = MessagingService(store)
    messaging.create_topic("ns", "t")
    messaging.publish("ns", "t", [str(i).encode() for i in range(50)])
    with TransactionManager(tmp_path / "tx", TxConfig(sweep_interval=3600)) as tx:
        queues = QueueCoordinator(store, messaging, tx, clock=Clock())
        acked: list[MessageId] = []
        for _ in range(25):
            snap = tx.snapshot()
            assert snap is not None
            popped = queues.pop("ns", "t", "q", "w1", max_messages=2, snapshot=snap)
            queues.ack("ns", "t", "q", "w1", [m.id for m in popped])
            acked += [m.id for m in popped]
            remembered = len(queues._queues[queues._qid("ns", "t", "q")].recent)
            assert remembered <= 20 and remembered >= min(10, len(acked))
        queues.ack("ns", "t", "q", "w1", acked[-10:])  # a retry: done, nothing to do
        with pytest.raises(AckConflict):
            queues.ack("ns", "t", "q", "w2", acked[-1:])
        # Forgotten who acked it: the topic holds it and no lease does, so it was acked
        # (a retry after a restart is the same): done. In a transaction, whether it
        # conflicts cannot be told: refused.
        queues.ack("ns", "t", "q", "w1", acked[:1])
        with pytest.raises(NotDelivered):
            wp = tx.begin().write_pointer
            queues.ack("ns", "t", "q", "w1", acked[:1], write_pointer=wp)
