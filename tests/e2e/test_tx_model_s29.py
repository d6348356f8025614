"""A model-based run of transactions, read-committed visibility, fencing and idempotent
producers against the real server and the real sync client.

Hypothesis drives random sequences of begins (plain or under a transactional id),
transactional publishes to two topics (direct, or stored then published by pointer),
commits with change keys that sometimes overlap, aborts, invalidations,
re-registrations of transactional ids (fencing the older epoch), whole ``with
client.transaction()`` blocks (some with another transaction committing, or their id
registered again, inside), plain and idempotent publishes, reads with a transaction's
own snapshot, and readers from the start and from ``latest``. A model says which
transactions committed, aborted, were invalidated or fenced, or are still open, and
where each topic's entries lie; after the steps it checks that:

* a read-committed reader sees exactly the plain publishes and the committed
  transactions' messages, in publish order, up to the first entry of a transaction
  still open, never an aborted, invalid or fenced one's (fresh readers from the
  start, readers that follow from the start and from ``latest``, and polls), and one
  with a transaction's snapshot what had committed when it began, and its own writes;
* an earlier read is a prefix of every later one;
* the last stable position (topic stats, the topic's end and the poll answer's
  ``Tidings-Last-Stable-Id``) is the first entry of the oldest open transaction;
* every call on a transaction gets the answer docs/transactions.md's tables give:
  a conflicting commit ``TransactionConflict`` (and it stays open), a fenced
  producer's calls ``ProducerFenced``, calls on ended ones the 410 of how they ended;
* an idempotent producer's retried sequence writes nothing, a gap is refused with
  409 ``OutOfOrderSequence`` and writes nothing.

Each example uses fresh topics, transactional ids and producer ids on the session's
server. ``TIDINGS_TX_MODEL_EXAMPLES`` and ``TIDINGS_TX_MODEL_STEPS`` run more and longer
examples when hunting bugs, ``TIDINGS_TX_MODEL_SHRINK=1`` shrinks a failure found.
"""

from __future__ import annotations

import base64
import os
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field

import httpx
import pytest
from hypothesis import HealthCheck, Phase, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    invariant,
    rule,
    run_state_machine_as_test,
)

from tests.e2e.serverproc import ServerProcess
from tidings import Client
from tidings.client import Consumer
from tidings.client.txbuffer import DEFAULT_PAYLOAD_THRESHOLD
from tidings.errors import (
    OutOfOrderSequence,
    PayloadsAlreadyPublished,
    ProducerFenced,
    TidingsError,
    TransactionAborted,
    TransactionCommitted,
    TransactionConflict,
    TransactionInvalid,
    TransactionNotFound,
)
from tidings.structs import MessageId, ProducerInfo, RollbackInfo, Transaction

pytestmark = pytest.mark.e2e

OPEN, COMMITTED, ABORTED, INVALID, FENCED = "open", "committed", "aborted", "invalid", "fenced"
KEYS = (b"k0", b"k1", b"k2")
#: Long enough that no transaction times out during an example.
TX_TIMEOUT = 300.0
EXAMPLES = int(os.environ.get("TIDINGS_TX_MODEL_EXAMPLES", "15"))
STEPS = int(os.environ.get("TIDINGS_TX_MODEL_STEPS", "25"))
FOUND = (Phase.explicit, Phase.reuse, Phase.generate, Phase.target)

#: The error a call on a transaction that ended gets, by how it ended.
ENDED = {
    COMMITTED: TransactionCommitted,
    ABORTED: TransactionAborted,
    INVALID: TransactionInvalid,
    FENCED: TransactionInvalid,
}


class Boom(Exception):
    """The application's failure inside a transaction block."""


@dataclass(eq=False)
class Tx:
    """A transaction as the model knows it."""

    name: str
    tx: Transaction | None
    producer: ProducerInfo | None
    #: The model's clock when it began (for conflicts).
    begun: int
    status: str = OPEN
    #: What each transactional publish wrote (and how many messages), to roll it back
    #: before an abort.
    published: list[tuple[str, RollbackInfo, int]] = field(default_factory=list)
    #: Per topic, the index in the topic's log of its first entry there.
    first: dict[str, int] = field(default_factory=dict)
    #: Per topic, payloads stored under the write pointer and not published yet.
    stored: dict[str, list[bytes]] = field(default_factory=dict)
    #: Topics its stored payloads were published on (by pointer): no more there.
    sealed: set[str] = field(default_factory=set)
    #: How the transactions that had ended when it began ended (its snapshot).
    saw: dict[str, str] = field(default_factory=dict)

    @property
    def wp(self) -> int:
        assert self.tx is not None
        return self.tx.write_pointer


