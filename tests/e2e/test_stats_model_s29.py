"""A model of one topic's lifecycle, retention and statistics, checked black box.

A state machine publishes (keyed or not, with a per-message TTL or not), publishes in
transactions that commit, abort or stay open, stores and publishes a write pointer,
deletes and re-creates the topic, changes its TTL and waits for expiry, against a real
server whose cleaner runs every 0.2 s. After each step the topic's stats must agree
with a full read of it (once the cleaner has caught up with what expired: stats count
an expired message until it is deleted, docs/design.md), both reads must hold exactly
what the model says (give or take a message expiring around the read), a consumer that
started at "latest" must get exactly what was committed after it started, and a topic
deleted and created again must be empty and new.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx
import pytest
from hypothesis import HealthCheck, Verbosity, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from tests.conftest import fresh_database
from tests.e2e.serverproc import LeadingServerProcess, ServerProcess
from tidings import Client, Message, MessageId, Record, TopicNotFound
from tidings.client import Consumer
from tidings.structs import PayloadRange, RollbackInfo, Transaction

pytestmark = pytest.mark.e2e

CLEANUP_INTERVAL = 0.2
#: How long stats may lag behind a read: a cleaner pass or two, on a busy machine.
SETTLE = 4.0
#: Slack, in ms, around an expiry the model can only bound (accept time, clocks).
SLACK = 150
NS = "default"


@pytest.fixture(scope="module", params=["lmdb", "postgres"])
def cleaning_server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    """A server of its own on each store in turn: its cleaner runs every 0.2 s, so
    expiry shows in stats within the test's patience. On PostgreSQL (skipped without
    it) a restarted server waits for the killed one's lease: a short one."""
    data = tmp_path_factory.mktemp("stats-model") / "data"
    # Small cleaner batches: a pass's deletions (and what they take off the counts)
    # then span several write transactions.
    env = {"TIDINGS_CLEANUP_INTERVAL": str(CLEANUP_INTERVAL), "TIDINGS_CLEANUP_BATCH": "3"}
    proc: ServerProcess
    if request.param == "lmdb":
        proc = ServerProcess(data, env=env)
    else:
        url = fresh_database(request.getfixturevalue("postgres_url"))
        proc = LeadingServerProcess(data, ["--store", url, "--lease-seconds", "1"], env)
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()


#: A message's payload size, whether it has a key, and its own TTL (seconds).
Draw = tuple[int, bool, int | None]


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass
class Sent:
    """One message the model published: what it is and when it may expire."""

    payload: bytes
    key: bytes | None
    ttl: int | None  # its own TTL, seconds
    sent_lo: int  # the client's clock before and after the request that wrote it
    sent_hi: int
    status: str  # "committed", "open", "aborted" (rolled back) or "invalid"
    tx: int | None = None
    id: MessageId | None = None  # once a read showed it
    # Past a TTL the topic had at some time: the cleaner may have deleted it, or not
    # yet (then a longer TTL shows it again).
    maybe_gone: bool = False

    def expiry(self, topic_ttl: int) -> tuple[int, int]:
        """The earliest and latest time (ms) it may stop being visible."""
        if self.id is not None:
            base = self.id.write_ts or self.id.publish_ts
            base = min(base, self.id.publish_ts)
            lo = hi = base + topic_ttl * 1000
        else:
            lo, hi = self.sent_lo + topic_ttl * 1000, self.sent_hi + topic_ttl * 1000
        if self.ttl is not None:
            lo = min(lo, self.sent_lo + self.ttl * 1000)
            hi = min(hi, self.sent_hi + self.ttl * 1000)
        return lo - SLACK, hi + SLACK


@dataclass
class OpenTx:
    tx: Transaction
    topic_generation: int
    rollbacks: list[RollbackInfo] = field(default_factory=list)
    sent: list[Sent] = field(default_factory=list)
    # The generation it published a write pointer on (stores then refused there).
    sealed: int | None = None
    # Stored and not published yet, and the generation they were stored on.
    pending: list[Sent] = field(default_factory=list)
    ranges: list[tuple[PayloadRange, list[Sent]]] = field(default_factory=list)
    pending_generation: int = 0


