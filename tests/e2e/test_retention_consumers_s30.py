"""Retention while consumer groups and queues are behind or mid-flight, black box.

Plain tests first: a queue's depth leaves out returned messages retention deleted, an
ack of a leased message retention deleted is answered as done while its lease holds
and with a 409 that says why once the queue forgot it, and a group whose committed
positions lie below the oldest kept message resumes there, its lag counting only
kept messages.

Then a model (hypothesis' stateful testing) on a server whose cleaner runs every
0.2 s in batches of 3 rows: keyed publishes (plain, in one-request transactions, in
transactions left open for a while and then committed or aborted), a consumer group
of 4 partitions (members that poll, commit and leave; a member that drains the group
alone; resets), a queue (pops, plain and transactional acks, nacks, extensions, a
worker whose leases run out), waits that carry messages past the topic's TTL, and
kill -9 restarts. After each step: the group's lag (describe, topic stats,
``/metrics``) lies between what must and what may still be kept after its positions;
the queue's pending and waiting counts likewise, its counters exactly; a pop never
hands out a message retention deleted, acked, or leased to another worker; a drain
delivers every kept committed message after the group's positions, once, in order.

The model runs on LMDB and, briefly, on PostgreSQL (the session's shared server, whose
cleaner runs every minute: retention there is the reads' own work).
``RETENTION_MODEL_EXAMPLES`` and ``RETENTION_MODEL_STEPS`` run more (to hunt for bugs
locally).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass

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
from tidings import Client, Message, MessageId, Record
from tidings.client import GroupConsumer, Queue
from tidings.errors import AckConflict, NotDelivered, PartitionFenced
from tidings.structs import RollbackInfo, Transaction

pytestmark = pytest.mark.e2e

NS = "default"
#: Slack, in ms, around an expiry the model can only bound (accept time, clocks).
SLACK = 200
#: A group's members scan pages kept up to 10 s for all of them (docs/design.md): a
#: message may reach a group that long past its TTL.
PAGE_LIFETIME_MS = 10_000
PARTITIONS = 4
KEYS = [b"k%d" % i for i in range(6)]


def now_ms() -> int:
    return int(time.time() * 1000)


def metric(text: str, name: str, topic: str, **labels: str) -> float | None:
    """The value of ``name``'s series of ``topic`` (and ``labels``) in ``text``."""
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        wanted = {"namespace": NS, "topic": topic, **labels}
        found = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}")[0]))
        if all(found.get(k) == v for k, v in wanted.items()):
            return float(line.rsplit(" ", 1)[1])
    return None


def partition(key: bytes) -> int:
    return zlib.crc32(key) % PARTITIONS


# --- plain tests -----------------------------------------------------------------------


def test_queue_depth_leaves_out_returned_messages_past_retention(
    server: ServerProcess, topic: str
) -> None:
    # The leases ran out after retention deleted their messages: no pop hands them out
    # again, so the queue's depth must not count them (it did, until the next pop).
    with Client(server.url) as client, httpx.Client(base_url=server.url) as http:
        client.create_topic(topic, ttl=1)
        client.publish(topic, [b"old-0", b"old-1", b"old-2"])
        slow = client.queue(topic, "work", ack_timeout=0.2)
        assert len(slow.pop(3)) == 3
        time.sleep(1.3)
        client.publish(topic, [b"new-0", b"new-1"])
        stats = client.describe_queue(topic, "work")
        assert (stats.pending, stats.waiting, stats.waiting_exact) == (0, 2, True)
        text = http.get("/metrics").text
        assert metric(text, "tidings_queue_waiting", topic, queue="work") == 2
        again = client.queue(topic, "work").pop(10)
        assert [m.payload for m in again] == [b"new-0", b"new-1"]
        stats = client.describe_queue(topic, "work")
        assert (stats.pending, stats.waiting, stats.popped, stats.redelivered) == (2, 0, 5, 0)