class ChangeKeys:
    """A participant of a client transaction that wrote ``keys`` (for conflicts)."""

    def __init__(self, keys: frozenset[bytes]) -> None:
        self.keys = keys

    def start(self, transaction: Transaction) -> None:
        del transaction

    def changes(self) -> Iterable[bytes]:
        return self.keys

    def commit(self) -> None:
        pass

    def post_commit(self) -> None:
        pass

    def rollback(self) -> None:
        pass


@dataclass(eq=False)
class Reader:
    """A read-committed consumer that follows a topic, and what it returned so far."""

    topic: str
    #: Index in the topic's log of where it started.
    start: int
    consumer: Consumer
    seen: list[bytes] = field(default_factory=list)


class TxModel(RuleBasedStateMachine):
    url: str = ""

    txs = Bundle("txs")

    def __init__(self) -> None:
        super().__init__()
        self.client = Client(self.url)
        self.http = httpx.Client(base_url=f"{self.url}/v1/namespaces/default", timeout=30)
        run = uuid.uuid4().hex[:10]
        self.topics = [f"m-{run}-a", f"m-{run}-b"]
        for topic in self.topics:
            self.client.create_topic(topic)
        #: Per topic: every entry in publish order, (payload, owner; None: plain).
        self.log: dict[str, list[tuple[bytes, Tx | None]]] = {t: [] for t in self.topics}
        self.all: list[Tx] = []
        self.clock = 0
        #: (clock at commit, change keys) of every commit.
        self.commits: list[tuple[int, frozenset[bytes]]] = []
        self.tids = [f"m-{run}-p0", f"m-{run}-p1"]
        #: Every epoch each transactional id was given, oldest first.
        self.epochs: dict[str, list[ProducerInfo]] = {t: [] for t in self.tids}
        self.producer_ids = [uuid.uuid4().hex, uuid.uuid4().hex]
        self.sequences: dict[tuple[str, str], int] = {}
        self.readers: list[Reader] = []
        self.earlier: dict[str, list[bytes]] = {t: [] for t in self.topics}
        self.payloads = 0

    # --- helpers ---

    def _payloads(self, n: int) -> list[bytes]:
        self.payloads += n
        return [f"p{i}".encode() for i in range(self.payloads - n, self.payloads)]

    def _tick(self) -> int:
        self.clock += 1
        return self.clock

    def _current(self, tid: str) -> ProducerInfo | None:
        return self.epochs[tid][-1] if self.epochs[tid] else None

    def _stale(self, tx: Tx) -> bool:
        return tx.producer is not None and self._current(tx.producer.transactional_id) != (
            tx.producer
        )

    def _creds(self, tx: Tx) -> dict[str, object]:
        if tx.producer is None:
            return {}
        return {"transactional_id": tx.producer.transactional_id, "epoch": tx.producer.epoch}

    def _conflicts(self, tx: Tx, changes: frozenset[bytes]) -> bool:
        return any(at > tx.begun and keys & changes for at, keys in self.commits)

    def _visible(self, topic: str, start: int = 0) -> list[bytes]:
        out: list[bytes] = []
        for payload, owner in self.log[topic][start:]:
            if owner is None or owner.status == COMMITTED:
                out.append(payload)
            elif owner.status == OPEN:
                break  # a read-committed reader stops at an open transaction's entry
        return out

    def _visible_to(self, reader: Tx, topic: str) -> list[bytes]:
        """What a poll with ``reader``'s snapshot returns."""
        out: list[bytes] = []
        for payload, owner in self.log[topic]:
            if owner is None or (owner is reader and owner.status != ABORTED):
                out.append(payload)
            elif owner.status == ABORTED:
                continue  # rolled back
            elif reader.saw.get(owner.name) == COMMITTED:
                out.append(payload)
            elif reader.saw.get(owner.name) not in (INVALID, FENCED):
                break  # open when it began, or begun after it: whatever it became since
        return out

    def _stable_index(self, topic: str) -> int | None:
        firsts = [tx.first[topic] for tx in self.all if tx.status == OPEN and topic in tx.first]
        return min(firsts, default=None)

    def _stable_id(self, topic: str) -> MessageId | None:
        index = self._stable_index(topic)
        if index is None:
            return None
        owner = self.log[topic][index][1]
        assert owner is not None
        for name, info, _ in owner.published:
            if name == topic:
                return MessageId(info.start_ts, info.start_seq)
        raise AssertionError("an open transaction's first entry has no publish")

    # --- transactions, step by step ---

    @rule(target=txs, tid=st.sampled_from([None, 0, 1]), topic=st.sampled_from([None, 0, 1]))
    def begin(self, tid: int | None, topic: int | None) -> Tx:
        producer = None
        if tid is not None:
            producer = self._current(self.tids[tid])
            if producer is None:
                producer = self.client.register_producer(self.tids[tid])
                self.epochs[self.tids[tid]].append(producer)
        tx = Tx(f"tx{len(self.all)}", None, producer, self._tick())
        tx.saw = {t.name: t.status for t in self.all if t.status != OPEN}
        tx.tx = self.client.begin(TX_TIMEOUT, **self._creds(tx))  # type: ignore[arg-type]
        self.all.append(tx)
        if topic is not None:
            self.publish_in(tx, topic, 1)
        return tx

    @rule(tid=st.sampled_from([0, 1]))
    def begin_with_a_fenced_epoch(self, tid: int) -> None:
        epochs = self.epochs[self.tids[tid]]
        if len(epochs) < 2:
            return
        before = self.client.transactions().last_write_pointer
        with pytest.raises(ProducerFenced):
            self.client.begin(TX_TIMEOUT, transactional_id=self.tids[tid], epoch=epochs[0].epoch)
        assert self.client.transactions().last_write_pointer == before

    @rule(tid=st.sampled_from([0, 1]))
    def register(self, tid: int) -> None:
        name = self.tids[tid]
        info = self.client.register_producer(name)
        old = self._current(name)
        if old is not None:
            assert (info.producer_id, info.epoch) == (old.producer_id, old.epoch + 1)
        self.epochs[name].append(info)
        for tx in self.all:
            if (
                tx.status == OPEN
                and tx.producer is not None
                and tx.producer.transactional_id == name
            ):
                tx.status = FENCED

    @rule(tx=txs, topic=st.sampled_from([0, 1]), n=st.integers(1, 3))
    def publish_in_rule(self, tx: Tx, topic: int, n: int) -> None:
        self.publish_in(tx, topic, n)

    def publish_in(self, tx: Tx, topic: int, n: int) -> None:
        name = self.topics[topic]
        payloads = self._payloads(n)
        if tx.status != OPEN:
            with pytest.raises(ENDED[tx.status]):
                self.client.publish(name, payloads, write_pointer=tx.wp)
            return
        info = self.client.publish(name, payloads, write_pointer=tx.wp)
        tx.published.append((name, info, n))
        tx.first.setdefault(name, len(self.log[name]))
        self.log[name].extend((p, tx) for p in payloads)

    @rule(tx=txs, topic=st.sampled_from([0, 1]), n=st.integers(1, 3))
    def store_in(self, tx: Tx, topic: int, n: int) -> None:
        name = self.topics[topic]
        payloads = self._payloads(n)
        # Sealed payloads answer 409 before anything looks at the transaction (docs/api.md).
        if name in tx.sealed:
            with pytest.raises(PayloadsAlreadyPublished):
                self.client.store(name, payloads, write_pointer=tx.wp)
            return
        if tx.status != OPEN:
            with pytest.raises(ENDED[tx.status]):
                self.client.store(name, payloads, write_pointer=tx.wp)
            return
        self.client.store(name, payloads, write_pointer=tx.wp)
        tx.stored.setdefault(name, []).extend(payloads)

    @rule(tx=txs, topic=st.sampled_from([0, 1]))
    def publish_stored(self, tx: Tx, topic: int) -> None:
        name = self.topics[topic]
        if name in tx.sealed:
            with pytest.raises(PayloadsAlreadyPublished):
                self.client.publish(name, [], write_pointer=tx.wp)
            return
        if tx.status != OPEN:
            with pytest.raises(ENDED[tx.status]):
                self.client.publish(name, [], write_pointer=tx.wp)
            return
        payloads = tx.stored.pop(name, [])
        if not payloads:
            return  # what a publish of nothing stored does is not this model's subject
        info = self.client.publish(name, [], write_pointer=tx.wp)
        tx.sealed.add(name)
        tx.published.append((name, info, 1))
        tx.first.setdefault(name, len(self.log[name]))
        self.log[name].extend((p, tx) for p in payloads)

    @rule(
        tx=txs,
        how=st.sampled_from(["commit", "commit", "abort", "invalidate"]),
        changes=st.sets(st.sampled_from(KEYS), max_size=2),
    )
    def end(self, tx: Tx, how: str, changes: set[bytes]) -> None:
        if how == "commit":
            self.commit(tx, changes)
        elif how == "abort":
            self.abort(tx)
        else:
            self.invalidate(tx)

    def commit(self, tx: Tx, changes: set[bytes]) -> None:
        keys = frozenset(changes)
        creds = self._creds(tx)
        if self._stale(tx):
            event("commit: fenced")
            with pytest.raises(ProducerFenced):
                self.client.commit(tx.wp, keys, **creds)  # type: ignore[arg-type]
            return
        if tx.status != OPEN:
            with pytest.raises(ENDED[tx.status]):
                self.client.commit(tx.wp, keys, **creds)  # type: ignore[arg-type]
            return
        if self._conflicts(tx, keys):
            event("commit: conflict")
            with pytest.raises(TransactionConflict):
                self.client.commit(tx.wp, keys, **creds)  # type: ignore[arg-type]
            return  # it stays open: the client rolls back and aborts
        self.client.commit(tx.wp, keys, **creds)  # type: ignore[arg-type]
        tx.status = COMMITTED
        self.commits.append((self._tick(), keys))

    def abort(self, tx: Tx) -> None:
        creds = self._creds(tx)
        if self._stale(tx):
            with pytest.raises(ProducerFenced):
                self.client.abort(tx.wp, **creds)  # type: ignore[arg-type]
            return
        if tx.status == COMMITTED:
            with pytest.raises(TransactionCommitted):
                self.client.abort(tx.wp, **creds)  # type: ignore[arg-type]
            return
        if tx.status == OPEN:
            # Tephra: the writes are rolled back before the abort.
            for topic, info, n in tx.published:
                assert self.client.rollback(topic, info) == n
            end = self.client.abort(tx.wp, **creds)  # type: ignore[arg-type]
            assert (end.outcome, end.already) == ("aborted", False)
            tx.status = ABORTED
            return
        end = self.client.abort(tx.wp, **creds)  # type: ignore[arg-type]
        outcome = "aborted" if tx.status == ABORTED else "invalidated"
        assert (end.outcome, end.already) == (outcome, True)

    def invalidate(self, tx: Tx) -> None:
        if tx.status in (COMMITTED, ABORTED):
            with pytest.raises(ENDED[tx.status]):
                self.client.invalidate(tx.wp)
            return
        end = self.client.invalidate(tx.wp)
        if tx.status == OPEN:
            assert (end.outcome, end.already) == ("invalidated", False)
            tx.status = INVALID
        else:
            outcome = "fenced" if tx.status == FENCED else "invalidated"
            assert (end.outcome, end.already) == (outcome, True)

    # --- whole transactions through the client's block ---

    @rule(
        topics=st.lists(st.sampled_from([0, 1]), min_size=1, max_size=3),
        fail=st.booleans(),
        tid=st.sampled_from([None, 0, 1]),
        stale=st.booleans(),
        defer=st.booleans(),
        stream=st.booleans(),
    )
    def transaction_block(
        self,
        topics: list[int],
        fail: bool,
        tid: int | None,
        stale: bool,
        defer: bool,
        stream: bool,
    ) -> None:
        producer = None
        fenced = False
        if tid is not None:
            epochs = self.epochs[self.tids[tid]]
            if not epochs:
                return
            producer = epochs[0] if stale else epochs[-1]
            fenced = producer != epochs[-1]
        batches = [(self.topics[t], self._payloads(1)) for t in topics]
        # ``stream``: every publish goes to the server at once (stored under the write
        # pointer), rather than held for the commit.
        ctx = self.client.transaction(
            producer=producer,
            timeout=TX_TIMEOUT,
            defer_begin=defer,
            payload_threshold=0 if stream else DEFAULT_PAYLOAD_THRESHOLD,
        )
        if fenced:
            with pytest.raises(ProducerFenced), ctx as tx:
                for topic, payloads in batches:
                    tx.publish(topic, payloads)
            return
        try:
            with ctx as tx:
                for topic, payloads in batches:
                    tx.publish(topic, payloads)
                if fail:
                    raise Boom
        except Boom:
            assert fail
            return
        owner = Tx(f"block{len(self.all)}", None, producer, self._tick(), COMMITTED)
        self.all.append(owner)
        self.commits.append((self._tick(), frozenset()))
        for topic, payloads in batches:
            self.log[topic].extend((p, owner) for p in payloads)

    @rule(
        topic=st.sampled_from([0, 1]),
        keys=st.sets(st.sampled_from(KEYS), min_size=1, max_size=2),
        other=txs,
        other_keys=st.sets(st.sampled_from(KEYS), min_size=1, max_size=2),
        tid=st.sampled_from([None, 0, 1]),
        fence=st.booleans(),
    )
    def transaction_block_interleaved(
        self,
        topic: int,
        keys: set[bytes],
        other: Tx,
        other_keys: set[bytes],
        tid: int | None,
        fence: bool,
    ) -> None:
        # A block with change keys (so step by step: begin, publish, commit) while
        # another transaction commits keys, or its transactional id is registered again.
        producer = None
        if tid is not None:
            producer = self._current(self.tids[tid])
            if producer is None:
                return
        name = self.topics[topic]
        payloads = self._payloads(2)
        block = Tx(f"block{len(self.all)}", None, producer, 0)
        conflict = fenced = False
        failure: BaseException | None = None
        try:
            with self.client.transaction(
                ChangeKeys(frozenset(keys)), producer=producer, timeout=TX_TIMEOUT
            ) as tx:
                block.tx = tx.transaction
                block.begun = self._tick()
                self.all.append(block)
                tx.publish(name, payloads)
                if other.status == OPEN and not self._stale(other):
                    before = len(self.commits)
                    self.commit(other, other_keys)
                    conflict = len(self.commits) > before and bool(keys & other_keys)
                if fence and producer is not None:
                    self.register(self.tids.index(producer.transactional_id))
                    fenced = True
        except TidingsError as exc:
            failure = exc
        if fenced:
            event(f"block: fenced, {type(failure).__name__}")
            # A zombie: it learns it is one, and nothing it wrote shows.
            assert isinstance(failure, ProducerFenced), failure
            assert block.status == FENCED
            return
        if conflict:
            event("block: conflict")
            assert isinstance(failure, TransactionConflict), failure
            # Its entries were written, then rolled back, and it aborted.
            block.status = ABORTED
            self.log[name].extend((p, block) for p in payloads)
            return
        assert failure is None, failure
        block.status = COMMITTED
        self.commits.append((self._tick(), frozenset(keys)))
        self.log[name].extend((p, block) for p in payloads)

    @rule(
        topic=st.sampled_from([0, 1]),
        call=st.sampled_from(["publish", "store", "commit", "abort", "invalidate"]),
    )
    def unknown_transaction(self, topic: int, call: str) -> None:
        # A write pointer never handed out: 404, and nothing is written or ended.
        name = self.topics[topic]
        wp = self.client.transactions().last_write_pointer + 10**9
        with pytest.raises(TransactionNotFound):
            if call == "publish":
                self.client.publish(name, self._payloads(1), write_pointer=wp)
            elif call == "store":
                self.client.store(name, self._payloads(1), write_pointer=wp)
            elif call == "commit":
                self.client.commit(wp)
            elif call == "abort":
                self.client.abort(wp)
            else:
                self.client.invalidate(wp)

    @rule(tx=txs, topic=st.sampled_from([0, 1]), producer=st.sampled_from(["ok", "bad"]))
    def idempotent_headers_in_a_transaction(self, tx: Tx, topic: int, producer: str) -> None:
        # The producer headers belong to a plain publish: with a write pointer they are
        # a 400, whatever the transaction's state, and nothing is written.
        name = self.topics[topic]
        [payload] = self._payloads(1)
        pid = self.producer_ids[0] if producer == "ok" else "not hex"
        answer = self.http.post(
            f"/topics/{name}/publish",
            json={
                "messages": [base64.b64encode(payload).decode()],
                "transactionWritePointer": tx.wp,
            },
            headers={"Tidings-Producer-Id": pid, "Tidings-Sequence": "0"},
        )
        assert answer.status_code == 400, answer.text
        assert "error" in answer.json()

    # --- outside transactions ---

    @rule(topic=st.sampled_from([0, 1]), n=st.integers(1, 3))
    def publish_plain(self, topic: int, n: int) -> None:
        name = self.topics[topic]
        payloads = self._payloads(n)
        self.client.publish(name, payloads)
        self.log[name].extend((p, None) for p in payloads)

    @rule(
        producer=st.sampled_from([0, 1]),
        topic=st.sampled_from([0, 1]),
        step=st.sampled_from([1, 1, 0, -1, 2]),
    )
    def publish_idempotent(self, producer: int, topic: int, step: int) -> None:
        # step: 1 the next sequence, 0 the last one again (a retry), -1 an older one,
        # 2 one past the next (a gap).
        pid, name = self.producer_ids[producer], self.topics[topic]
        last = self.sequences.get((pid, name))
        if last is None:
            if step != 1:
                return
            sequence = 5  # a producer the topic does not know may start anywhere
        else:
            sequence = max(last + step, 0)
        [payload] = self._payloads(1)
        answer = self.http.post(
            f"/topics/{name}/publish",
            json={"messages": [base64.b64encode(payload).decode()]},
            headers={"Tidings-Producer-Id": pid, "Tidings-Sequence": str(sequence)},
        )
        if last is not None and sequence > last + 1:
            assert answer.status_code == 409, answer.text
            assert answer.json()["type"] == OutOfOrderSequence.__name__
            return
        assert answer.status_code == 200, answer.text
        if last is None or sequence == last + 1:
            self.sequences[(pid, name)] = sequence
            self.log[name].append((payload, None))

    # --- reading ---

    @rule(tx=txs, topic=st.sampled_from([0, 1]))
    def read_in(self, tx: Tx, topic: int) -> None:
        # A transaction's own snapshot: its writes, and what had committed when it began.
        assert tx.tx is not None
        name = self.topics[topic]
        polled = self.client.poll(name, transaction=tx.tx, limit=10_000)
        assert [m.payload for m in polled] == self._visible_to(tx, name)

    @rule(topic=st.sampled_from([0, 1]), latest=st.booleans())
    def follow(self, topic: int, latest: bool) -> None:
        if len(self.readers) >= 4:
            return
        name = self.topics[topic]
        if latest:
            stable = self._stable_index(name)
            self._follow(name, "latest", len(self.log[name]) if stable is None else stable)
        else:
            self._follow(name, "earliest", 0)

    def _follow(self, topic: str, start: str, index: int) -> None:
        consumer = self.client.consume(topic, start, wait=0.0, batch_size=7)
        assert isinstance(consumer, Consumer)
        reader = Reader(topic, index, consumer)
        # "latest" is resolved at the first poll: now, where the model says it is.
        while page := consumer.poll():
            reader.seen.extend(m.payload for m in page)
        self.readers.append(reader)
        assert reader.seen == self._visible(topic, index)

    @invariant()
    def stable_position_and_committed_messages(self) -> None:
        for topic in self.topics:
            stable = self._stable_id(topic)
            event(f"invariant, stable position: {stable is not None}")
            assert self.client.end(topic).last_stable_id == stable
            polled = self.client.poll(topic, isolation="read_committed", limit=10_000)
            assert [m.payload for m in polled] == self._visible(topic)

    @rule()
    def check(self) -> None:
        for topic in self.topics:
            self._check_topic(topic)

    def _check_topic(self, topic: str) -> None:
        expected = self._visible(topic)
        everything = [p for p, _ in self.log[topic]]
        read = [m.payload for m in self.client.consume(topic, follow=False, batch_size=5)]
        assert read == expected
        polled = self.client.poll(topic, isolation="read_committed", limit=10_000)
        assert [m.payload for m in polled] == expected
        snapshot = self.client.snapshot()
        polled = self.client.poll(topic, transaction=snapshot, limit=10_000)
        assert [m.payload for m in polled] == expected
        # Read-uncommitted shows every entry, rolled back or not, in the one order.
        assert [m.payload for m in self.client.poll(topic, limit=10_000)] == everything
        assert read[: len(self.earlier[topic])] == self.earlier[topic]
        self.earlier[topic] = read
        stable = self._stable_id(topic)
        event(f"stable position: {stable is not None}")
        assert self.client.stats(topic).last_stable_id == stable
        end = self.client.end(topic)
        assert end.stable_known and end.last_stable_id == stable
        answer = self.http.post(
            f"/topics/{topic}/poll", params={"isolation": "read_committed"}, json={}
        )
        assert answer.status_code == 200
        header = answer.headers.get("Tidings-Last-Stable-Id")
        assert header == (None if stable is None else stable.hex)
        for reader in self.readers:
            if reader.topic == topic:
                while page := reader.consumer.poll():
                    reader.seen.extend(m.payload for m in page)
                assert reader.seen == self._visible(topic, reader.start)
                event(f"reader from {reader.start}: {len(reader.seen) > 0}")

    def teardown(self) -> None:
        try:
            self.check()
        finally:
            for reader in self.readers:
                reader.consumer.close()
            for tx in self.all:
                if tx.status == OPEN:
                    self.client.invalidate(tx.wp)
            for topic in self.topics:
                self.client.delete_topic(topic)
            self.http.close()
            self.client.close()