def full_read(client: Client, topic: str, committed: bool) -> list[Message]:
    """Every message a reader from the start gets now (bounded). Small pages, so
    that pages end inside a publish's batch entry and the next resumes there."""
    out: list[Message] = []
    start: MessageId | None = None
    for _ in range(1000):
        page = client.poll(
            topic,
            start,
            inclusive=start is None,
            limit=7,
            isolation="read_committed" if committed else None,
        )
        if not page:
            return out
        out += page
        start = page[-1].id
    raise AssertionError("a full read did not end")


def metric(text: str, name: str, topic: str) -> float | None:
    pattern = re.compile(
        rf'^{name}\{{[^}}]*namespace="{NS}"[^}}]*topic="{re.escape(topic)}"[^}}]*\}} (\S+)$',
        re.M,
    )
    found = pattern.search(text)
    return None if found is None else float(found.group(1))


def before(sent: Sent, lso: MessageId) -> bool:
    """Whether a read showed ``sent`` before the last stable position ``lso``."""
    return sent.id is not None and sent.id < lso


class TopicModel(RuleBasedStateMachine):
    """One topic per run, on a server shared by the runs."""

    server: ServerProcess
    max_restarts = 1  # per run
    counter = itertools.count()

    def __init__(self) -> None:
        super().__init__()
        self.client = Client(self.server.url, timeout=10)
        self.http = httpx.Client(base_url=self.server.url, timeout=10)
        self.topic = f"sm-{next(self.counter)}-{int(time.time() * 1000) % 10**8}"
        self.exists = False
        self.generation = 0
        self.topic_ttl = 604800
        self.sent: list[Sent] = []  # this generation's messages, in publish order
        self.open: list[OpenTx] = []
        self.n = itertools.count()
        self.consumer: Consumer | None = None
        self.before_consumer: set[bytes] = set()
        self.delivered: list[Message] = []
        self.published = 0  # messages and bytes since the topic was created
        self.published_bytes = 0
        self.has_group = False
        self.has_queue = False
        self.restarts = 0

    # --- helpers ---------------------------------------------------------------------

    def records(self, draw: list[Draw], lo: int) -> list[Sent]:
        out = []
        for size, keyed, ttl in draw:
            tag = f"{self.topic}/{self.generation}/{next(self.n)}/".encode()
            payload = (tag + b"x" * size)[: max(size, len(tag))]
            key = (b"k" + bytes([size % 3 + 48])) if keyed else None
            out.append(Sent(payload, key, ttl, lo, lo, "committed"))
        return out

    @staticmethod
    def wire(sent: list[Sent]) -> list[Record]:
        return [Record(s.payload, key=s.key, ttl=s.ttl) for s in sent]

    def done(self, sent: list[Sent], status: str, tx: int | None = None) -> None:
        hi = now_ms()
        for s in sent:
            s.sent_hi, s.status, s.tx = hi, status, tx
        self.published += len(sent)
        self.published_bytes += sum(len(s.payload) for s in sent)

    def create(self, ttl: int | None) -> None:
        meta = self.client.create_topic(self.topic, ttl=ttl)
        assert meta.generation > self.generation, (meta.generation, self.generation)
        assert meta.ttl == (ttl or 604800)
        self.generation = meta.generation
        self.topic_ttl = meta.ttl
        self.exists = True
        self.sent = []
        self.published = self.published_bytes = 0
        stats = self.client.stats(self.topic)
        assert (stats.message_count, stats.bytes, stats.oldest_id, stats.newest_id) == (
            0,
            0,
            None,
            None,
        )
        assert stats.last_stable_id is None
        assert dict(stats.group_lags) == {}
        assert self.client.groups(self.topic) == []
        assert self.client.queues(self.topic) == []
        assert full_read(self.client, self.topic, committed=False) == []
        self.has_group = self.has_queue = False

    # --- rules -----------------------------------------------------------------------

    @initialize(ttl=st.sampled_from([None, 2, 3600]))
    def start(self, ttl: int | None) -> None:
        self.create(ttl)

    sizes = st.lists(
        # A message's own TTL: mostly none; 3 s outlives a topic TTL of 1 or 2 s.
        st.tuples(st.integers(0, 300), st.booleans(), st.sampled_from([None] * 4 + [1, 3])),
        min_size=1,
        max_size=5,
    )

    @precondition(lambda self: self.exists)
    @rule(draw=sizes)
    def publish(self, draw: list[Draw]) -> None:
        sent = self.records(draw, now_ms())
        self.client.publish(self.topic, self.wire(sent))
        self.done(sent, "committed")
        self.sent += sent

    @precondition(lambda self: self.exists)
    @rule(draw=sizes, commit=st.booleans(), stored=st.booleans())
    def transaction(self, draw: list[Draw], commit: bool, stored: bool) -> None:
        sent = self.records(draw, now_ms())
        tx = self.client.begin(60)
        info = self.write_tx(tx, sent, stored)
        if commit:
            self.client.commit(tx)
            self.done(sent, "committed", tx.write_pointer)
        else:
            self.client.rollback(self.topic, info)
            self.client.abort(tx)
            self.done(sent, "aborted", tx.write_pointer)
        self.sent += sent

    def write_tx(self, tx: Transaction, sent: list[Sent], stored: bool) -> RollbackInfo:
        if stored:
            self.client.store(self.topic, self.wire(sent), write_pointer=tx.write_pointer)
            return self.client.publish(self.topic, [], write_pointer=tx.write_pointer)
        return self.client.publish(self.topic, self.wire(sent), write_pointer=tx.write_pointer)

    @precondition(lambda self: self.exists)
    @rule(draw=sizes)
    def one_request_transaction(self, draw: list[Draw]) -> None:
        sent = self.records(draw, now_ms())
        tx = self.client.publish_transaction({self.topic: self.wire(sent)})
        self.done(sent, "committed", tx.write_pointer)
        self.sent += sent

    @precondition(lambda self: self.exists and len(self.open) < 3)
    @rule(draw=sizes, stored=st.booleans())
    def open_transaction(self, draw: list[Draw], stored: bool) -> None:
        sent = self.records(draw, now_ms())
        tx = self.client.begin(60)
        info = self.write_tx(tx, sent, stored)
        self.done(sent, "open", tx.write_pointer)
        self.sent += sent
        self.open.append(OpenTx(tx, self.generation, [info], sent))
        if stored:
            self.open[-1].sealed = self.generation

    @precondition(lambda self: self.open and self.exists)
    @rule(data=st.data(), draw=sizes, stored=st.booleans())
    def extend_open_transaction(self, data: st.DataObject, draw: list[Draw], stored: bool) -> None:
        """More from a transaction still open, perhaps begun on an earlier generation of
        the topic (its messages there went with it)."""
        which = self.open[data.draw(st.integers(0, len(self.open) - 1))]
        stored = stored and which.sealed != self.generation
        sent = self.records(draw, now_ms())
        which.rollbacks.append(self.write_tx(which.tx, sent, stored))
        self.done(sent, "open", which.tx.write_pointer)
        if stored:
            sent = self.expose(which) + sent
        self.sent += sent
        which.sent += sent

    def expose(self, which: OpenTx) -> list[Sent]:
        """What a publish of ``which``'s write pointer (just made) shows of its earlier
        stores: those on this generation of the topic."""
        which.sealed = self.generation
        shown = [s for s in which.pending if which.pending_generation == self.generation]
        which.pending = []
        which.ranges = []
        for s in shown:
            s.status = "open"
        return shown

    @precondition(lambda self: self.exists and any(o.sealed != self.generation for o in self.open))
    @rule(data=st.data(), draw=sizes)
    def store_in_open_transaction(self, data: st.DataObject, draw: list[Draw]) -> None:
        """Payloads stored under a transaction's write pointer, shown by a later publish
        of it (a long transaction: its rows are older than its entry)."""
        unsealed = [o for o in self.open if o.sealed != self.generation]
        which = unsealed[data.draw(st.integers(0, len(unsealed) - 1))]
        sent = self.records(draw, now_ms())
        wp = which.tx.write_pointer
        stored = self.client.store(self.topic, self.wire(sent), write_pointer=wp)
        self.done(sent, "stored", wp)
        if which.pending_generation != self.generation:
            which.pending = []
            which.ranges = []
        which.pending += sent
        which.ranges.append((stored, sent))
        which.pending_generation = self.generation

    @precondition(lambda self: self.open)
    @rule(
        data=st.data(),
        how=st.sampled_from(["commit", "abort", "invalidate"]),
        ranged=st.booleans(),
    )
    def end_transaction(self, data: st.DataObject, how: str, ranged: bool) -> None:
        which = self.open.pop(data.draw(st.integers(0, len(self.open) - 1)))
        wp = which.tx.write_pointer
        if how == "commit":
            if which.pending and which.pending_generation == self.generation and self.exists:
                if ranged:
                    # Only every other store (a Spark job's committed task attempts):
                    # the rest are never shown, nor counted.
                    chosen = which.ranges[::2]
                    which.pending = [s for _, batch in chosen for s in batch]
                    info = self.client.publish(
                        self.topic, [], write_pointer=wp, payload_ranges=[r for r, _ in chosen]
                    )
                else:
                    info = self.client.publish(self.topic, [], write_pointer=wp)
                which.rollbacks.append(info)
                shown = self.expose(which)
                self.sent += shown
                which.sent += shown
            self.client.commit(which.tx)
            status = "committed"
        elif how == "abort":
            for info in which.rollbacks:
                try:
                    self.client.rollback(self.topic, info)
                except TopicNotFound:
                    assert not self.exists
            self.client.abort(which.tx)
            status = "aborted"
        else:
            self.client.invalidate(wp)
            status = "invalid"
        for s in which.sent:
            s.status = status

    @precondition(lambda self: self.exists and len(self.sent) > 0)
    @rule()
    def delete(self) -> None:
        self.client.delete_topic(self.topic)
        self.exists = False
        self.sent = []
        self.drop_consumer()
        with pytest.raises(TopicNotFound):
            self.client.stats(self.topic)
        with pytest.raises(TopicNotFound):
            self.client.poll(self.topic)
        assert self.http.get(f"/v1/namespaces/{NS}/topics/{self.topic}/stats").status_code == 404

    @precondition(lambda self: not self.exists)
    @rule(ttl=st.sampled_from([None, 2, 3600]))
    def recreate(self, ttl: int | None) -> None:
        self.create(ttl)

    @precondition(lambda self: self.exists)
    @rule(ttl=st.sampled_from([None, 1, 2, 3600]))
    def set_ttl(self, ttl: int | None) -> None:
        meta = self.client.update_topic(self.topic, ttl=ttl)
        assert meta.generation == self.generation
        changed = now_ms()
        for s in self.sent:
            if s.expiry(self.topic_ttl)[0] <= changed:
                s.maybe_gone = True
        self.topic_ttl = meta.ttl

    @precondition(lambda self: self.exists and (self.consumer is None or self.delivered))
    @rule()
    def start_consumer(self) -> None:
        self.drop_consumer()
        # What was committed before it started; the rest it must get. The consumer
        # finds "latest" at its first poll.
        self.consumer = self.client.consume(self.topic, "latest", follow=False, wait=0)
        first = self.consumer.poll()
        # Started at the last stable position, it also gets what was committed
        # before it started and lies after that position (as Kafka's consumers do).
        lso = self.lso()
        self.before_consumer = {
            s.payload
            for s in self.sent
            if s.status == "committed" and (lso is None or s.id is None or s.id < lso)
        }
        self.delivered = first

    def drop_consumer(self) -> None:
        if self.consumer is not None:
            self.consumer.close()
        self.consumer = None

    @precondition(lambda self: self.exists and not self.has_group)
    @rule()
    def make_group_and_queue(self) -> None:
        group = self.client.consume(self.topic, "earliest", group="g", follow=False, wait=0)
        try:
            group.poll()
            group.commit()
        finally:
            group.close()
        queue = self.client.queue(self.topic, "q")
        try:
            queue.pop(1)
        finally:
            queue.close()
        self.has_group = self.has_queue = True
        assert self.client.groups(self.topic) == ["g"]
        assert self.client.queues(self.topic) == [(self.topic, "q")]

    @precondition(lambda self: self.exists and any(s.ttl or self.topic_ttl < 5 for s in self.sent))
    @rule()
    def wait_for_expiry(self) -> None:
        time.sleep(1.2)

    @precondition(lambda self: self.restarts < self.max_restarts)
    @rule()
    def restart(self) -> None:
        """kill -9 and start again on the same data: the kept counts are durable with
        the data, so stats afterwards are what they were (and the invariants check them
        against a read)."""
        self.restarts += 1
        lo = now_ms()
        before = self.client.stats(self.topic) if self.exists else None
        self.server.kill()
        self.server.start()
        # Traffic counters are the process's own.
        self.published = self.published_bytes = 0
        if before is None:
            return  # the invariants check the generation a re-create gets
        after = self.client.stats(self.topic)
        _, may = self.expected(False, lo - int(SETTLE * 1000), now_ms())
        if not may:  # nothing expired around the restart, or lately
            assert (after.message_count, after.bytes, after.oldest_id, after.newest_id) == (
                before.message_count,
                before.bytes,
                before.oldest_id,
                before.newest_id,
            )

    # --- invariants --------------------------------------------------------------------

    def expected(self, committed: bool, lo: int, hi: int) -> tuple[set[bytes], set[bytes]]:
        """Payloads a read between ``lo`` and ``hi`` must show, and those it may."""
        must: set[bytes] = set()
        may: set[bytes] = set()
        for s in self.sent:
            if committed and s.status != "committed":
                continue
            gone_lo, gone_hi = s.expiry(self.topic_ttl)
            if s.maybe_gone and gone_hi >= lo:
                may.add(s.payload)
            elif gone_lo > hi:
                must.add(s.payload)
            elif gone_hi >= lo:
                may.add(s.payload)
        return must, may

    def check_read(self, read: list[Message], committed: bool, lo: int, hi: int) -> None:
        ids = [m.id for m in read]
        assert ids == sorted(ids) and len(set(ids)) == len(ids), ids
        by_payload = {s.payload: s for s in self.sent}
        got = [m.payload for m in read]
        unknown = [p for p in got if p not in by_payload]
        assert not unknown, f"messages not in this generation: {unknown[:3]}"
        for m in read:
            s = by_payload[m.payload]
            assert m.key == s.key, (m, s)
            if s.id is None:
                s.id = m.id
            assert s.id == m.id, (s, m)
        must, may = self.expected(committed, lo, hi)
        if committed:
            # A read-committed reader stops at the first message of a transaction
            # still open.
            lso = self.lso()
            if lso is not None:
                must = {p for p in must if before(by_payload[p], lso)}
                may |= {s.payload for s in self.sent if s.status == "committed"}
        missing = must - set(got)
        assert not missing, f"{len(missing)} messages missing from the read, e.g. {min(missing)!r}"
        extra = set(got) - must - may
        assert not extra, f"messages that must not show: {sorted(extra)[:3]}"

    def lso(self) -> MessageId | None:
        firsts = [
            s.id for s in self.sent if s.status == "open" and s.id is not None and s.tx is not None
        ]
        return min(firsts) if firsts else None

    @invariant()
    def reads_and_stats_agree(self) -> None:
        if not self.exists:
            return
        deadline = time.monotonic() + SETTLE
        while True:
            lo = now_ms()
            before = self.client.stats(self.topic)
            uncommitted = full_read(self.client, self.topic, committed=False)
            after = self.client.stats(self.topic)
            hi = now_ms()
            self.check_read(uncommitted, False, lo, hi)
            view = (
                len(uncommitted),
                sum(len(m.payload) for m in uncommitted),
                uncommitted[0].id if uncommitted else None,
                uncommitted[-1].id if uncommitted else None,
            )
            seen = [(s.message_count, s.bytes, s.oldest_id, s.newest_id) for s in (before, after)]
            if seen[0] == seen[1] == view:
                break
            assert time.monotonic() < deadline, f"stats {seen} never agreed with a read {view}"
            time.sleep(0.1)
        lso = self.lso()
        got = after.last_stable_id
        assert (got is None) == (lso is None), (got, lso)
        if got is not None and lso is not None:
            assert got[:2] == lso[:2], (got, lso)
        end = self.client.end(self.topic)
        assert end.newest_id == after.newest_id
        assert end.last_stable_id == got
        assert after.messages_published == self.published, (after, self.published)
        assert after.bytes_published == self.published_bytes
        fetches = self.client.stats(self.topic).fetches
        text = self.http.get("/metrics").text
        for name, want in (
            ("tidings_messages_published_total", self.published),
            ("tidings_bytes_published_total", self.published_bytes),
            # (A consumer may have a poll in flight, sent ahead.)
            ("tidings_fetches_total", fetches if self.consumer is None else None),
        ):
            if want is None:
                continue
            value = metric(text, name, self.topic)
            assert value == want or (value is None and want == 0), (name, value, want)

        lo = now_ms()
        committed = full_read(self.client, self.topic, committed=True)
        self.check_read(committed, True, lo, now_ms())

    @invariant()
    def latest_consumer_gets_what_committed_after_it(self) -> None:
        if self.consumer is None:
            return
        lo = now_ms()
        for _ in range(50):
            page = self.consumer.poll()
            if not page:
                break
            self.delivered += page
        hi = now_ms()
        by_payload = {s.payload: s for s in self.sent}
        got = [m.payload for m in self.delivered]
        assert len(set(got)) == len(got), "delivered twice"
        for p in got:
            assert p in by_payload and by_payload[p].status == "committed", p
            assert p not in self.before_consumer, f"committed before the consumer: {p!r}"
        must, _ = self.expected(True, lo, hi)
        lso = self.lso()
        owed = {p for p in must - self.before_consumer if lso is None or before(by_payload[p], lso)}
        missing = owed - set(got)
        assert not missing, f"{len(missing)} committed messages not delivered: {min(missing)!r}"

    def teardown(self) -> None:
        self.drop_consumer()
        for which in self.open:
            with contextlib.suppress(Exception):  # cleaning up after a failed run
                self.client.invalidate(which.tx.write_pointer)
        if self.exists:
            self.client.delete_topic(self.topic)
        self.client.close()
        self.http.close()


def test_topic_lifecycle_model(cleaning_server: ServerProcess) -> None:
    TopicModel.server = cleaning_server
    # A restarted server on PostgreSQL waits for its lease: seconds, so by default
    # restarts are the LMDB run's (the kept counts are the same code on both).
    default = "0" if isinstance(cleaning_server, LeadingServerProcess) else "1"
    TopicModel.max_restarts = int(os.environ.get("STATS_MODEL_RESTARTS", default))
    verbosity = Verbosity.verbose if os.environ.get("STATS_MODEL_VERBOSE") else Verbosity.normal
    # Small by default (the suite's time); raise the counts to hunt for bugs.
    run_state_machine_as_test(  # type: ignore[no-untyped-call]
        TopicModel,
        settings=settings(
            max_examples=int(os.environ.get("STATS_MODEL_EXAMPLES", "4")),
            stateful_step_count=int(os.environ.get("STATS_MODEL_STEPS", "10")),
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
            verbosity=verbosity,
        ),
    )