def test_an_ack_of_a_message_retention_deleted(server: ServerProcess, topic: str) -> None:
    with Client(server.url) as client:
        client.create_topic(topic, ttl=3600)
        client.publish(topic, [Record(b"held", ttl=1), Record(b"lapsed", ttl=1)])
        holder = client.queue(topic, "work", ack_timeout=60)
        held = holder.pop(1)
        lapsing = client.queue(topic, "work", ack_timeout=0.2)
        lapsed = lapsing.pop(1)
        assert [m.payload for m in held + lapsed] == [b"held", b"lapsed"]
        time.sleep(1.3)
        # Deleted while its lease holds: the worker still holds it, and its ack is
        # answered as done.
        holder.ack(held)
        # Deleted after its lease ran out: the next pop forgets it (never delivered
        # again), and then its ack is refused with a reason that names retention.
        assert client.queue(topic, "work").pop(5) == []
        with pytest.raises(NotDelivered, match="past its retention") as refused:
            lapsing.ack(lapsed)
        assert refused.value.status == 409
        assert lapsed[0].id.hex in str(refused.value)
        assert lapsing.nack(lapsed) == [lapsed[0].id]
        assert client.queue(topic, "work").pop(5) == []
        stats = client.describe_queue(topic, "work")
        assert (stats.pending, stats.waiting, stats.acked, stats.popped) == (0, 0, 1, 2)


def test_a_group_behind_retention_resumes_at_the_oldest_kept_message(
    server: ServerProcess, topic: str
) -> None:
    # Kafka's auto.offset.reset applies to an offset retention deleted; here there is
    # no such case: a position is a place in the one order, and reading after it
    # starts at the oldest message kept (docs/api.md, "Consumer groups").
    with Client(server.url) as client, httpx.Client(base_url=server.url) as http:
        client.create_topic(topic, ttl=1)
        client.publish(topic, [Record(b"old-%d" % i, key=k) for i, k in enumerate(KEYS)])
        first = client.consume(
            topic, group="g", partitions=PARTITIONS, follow=False, wait=0, batch_size=2
        )
        assert isinstance(first, GroupConsumer)
        assert len(first.poll()) == 2
        first.commit()
        first.close()
        assert client.describe_group(topic, "g").lag == len(KEYS) - 2
        time.sleep(1.3)
        client.publish(topic, [Record(b"new-%d" % i, key=k) for i, k in enumerate(KEYS[:3])])
        info = client.describe_group(topic, "g")
        assert info.lag == 3 and all(p.lag_exact for p in info.partitions)
        assert client.stats(topic).group_lags == {"g": 3}
        assert metric(http.get("/metrics").text, "tidings_group_lag", topic, group="g") == 3
        again = client.consume(topic, group="g", follow=False, wait=0)
        got = [m.payload for m in again]
        again.close()
        assert sorted(got) == [b"new-0", b"new-1", b"new-2"]
        # A reset to a time before every kept message, or to a message retention
        # deleted, counts the kept ones.
        client.reset_group(topic, "g", 0)
        assert client.describe_group(topic, "g").lag == 3
        client.reset_group(topic, "g", MessageId(1, 0, 0, 0))
        assert client.describe_group(topic, "g").lag == 3


# --- the model -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cleaning_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A server of its own whose cleaner runs every 0.2 s in batches of 3 rows, so
    retention deletes while the model's consumers are behind."""
    data = tmp_path_factory.mktemp("retention-model") / "data"
    env = {"TIDINGS_CLEANUP_INTERVAL": "0.2", "TIDINGS_CLEANUP_BATCH": "3"}
    proc = ServerProcess(data, env=env).start()
    try:
        yield proc
    finally:
        proc.stop()


@dataclass
class Sent:
    payload: bytes
    key: bytes
    lo: int  # the client's clock before and after the request that wrote it
    hi: int
    status: str  # "committed", "open" or "aborted"
    id: MessageId | None = None
    # The queue's view: "unread", "leased", "returned", "acked" or "gone" (forgotten
    # by the queue: past retention, never delivered again).
    q: str = "unread"
    holder: str | None = None
    deadline_lo: int = 0
    deadline_hi: int = 0
    # A restart may have forgotten its lease (a pop writes nothing).
    unsure: bool = False
    # Past a TTL the topic had: the cleaner may have deleted it, or not yet (then a
    # longer TTL shows it again).
    maybe_gone: bool = False

    def expiry(self, ttl: int) -> tuple[int, int]:
        """The earliest and latest time (ms) it may stop being visible."""
        if self.id is not None:
            lo = hi = self.id.publish_ts + ttl * 1000
        else:
            lo, hi = self.lo + ttl * 1000, self.hi + ttl * 1000
        return (0 if self.maybe_gone else lo - SLACK), hi + SLACK

    @property
    def partition(self) -> int:
        return partition(self.key)


