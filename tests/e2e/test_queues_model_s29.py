"""A model of a queue, checked step by step against the real server through the real
sync client (hypothesis' stateful testing): random publishes, pops (with and without
carried acks), acks (plain, in a transaction that commits or aborts, of messages not
held or acked already), nacks, extensions, leases running out, and the queue's stats.

The model says of each published message whether it is unread, available (given back,
or its lease ran out), leased to a worker, acked or dead-lettered, with its delivery
count and who held it; a pop's answer is predicted exactly (returned messages first,
oldest first, then the topic in order), so no message is leased to two workers at
once, none is lost, and nothing acked comes back. The stats must count as the model.

A second machine adds a rule that kills the server (kill -9) and starts it again, on
a server of its own: the model then knows the queue's records (its state at the
queue's last store write: a pop writes nothing), and expects written leases to
hold, what was popped since to be handed out again, and nothing acked to come back.

``TIDINGS_QUEUE_MODEL_EXAMPLES``, ``TIDINGS_QUEUE_MODEL_RESTART_EXAMPLES`` and
``TIDINGS_QUEUE_MODEL_STEPS`` run more (to hunt for bugs locally)."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import httpx
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from tests.e2e.serverproc import ServerProcess
from tidings import Client
from tidings.client._sync.queue import Queue
from tidings.errors import AckConflict, NotDelivered, TidingsError
from tidings.structs import Message, MessageId

pytestmark = pytest.mark.e2e

MAX_DELIVERIES = 3
WORKERS = ("a", "b", "c")
#: The worker whose leases run out: its pops wait past their ack timeout.
SHORT = "x"
SHORT_TIMEOUT = 0.05

UNREAD, AVAILABLE, LEASED, ACKED, DEAD = "unread", "available", "leased", "acked", "dead"
#: Dropped by a purge: acked without an ack (an ack of it is answered as done).
PURGED = "purged"


class _Aborted(Exception):
    """The application's own failure inside a transaction: it aborts."""


@dataclass
class _State:
    """One published message as the model has it."""

    payload: bytes
    state: str = UNREAD
    count: int = 0  # deliveries so far
    holder: str = ""  # leased to; or who held it last, or who acked it
    owners: set[str] = field(default_factory=set)  # every worker it was leased to
    #: Available because its lease ran out (the lease keeps its owner, who may extend
    #: it), rather than given back (a nack or an abort: the queue's).
    expired: bool = False
    id: MessageId | None = None
    #: Acked or dead-lettered before a restart, which forgets who acked what (also
    #: in a transaction whose record no write has put as resolved yet).
    forgotten: bool = False

    def copy(self) -> _State:
        return replace(self, owners=set(self.owners))


@dataclass
class _Counters:
    popped: int = 0
    acked: int = 0
    nacked: int = 0
    redelivered: int = 0
    dead_lettered: int = 0
    expired: int = 0