def test_an_aborted_transaction_leaves_the_last_stable_position(
    server: ServerProcess, topic: str
) -> None:
    # An aborted transaction counted as open until some later transaction committed:
    # the topic's stats, end and read-committed polls named its first (rolled back)
    # entry as the last stable position, and a reader starting at "latest" started
    # there, returning messages published before it started.
    with Client(server.url) as client:
        client.create_topic(topic)
        tx = client.begin()
        client.rollback(topic, client.publish(topic, b"aborted", write_pointer=tx.write_pointer))
        client.abort(tx)
        client.publish(topic, b"before")
        assert client.stats(topic).last_stable_id is None
        assert client.end(topic).last_stable_id is None
        answer = httpx.post(
            f"{server.url}/v1/namespaces/default/topics/{topic}/poll",
            params={"isolation": "read_committed"},
            json={},
        )
        assert "Tidings-Last-Stable-Id" not in answer.headers
        latest = client.consume(topic, "latest", wait=0.0)
        assert isinstance(latest, Consumer)
        assert latest.poll() == []
        client.publish(topic, b"after")
        assert [m.payload for m in latest.poll()] == [b"after"]
        latest.close()


def test_a_producer_fenced_during_its_transaction_gets_producer_fenced(
    server: ServerProcess, topic: str
) -> None:
    # A zombie whose transactional id was registered again while its transaction was
    # open got TransactionInvalid (its publish at commit was refused), with a note
    # that the transaction "becomes invalid when it times out", which it already was.
    with Client(server.url) as client:
        client.create_topic(topic)
        first = client.register_producer("zombie-" + topic)
        for participants in ((), (ChangeKeys(frozenset({b"k"})),)):
            with (
                pytest.raises(ProducerFenced) as raised,
                client.transaction(*participants, producer=first, defer_begin=False) as tx,
            ):
                tx.publish(topic, b"zombie")
                first = client.register_producer("zombie-" + topic)
            assert isinstance(raised.value.__cause__, TransactionInvalid)
            assert "times out" not in "".join(getattr(raised.value, "__notes__", []))
            assert tx.state == "aborted"
        assert client.poll(topic) == []


def test_transactions_follow_the_model(server: ServerProcess) -> None:
    TxModel.url = server.url
    run_state_machine_as_test(
        TxModel,
        settings=settings(
            max_examples=EXAMPLES,
            stateful_step_count=STEPS,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
            # Shrinking a failure takes minutes of requests: in the suite the failing
            # run is reported as found (with its seed); set the variable to shrink it.
            phases=(*FOUND, Phase.shrink) if os.environ.get("TIDINGS_TX_MODEL_SHRINK") else FOUND,
        ),
    )