@dataclass
class OpenTx:
    tx: Transaction
    info: RollbackInfo
    sent: list[Sent]


WORKERS = {"a": 60.0, "b": 60.0, "x": 0.3}
#: Which of a worker's messages a rule takes (modulo how many it holds: what it holds
#: depends on the server's timing, which hypothesis must not see in its draws).
PICKS = st.lists(st.integers(0, 99), min_size=1, max_size=3)


class RetentionModel(RuleBasedStateMachine):
    server: ServerProcess
    #: Restarts and waits left for the whole test, across its runs (:func:`run_model`).
    restarts_left = 1
    waits_left = 2
    counter = itertools.count()

    def __init__(self) -> None:
        super().__init__()
        self.client = Client(self.server.url, timeout=15)
        self.http = httpx.Client(base_url=self.server.url, timeout=15)
        self.topic = f"rm-{next(self.counter)}-{now_ms() % 10**8}"
        self.ttl = 1
        self.sent: list[Sent] = []
        self.n = itertools.count()
        self.open: OpenTx | None = None
        self.members: list[GroupConsumer] = []
        self.workers: dict[str, Queue] = {}
        self.popped = 0  # the queue's deliveries since the server started
        self.queue_made = False
        self.group_made = False

    # --- helpers -----------------------------------------------------------------------

    def records(self, keys: list[int]) -> list[Sent]:
        lo = now_ms()
        out = []
        for k in keys:
            payload = f"{self.topic}/{next(self.n)}".encode()
            out.append(Sent(payload, KEYS[k], lo, lo, "committed"))
        return out

    @staticmethod
    def wire(sent: list[Sent]) -> list[Record]:
        return [Record(s.payload, key=s.key) for s in sent]

    def done(self, sent: list[Sent], status: str) -> None:
        hi = now_ms()
        for s in sent:
            s.hi, s.status = hi, status
        self.sent += sent

    def by_payload(self) -> dict[bytes, Sent]:
        return {s.payload: s for s in self.sent}

    def lso(self) -> MessageId | None:
        if self.open is None:
            return None
        firsts = [s.id for s in self.open.sent if s.id is not None]
        return min(firsts) if firsts else MessageId(0, 0, 0, 0)

    def must_see(self, s: Sent, lo: int, hi: int) -> bool:
        """Kept for sure between ``lo`` and ``hi``, read-committed, id known."""
        lso = self.lso()
        return (
            s.status == "committed"
            and s.id is not None
            and s.expiry(self.ttl)[0] > hi
            and (lso is None or s.id < lso)
        )

    def may_see(self, s: Sent, lo: int, slack: int = 0) -> bool:
        return s.status == "committed" and s.expiry(self.ttl)[1] + slack >= lo

    def learn_ids(self) -> None:
        """Every message's id from a full read (non-transactional: open ones too)."""
        known = self.by_payload()
        start: MessageId | None = None
        for _ in range(200):
            page = self.client.poll(self.topic, start, inclusive=start is None, limit=50)
            if not page:
                return
            for m in page:
                s = known.get(m.payload)
                assert s is not None, f"a message the model never sent: {m.payload!r}"
                assert m.key == s.key
                if s.id is None:
                    s.id = m.id
                assert s.id == m.id
            start = page[-1].id
        raise AssertionError("a full read did not end")

    def positions(self) -> dict[int, MessageId | None]:
        info = self.client.describe_group(self.topic, "g")
        return {p.partition: p.position for p in info.partitions}

    # --- rules: publishing -------------------------------------------------------------

    @initialize(ttl=st.sampled_from([1, 2]))
    def start(self, ttl: int) -> None:
        self.ttl = ttl
        self.client.create_topic(self.topic, ttl=ttl)

    keys = st.lists(st.integers(0, len(KEYS) - 1), min_size=1, max_size=4)

    @rule(keys=keys)
    def publish(self, keys: list[int]) -> None:
        sent = self.records(keys)
        self.client.publish(self.topic, self.wire(sent))
        self.done(sent, "committed")

    @rule(keys=keys)
    def one_request_transaction(self, keys: list[int]) -> None:
        sent = self.records(keys)
        self.client.publish_transaction({self.topic: self.wire(sent)})
        self.done(sent, "committed")

    @precondition(lambda self: self.open is None)
    @rule(keys=keys)
    def open_transaction(self, keys: list[int]) -> None:
        sent = self.records(keys)
        tx = self.client.begin(120)
        info = self.client.publish(self.topic, self.wire(sent), write_pointer=tx.write_pointer)
        self.done(sent, "open")
        self.open = OpenTx(tx, info, sent)

    @precondition(lambda self: self.open is not None)
    @rule(commit=st.booleans())
    def end_transaction(self, commit: bool) -> None:
        which = self.open
        assert which is not None
        if commit:
            self.client.commit(which.tx)
        else:
            self.client.rollback(self.topic, which.info)
            self.client.abort(which.tx)
        for s in which.sent:
            s.status = "committed" if commit else "aborted"
        self.open = None

    @rule()
    def wait_past_retention(self) -> None:
        # A budget, not a precondition: rules whose availability changed between runs
        # would look to hypothesis like a strategy depending on outside state.
        if RetentionModel.waits_left <= 0:
            return
        RetentionModel.waits_left -= 1
        time.sleep(min(self.ttl, 2) + 0.2)

    @rule(ttl=st.sampled_from([1, 2, 3]))
    def set_ttl(self, ttl: int) -> None:
        changed = now_ms()
        self.client.update_topic(self.topic, ttl=ttl)
        for s in self.sent:
            if s.expiry(self.ttl)[0] <= changed + SLACK:
                s.maybe_gone = True
        self.ttl = ttl

    # --- rules: the group --------------------------------------------------------------

    def member(self) -> GroupConsumer:
        consumer = self.client.consume(
            self.topic, group="g", partitions=PARTITIONS, follow=False, wait=0,
            session_timeout=30, batch_size=3,
        )  # fmt: skip
        assert isinstance(consumer, GroupConsumer)
        consumer.heartbeat()  # joins: the group exists from here on
        self.group_made = True
        return consumer

    @precondition(lambda self: len(self.members) < 2)
    @rule()
    def join(self) -> None:
        self.members.append(self.member())

    @precondition(lambda self: self.members)
    @rule(which=st.integers(0, 1))
    def member_poll(self, which: int) -> None:
        consumer = self.members[which % len(self.members)]
        before = self.positions()
        lo = now_ms()
        page = consumer.poll()
        self.check_delivered(page, before, lo)

    def check_delivered(
        self, page: list[Message], positions: dict[int, MessageId | None], lo: int
    ) -> None:
        known = self.by_payload()
        seen: set[bytes] = set()
        for m in page:
            s = known.get(m.payload)
            assert s is not None, f"delivered a message the model never sent: {m.payload!r}"
            assert m.payload not in seen, f"delivered twice in one page: {m.payload!r}"
            seen.add(m.payload)
            assert s.status == "committed", f"delivered a {s.status} message: {m.payload!r}"
            floor = positions.get(s.partition)
            assert floor is None or m.id > floor, "delivered at or below a committed position"
            assert self.may_see(s, lo, PAGE_LIFETIME_MS), f"long past retention: {m.payload!r}"

    @precondition(lambda self: self.members)
    @rule(which=st.integers(0, 1))
    def member_commit(self, which: int) -> None:
        consumer = self.members[which % len(self.members)]
        before = self.positions()
        # A rebalance it has not heard of yet refuses the commit of what it holds of a
        # partition that moved: nothing is committed then.
        with contextlib.suppress(PartitionFenced):
            consumer.commit()
        after = self.positions()
        for p, position in after.items():
            was = before[p]
            assert was is None or (position is not None and position >= was), (p, was, position)

    @precondition(lambda self: self.members)
    @rule(which=st.integers(0, 1))
    def leave(self, which: int) -> None:
        consumer = self.members[which % len(self.members)]
        self.members.remove(consumer)
        consumer.close()

    @precondition(lambda self: not self.members and self.group_made)
    @rule(to=st.sampled_from(["earliest", "latest", "time", "deleted"]))
    def reset(self, to: str) -> None:
        if to == "time":
            self.client.reset_group(self.topic, "g", now_ms() - 500)
        elif to == "deleted":
            self.client.reset_group(self.topic, "g", MessageId(1, 0, 0, 0))
        else:
            self.client.reset_group(self.topic, "g", to)
        positions = self.positions()
        assert len(set(positions.values())) == 1 and None not in positions.values()

    @precondition(lambda self: not self.members)
    @rule()
    def drain(self) -> None:
        """One member alone reads the group to the end: every kept committed message
        after the group's positions, each once, in order per partition."""
        self.learn_ids()
        before = self.positions() if self.group_made else dict.fromkeys(range(PARTITIONS))
        consumer = self.member()
        lo = now_ms()
        got: list[Message] = []
        try:
            for _ in range(40):
                page = consumer.poll()
                if not page:
                    break
                got += page
            else:
                raise AssertionError("a drain did not end")
            hi = now_ms()
            self.check_delivered(got, before, lo)
            payloads = [m.payload for m in got]
            assert len(set(payloads)) == len(payloads), "delivered twice"
            for p in range(PARTITIONS):
                ids = [m.id for m in got if partition(m.key or b"") == p]
                assert ids == sorted(ids), f"partition {p} out of order"
            owed = {
                s.payload
                for s in self.sent
                if self.must_see(s, lo, hi)
                and s.id is not None
                and (before[s.partition] is None or s.id > before[s.partition])  # type: ignore[operator]
            }
            missing = owed - set(payloads)
            assert not missing, f"{len(missing)} kept messages not delivered: {min(missing)!r}"
            consumer.commit()
        finally:
            consumer.close()
        after = self.positions()
        for p in range(PARTITIONS):
            mine = [m.id for m in got if partition(m.key or b"") == p]
            assert after[p] == (mine[-1] if mine else before[p]), (p, after[p], before[p])

    # --- rules: the queue --------------------------------------------------------------

    def worker(self, name: str) -> Queue:
        if name not in self.workers:
            self.workers[name] = self.client.queue(self.topic, "q", ack_timeout=WORKERS[name])
        self.queue_made = True
        return self.workers[name]

    def surely_held(self, s: Sent, name: str, at: int) -> bool:
        return s.q == "leased" and s.holder == name and not s.unsure and s.deadline_lo > at

    def maybe_held_by_other(self, s: Sent, name: str, at: int) -> bool:
        return s.q == "leased" and s.holder != name and s.deadline_hi + SLACK > at

    @rule(name=st.sampled_from(sorted(WORKERS)), n=st.integers(1, 8))
    def pop(self, name: str, n: int) -> None:
        q = self.worker(name)
        lo = now_ms()
        got = q.pop(n)
        hi = now_ms()
        known = self.by_payload()
        timeout = int(WORKERS[name] * 1000)
        for m in got:
            s = known.get(m.payload)
            assert s is not None, f"popped a message the model never sent: {m.payload!r}"
            assert s.status == "committed", f"popped a {s.status} message"
            assert s.q not in ("acked", "gone"), f"popped a message {s.q}: {m.payload!r}"
            if not s.unsure:
                assert not (s.q == "leased" and s.holder != name and s.deadline_lo > hi + 5), (
                    f"popped a message leased to {s.holder}"
                )
            assert self.may_see(s, lo), f"popped a message past retention: {m.payload!r}"
            if s.id is None:
                s.id = m.id
            s.q, s.holder, s.unsure = "leased", name, False
            s.deadline_lo, s.deadline_hi = lo + timeout, hi + timeout
        self.popped += len(got)
        if len(got) < n:
            # Nothing left to hand out: no kept message the queue surely has.
            lso = self.lso()
            for s in self.sent:
                available = s.q == "unread" and not s.unsure
                if (
                    available
                    and self.must_see(s, lo, hi)
                    and (lso is None or (s.id is not None and s.id < lso))
                ):
                    raise AssertionError(f"a short pop left a kept message: {s.payload!r}")

    def held(self, name: str) -> list[Sent]:
        return [s for s in self.sent if s.q == "leased" and s.holder == name and s.id]

    @precondition(lambda self: self.queue_made)
    @rule(
        name=st.sampled_from(sorted(WORKERS)),
        picks=PICKS,
        how=st.sampled_from(["plain", "commit", "abort"]),
    )
    def ack(self, name: str, picks: list[int], how: str) -> None:
        mine = self.held(name)
        if not mine:
            return
        chosen = list({id(mine[i % len(mine)]): mine[i % len(mine)] for i in picks}.values())
        ids = [s.id for s in chosen if s.id is not None]
        q = self.worker(name)
        try:
            if how == "plain":
                q.ack(ids)
            else:
                with contextlib.suppress(_Abort), self.client.transaction() as tx:
                    q.ack(ids, transaction=tx)
                    if how == "abort":
                        raise _Abort
        except (NotDelivered, AckConflict) as exc:
            hi = now_ms()
            for s in chosen:
                assert not self.surely_held(s, name, hi), f"an ack of a message held failed: {exc}"
            # Only where a restart may have forgotten a lease, or a lease may have run
            # out and retention deleted the message (the queue forgot it then).
            assert any(s.unsure or s.expiry(self.ttl)[0] < hi for s in chosen), exc
            for s in chosen:
                s.unsure = True  # who holds it now, the model cannot tell
            return
        if how == "abort":
            # Deferred acks of an aborted transaction were never sent: still the
            # worker's, or back in the queue where the client gave them back.
            for s in chosen:
                s.unsure = True
            return
        for s in chosen:
            s.q, s.holder = "acked", None

    @precondition(lambda self: self.queue_made)
    @rule(name=st.sampled_from(sorted(WORKERS)), picks=PICKS, extend=st.booleans())
    def give_back_or_extend(self, name: str, picks: list[int], extend: bool) -> None:
        mine = self.held(name)
        if not mine:
            return
        chosen = list({id(mine[i % len(mine)]): mine[i % len(mine)] for i in picks}.values())
        ids = [s.id for s in chosen if s.id is not None]
        q = self.worker(name)
        lo = now_ms()
        skipped = set(q.extend(ids, 60) if extend else q.nack(ids))
        hi = now_ms()
        for s in chosen:
            if s.id in skipped:
                assert not self.surely_held(s, name, hi), "skipped a message surely held"
                s.unsure = True
            elif extend:
                s.deadline_lo, s.deadline_hi = lo + 60_000, hi + 60_000
            else:
                s.q, s.holder = "returned", None

    # --- rules: restarts ---------------------------------------------------------------

    @rule()
    def restart(self) -> None:
        if RetentionModel.restarts_left <= 0:
            return  # (a budget, as for the waits)
        RetentionModel.restarts_left -= 1
        for consumer in self.members:
            with contextlib.suppress(Exception):
                consumer.close()
        self.members = []
        self.server.kill()
        self.server.start()
        # Counters are the process's own; leases popped since the queue's last write
        # are forgotten (handed out again at once).
        self.popped = 0
        for s in self.sent:
            if s.q == "leased":
                s.unsure = True

    # --- invariants --------------------------------------------------------------------

    @invariant()
    def counts_agree(self) -> None:
        if self.group_made or self.queue_made:
            self.learn_ids()
        if self.group_made:
            self.check_lag()
        if self.queue_made:
            self.check_queue()

    def check_lag(self) -> None:
        lo = now_ms()
        info = self.client.describe_group(self.topic, "g")
        stats = self.client.stats(self.topic)
        text = self.http.get("/metrics").text
        hi = now_ms()
        positions = {p.partition: p.position for p in info.partitions}
        must = may = 0
        for s in self.sent:
            floor = positions[s.partition]
            if s.id is not None and floor is not None and s.id <= floor:
                continue
            must += self.must_see(s, lo, hi)
            may += self.may_see(s, lo)
        for p in info.partitions:
            assert p.lag is not None and p.lag >= 0 and p.lag_exact, p
        lag = info.lag
        assert lag is not None and must <= lag <= may, (must, lag, may)
        assert must <= stats.group_lags["g"] <= may, (must, stats.group_lags, may)
        seen = metric(text, "tidings_group_lag", self.topic, group="g")
        assert seen is not None and must <= seen <= may, (must, seen, may)

    def check_queue(self) -> None:
        lo = now_ms()
        stats = self.client.describe_queue(self.topic, "q")
        text = self.http.get("/metrics").text
        hi = now_ms()
        lso = self.lso()
        sure_pending = maybe_pending = sure_waiting = maybe_waiting = 0
        for s in self.sent:
            if s.q in ("acked", "gone") or s.status != "committed":
                continue
            leased = s.q == "leased"
            held = leased and not s.unsure and s.deadline_lo > hi
            ran_out = leased and not s.unsure and s.deadline_hi + SLACK < lo
            sure_pending += held
            maybe_pending += leased and not ran_out
            if self.may_see(s, lo) and not held:
                maybe_waiting += 1
            # Surely kept, and surely the queue's to hand out: unread before the last
            # stable position, given back, or its lease surely ran out.
            kept = not s.unsure and s.id is not None and s.expiry(self.ttl)[0] > hi
            unread = s.q == "unread" and self.must_see(s, lo, hi) and (lso is None or s.id < lso)  # type: ignore[operator]
            if kept and (unread or s.q == "returned" or ran_out):
                sure_waiting += 1
        assert sure_pending <= stats.pending <= maybe_pending, (
            sure_pending, stats.pending, maybe_pending
        )  # fmt: skip
        assert stats.waiting_exact
        assert sure_waiting <= stats.waiting <= maybe_waiting, (
            sure_waiting, stats.waiting, maybe_waiting
        )  # fmt: skip
        seen = metric(text, "tidings_queue_waiting", self.topic, queue="q")
        assert seen is not None and sure_waiting <= seen <= maybe_waiting
        assert stats.popped == self.popped, (stats.popped, self.popped)

    def teardown(self) -> None:
        for consumer in self.members:
            with contextlib.suppress(Exception):
                consumer.close()
        for q in self.workers.values():
            with contextlib.suppress(Exception):
                q.close()
        if self.open is not None:
            with contextlib.suppress(Exception):
                self.client.invalidate(self.open.tx.write_pointer)
        with contextlib.suppress(Exception):
            self.client.delete_topic(self.topic)
        self.client.close()
        self.http.close()