class QueueModel(RuleBasedStateMachine):
    url = ""

    def __init__(self) -> None:
        super().__init__()
        self.http = httpx.Client()  # for the release call, which the client has no name for
        self.topic = "qm-" + uuid.uuid4().hex[:12]
        self.handles: dict[str, Queue] = {}
        self._connect()
        self.client.create_topic(self.topic)
        self.messages: list[_State] = []
        #: The messages as the queue's records have them: as the model was at the
        #: queue's last store write (a pop writes nothing); those past it are unread.
        self.durable: list[_State] = []
        self.created = False
        self.counters = _Counters()
        self.pushed = 0  # published since the server started
        self.restarted = False

    def _connect(self) -> None:
        """A client, and a handle per worker (the same consumer ids as before)."""
        self.client = Client(self.url)
        for name in (*WORKERS, SHORT):
            timeout = SHORT_TIMEOUT if name == SHORT else 600.0
            handle = self.client.queue(
                self.topic, "q", ack_timeout=timeout, max_deliveries=MAX_DELIVERIES
            )
            if name in self.handles:
                handle.consumer_id = self.handles[name].consumer_id
            self.handles[name] = handle

    def _write(self) -> None:
        """The queue wrote its records: every lease in memory goes with any write."""
        self.durable = [m.copy() for m in self.messages]

    def teardown(self) -> None:
        self.client.delete_topic(self.topic)
        if any(m.state == DEAD for m in self.messages):
            self.client.delete_topic(self.topic + "-dlq")
        self.client.close()
        self.http.close()

    # --- helpers ---------------------------------------------------------------------

    def _popped(self, worker: str) -> list[int]:
        return [i for i, m in enumerate(self.messages) if m.id is not None and worker in m.owners]

    def _known(self) -> list[int]:
        return [i for i, m in enumerate(self.messages) if m.id is not None]

    def _expect_pop(self, worker: str, n: int) -> tuple[list[int], list[int]]:
        """What a pop of ``n`` hands out (in order) and what it dead-letters."""
        returned = [i for i, m in enumerate(self.messages) if m.state == AVAILABLE]
        unread = [i for i, m in enumerate(self.messages) if m.state == UNREAD]
        chosen: list[int] = []
        dead: list[int] = []
        for i in returned:
            if len(chosen) == n:
                break
            if self.messages[i].count >= MAX_DELIVERIES:
                dead.append(i)
            else:
                chosen.append(i)
        chosen += unread[: n - len(chosen)]
        return chosen, dead

    def _ack_verdict(self, worker: str, indexes: list[int]) -> type[Exception] | None:
        """The error an ack of these (by ``worker``, outside a transaction) gets."""
        unknown = conflict = False
        for i in indexes:
            m = self.messages[i]
            if m.state == UNREAD:
                unknown = True
            elif m.state == ACKED:
                # Acked already: done, by whoever after a restart.
                conflict = conflict or (m.holder != worker and not m.forgotten)
            elif m.state == DEAD:
                conflict = conflict or not m.forgotten
            elif m.state == PURGED:
                pass
            elif worker not in m.owners:
                unknown = True
            elif m.holder != worker:  # leased to another, or another held it last
                conflict = True
        if unknown:
            return NotDelivered
        return AckConflict if conflict else None

    def _do_ack(self, worker: str, indexes: list[int]) -> None:
        for i in dict.fromkeys(indexes):
            m = self.messages[i]
            if m.state not in (ACKED, DEAD, PURGED):
                m.state, m.holder, m.expired = ACKED, worker, False
                self.counters.acked += 1
        # Written even where all of them were acked before: an ack writes every lease
        # not written yet (a nack, extend or release that does nothing writes nothing).
        self._write()

    def _ids(self, indexes: list[int]) -> list[MessageId]:
        out = []
        for i in indexes:
            message_id = self.messages[i].id
            assert message_id is not None
            out.append(message_id)
        return out

    def _check_pop(self, worker: str, n: int, got: list[Message]) -> None:
        chosen, dead = self._expect_pop(worker, n)
        expected = [(self.messages[i].payload, self.messages[i].count + 1) for i in chosen]
        assert [(m.payload, m.delivery_count) for m in got] == expected
        for i, message in zip(chosen, got, strict=True):
            m = self.messages[i]
            if m.id is None:
                m.id = message.id
            assert m.id == message.id
            if m.state == AVAILABLE:
                self.counters.redelivered += 1
            m.state, m.holder, m.expired = LEASED, worker, False
            m.count += 1
            m.owners.add(worker)
        for i in dead:
            self.messages[i].state, self.messages[i].forgotten = DEAD, False
            self.counters.dead_lettered += 1
        self.counters.popped += len(chosen)
        self.created = True
        if dead:
            self._write()  # with the dead letters' publish

    # --- rules -----------------------------------------------------------------------

    @initialize(n=st.integers(1, 4))
    def first_publish(self, n: int) -> None:
        self.publish(n)

    @rule(n=st.integers(1, 3))
    def publish(self, n: int) -> None:
        payloads = [b"m%d" % (len(self.messages) + k) for k in range(n)]
        self.client.publish(self.topic, payloads)
        self.messages.extend(_State(p) for p in payloads)
        self.pushed += n

    @rule(worker=st.sampled_from(WORKERS), n=st.integers(1, 4))
    def pop(self, worker: str, n: int) -> None:
        self._check_pop(worker, n, self.handles[worker].pop(n))

    @precondition(lambda self: any(self._popped(w) for w in WORKERS))
    @rule(worker=st.sampled_from(WORKERS), data=st.data())
    def pop_carrying_acks(self, worker: str, data: st.DataObject) -> None:
        mine = self._popped(worker) or self._known()
        acks = data.draw(st.lists(st.sampled_from(mine), min_size=1, max_size=3))
        n = data.draw(st.integers(1, 3))
        verdict = self._ack_verdict(worker, acks)
        handle = self.handles[worker]
        if verdict is not None:
            with pytest.raises(verdict):
                handle.pop(n, ack=self._ids(acks))
            return
        got = handle.pop(n, ack=self._ids(acks))
        self._do_ack(worker, acks)
        self._check_pop(worker, n, got)

    @precondition(lambda self: bool(self._known()))
    @rule(worker=st.sampled_from(WORKERS), data=st.data())
    def ack(self, worker: str, data: st.DataObject) -> None:
        # Any message read so far: held, held by another, acked already, dead.
        held = self._popped(worker) or self._known()
        pool = data.draw(st.sampled_from([held, self._known()]))
        acks = data.draw(st.lists(st.sampled_from(pool), min_size=1, max_size=3))
        verdict = self._ack_verdict(worker, acks)
        if verdict is not None:
            with pytest.raises(verdict):
                self.handles[worker].ack(self._ids(acks))
            return
        self.handles[worker].ack(self._ids(acks))
        self._do_ack(worker, acks)

    def _leased_to(self, worker: str) -> list[int]:
        return [i for i, m in enumerate(self.messages) if m.state == LEASED and m.holder == worker]

    @precondition(lambda self: any(self._leased_to(w) for w in WORKERS))
    @rule(
        worker=st.sampled_from(WORKERS),
        commit=st.booleans(),
        deferred=st.booleans(),
        data=st.data(),
    )
    def ack_in_transaction(
        self, worker: str, commit: bool, deferred: bool, data: st.DataObject
    ) -> None:
        held = self._leased_to(worker)
        if not held:
            return
        acks = data.draw(st.lists(st.sampled_from(held), min_size=1, max_size=3, unique=True))
        try:
            with self.client.transaction(defer_begin=deferred) as tx:
                self.handles[worker].ack(self._ids(acks), transaction=tx)
                if not commit:
                    raise _Aborted
        except _Aborted:
            # The application's own failure gives them back to the queue.
            for i in acks:
                m = self.messages[i]
                m.state, m.expired = AVAILABLE, False
            self.counters.nacked += len(acks) if deferred else 0
            self._write()
            return
        self._do_ack(worker, acks)

    @precondition(lambda self: any(self._leased_to(w) for w in WORKERS))
    @rule(worker=st.sampled_from(WORKERS), deferred=st.booleans(), data=st.data())
    def ack_in_transaction_refused(self, worker: str, deferred: bool, data: st.DataObject) -> None:
        held = self._leased_to(worker)
        others = [i for i in self._known() if self._ack_verdict(worker, [i]) is not None]
        if not held or not others:
            return
        acks = [data.draw(st.sampled_from(held)), data.draw(st.sampled_from(others))]
        # The server refuses the transaction: the worker keeps its leases as it held
        # them, and nothing else changes.
        with pytest.raises(TidingsError), self.client.transaction(defer_begin=deferred) as tx:
            self.handles[worker].ack(self._ids(acks), transaction=tx)

    @rule(worker=st.sampled_from(WORKERS))
    def release(self, worker: str) -> None:
        body = {"consumerId": self.handles[worker].consumer_id}
        url = f"{self.url}/v1/namespaces/default/topics/{self.topic}/queues/q/release"
        answer = self.http.post(url, json=body)
        if not self.created:
            assert answer.status_code == 404, answer.text
            return
        assert answer.status_code == 200, answer.text
        mine = self._leased_to(worker)
        assert answer.json() == {"released": len(mine)}
        for i in mine:
            self.messages[i].state = AVAILABLE
        if mine:
            self._write()

    @precondition(lambda self: bool(self._known()))
    @rule(worker=st.sampled_from(WORKERS), data=st.data())
    def nack(self, worker: str, data: st.DataObject) -> None:
        pool = self._popped(worker) or self._known()
        ids = data.draw(st.lists(st.sampled_from(pool), min_size=1, max_size=3))
        skipped = self.handles[worker].nack(self._ids(ids))
        expected: list[int] = []
        back = 0
        for i in dict.fromkeys(ids):
            m = self.messages[i]
            if m.state == LEASED and m.holder == worker:
                m.state, m.expired = AVAILABLE, False
                back += 1
            elif not (m.state == AVAILABLE and m.holder == worker):
                expected.append(i)
        self.counters.nacked += back
        assert skipped == self._ids(expected)
        if back:
            self._write()

    @precondition(lambda self: bool(self._known()))
    @rule(worker=st.sampled_from(WORKERS), data=st.data())
    def extend(self, worker: str, data: st.DataObject) -> None:
        pool = self._popped(worker) or self._known()
        ids = data.draw(st.lists(st.sampled_from(pool), min_size=1, max_size=3))
        skipped = self.handles[worker].extend(self._ids(ids), 600.0)
        expected: list[int] = []
        for i in dict.fromkeys(ids):
            m = self.messages[i]
            if m.holder == worker and (m.state == LEASED or (m.state == AVAILABLE and m.expired)):
                m.state, m.expired = LEASED, False  # its own again, not a delivery
            else:  # not its own, or given back to the queue
                expected.append(i)
        assert skipped == self._ids(expected)
        if len(expected) < len(dict.fromkeys(ids)):
            self._write()  # at once, so that the deadline holds after a restart

    @precondition(lambda self: self.created)
    @rule()
    def purge(self) -> None:
        purged = self.client.purge_queue(self.topic, "q")
        read = [m for m in self.messages if m.state in (AVAILABLE, LEASED)]
        assert purged == len(read)
        for m in self.messages:
            if m.state in (UNREAD, AVAILABLE, LEASED):
                m.state, m.expired = PURGED, False
        self._write()

    @rule(n=st.integers(1, 3))
    def lease_runs_out(self, n: int) -> None:
        self.pop(SHORT, n)
        time.sleep(SHORT_TIMEOUT * 1.5)
        for m in self.messages:
            if m.state == LEASED and m.holder == SHORT:
                m.state, m.expired = AVAILABLE, True
                self.counters.expired += 1

    # --- invariants ------------------------------------------------------------------

    @invariant()
    def nothing_lost_and_stats_agree(self) -> None:
        if not self.created:
            return
        stats = self.handles[WORKERS[0]].stats()
        states = [m.state for m in self.messages]
        leased: dict[str, int] = {}
        for m in self.messages:
            if m.state == LEASED:
                cid = self.handles[m.holder].consumer_id
                leased[cid] = leased.get(cid, 0) + 1
        # available + leased + acked + dead = published: the server's side of it.
        assert stats.pending == states.count(LEASED)
        assert stats.waiting == states.count(AVAILABLE) + states.count(UNREAD)
        assert stats.waiting_exact
        assert dict(stats.consumers) == leased
        assert stats.pushed == self.pushed
        if not self.restarted:  # (the counters count since the server started)
            # Every message published is in exactly one place.
            placed = stats.waiting + stats.pending + stats.acked + stats.dead_lettered
            assert placed + states.count(PURGED) == stats.pushed
        got = _Counters(
            stats.popped,
            stats.acked,
            stats.nacked,
            stats.redelivered,
            stats.dead_lettered,
            stats.expired,
        )
        assert got == self.counters

    @rule()
    def dead_letters_are_in_their_topic(self) -> None:
        dead = [m.payload for m in self.messages if m.state == DEAD]
        if not dead:
            return
        found = self.client.poll(self.topic + "-dlq", limit=1000)
        assert sorted(m.payload for m in found) == sorted(dead)