class _Abort(Exception):
    """The application's own failure inside a transaction: it aborts."""


def run_model(server: ServerProcess, restarts: int, examples: str, steps: str) -> None:
    RetentionModel.server = server
    hunting = "RETENTION_MODEL_EXAMPLES" in os.environ
    runs = int(os.environ.get("RETENTION_MODEL_EXAMPLES", examples))
    # Restarts and waits cost seconds each: the suite's runs share a few.
    RetentionModel.restarts_left = restarts * runs if hunting else restarts
    RetentionModel.waits_left = 3 * runs if hunting else 2
    run_state_machine_as_test(  # type: ignore[no-untyped-call]
        RetentionModel,
        settings=settings(
            max_examples=runs,
            stateful_step_count=int(os.environ.get("RETENTION_MODEL_STEPS", steps)),
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        ),
    )


def test_retention_under_groups_and_queues_model(cleaning_server: ServerProcess) -> None:
    run_model(cleaning_server, 1, "3", "10")


def test_retention_under_groups_and_queues_model_postgres(pg_server: ServerProcess) -> None:
    # The session's shared server: no restarts, and its cleaner runs every minute, so
    # what retention hides there is the reads' own work. One short run: the groups'
    # and queues' code is the same on both stores.
    run_model(pg_server, 0, "1", "10")