class QueueModelWithRestarts(QueueModel):
    """The model, and a rule that kills the server (kill -9) and starts it again."""

    server: ServerProcess | None = None

    @precondition(lambda self: any(m.state != UNREAD for m in self.messages))
    @rule()
    def server_killed_and_restarted(self) -> None:
        server = self.server
        assert server is not None
        self.client.close()
        server.kill()
        server.start()
        self._connect()
        # As the records say: leases written keep their workers (with the deadlines
        # they had), what was popped since the last write is handed out again (with
        # the counts recorded), and who acked what is forgotten.
        durable = {m.payload: m for m in self.durable}
        for m in self.messages:
            before = durable.get(m.payload)
            if before is None:
                m.state, m.count, m.holder, m.owners, m.expired = UNREAD, 0, "", set(), False
                continue
            m.state, m.count, m.holder, m.expired = (
                before.state, before.count, before.holder, before.expired,
            )  # fmt: skip
            if m.state == LEASED and m.holder == SHORT:
                # Written before its lease ran out: the record keeps its owner.
                m.state, m.expired, m.owners = AVAILABLE, True, {SHORT}
            elif m.state == LEASED:
                m.owners = {m.holder}
            elif m.state == AVAILABLE:
                m.owners, m.holder, m.expired = set(), "", False
            else:
                m.forgotten = m.state in (ACKED, DEAD)
                m.owners = set()
        # Counted since the server started: acks in a transaction that committed
        # before, whose record is still under its pointer, count no more.
        self.counters = _Counters()
        self.pushed = 0
        self.restarted = True

    @precondition(lambda self: any(self._leased_to(w) for w in WORKERS))
    @rule(worker=st.sampled_from(WORKERS), deferred=st.booleans(), data=st.data())
    def killed_after_a_commit(self, worker: str, deferred: bool, data: st.DataObject) -> None:
        # Before any other write: the acks' record is still under the pointer.
        self.ack_in_transaction(worker, True, deferred, data)
        self.server_killed_and_restarted()


def _examples() -> int:
    return int(os.environ.get("TIDINGS_QUEUE_MODEL_EXAMPLES", "12"))


def test_a_queue_behaves_as_its_model(server: ServerProcess) -> None:
    QueueModel.url = server.url
    run_state_machine_as_test(
        QueueModel,
        settings=settings(
            max_examples=_examples(),
            stateful_step_count=int(os.environ.get("TIDINGS_QUEUE_MODEL_STEPS", "25")),
            deadline=None,
            suppress_health_check=list(HealthCheck),
        ),
    )


def test_a_queue_behaves_as_its_model_across_kill_9(
    start_server: Callable[..., ServerProcess],
) -> None:
    QueueModelWithRestarts.server = server = start_server()
    QueueModelWithRestarts.url = server.url
    run_state_machine_as_test(
        QueueModelWithRestarts,
        settings=settings(
            max_examples=int(os.environ.get("TIDINGS_QUEUE_MODEL_RESTART_EXAMPLES", "3")),
            stateful_step_count=int(os.environ.get("TIDINGS_QUEUE_MODEL_STEPS", "25")),
            deadline=None,
            suppress_health_check=list(HealthCheck),
        ),
    )
