"""Several instances on one PostgreSQL store under failovers, against a model.

Three ``tidings serve`` instances share one throwaway database with a short lease.
Worker threads, each with real sync clients, send random requests to random instances:
idempotent publishes, transactions in one request, transactions begun, published and
committed (or rolled back and aborted) in separate requests, consumer group commits,
queue pops and acks (plain, or in a transaction in one request), and reads. Meanwhile
the main thread kills the leader or a follower with SIGKILL, restarts killed
instances, and stops the leader with SIGSTOP for longer than its lease (it must then
write nothing more and exit with code 3).

Checked while running: a read from any instance shows every publish acknowledged
before it began, and every transaction acknowledged committed as committed; no
request is answered with a 500 other than ``OutcomeUnknown``; a leader stopped past
its lease acknowledges no publish sent to it meanwhile, and exits with code 3.
Checked once every instance runs again and one leads:

* every instance shows the same messages in the same order;
* every acknowledged publish is there exactly once, an idempotent publish whose
  outcome was unknown at most once, and nothing refused with an error that says
  nothing changed;
* transactions are all or nothing (over both topics), acknowledged commits are
  there, refused or aborted ones are not;
* acknowledged group positions are kept; acknowledged queue acks are never delivered
  again, acks in a transaction count if and only if it commits, and the queue loses
  no message.

The run is random: its seed is printed on failure (thread timing makes a replay
similar, not identical). ``TIDINGS_CLUSTER_SEED`` sets it; ``TIDINGS_CLUSTER_STEPS``
and ``TIDINGS_CLUSTER_WORKERS`` run more failovers and clients (to hunt for bugs
locally, e.g. 30 steps: about a minute a run).
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
import pytest

from tests.conftest import fresh_database
from tests.e2e.serverproc import ServerProcess, readiness
from tidings import Client, RetryPolicy
from tidings.codec.queue_bodies import TransactionAck
from tidings.errors import (
    LogFailed,
    OutcomeUnknown,
    RequestTimeout,
    ServerError,
    TidingsConnectionError,
    TidingsError,
    TransactionCommitted,
)
from tidings.structs import Message, MessageId

pytestmark = pytest.mark.e2e

LEASE = 1.5
NODES = 3
STEPS = int(os.environ.get("TIDINGS_CLUSTER_STEPS", "3"))
SEED = int(os.environ.get("TIDINGS_CLUSTER_SEED", str(random.randrange(1 << 30))))
WORKERS = int(os.environ.get("TIDINGS_CLUSTER_WORKERS", "2"))
#: Transactions begun by the workers time out by then, so that none is left open at
#: the end (an open one holds back what read-committed readers see).
TX_TIMEOUT = 4
ACK_TIMEOUT = 2.0
PATIENT = RetryPolicy(attempts=30, initial_backoff=0.05, max_backoff=0.3)
#: Errors that say the request may or may not have been carried out.
UNKNOWN = (OutcomeUnknown, TidingsConnectionError, RequestTimeout)

OK, REFUSED, MAYBE = "ok", "refused", "maybe"


@dataclass
class Tx:
    payloads: dict[str, list[bytes]]
    status: str = MAYBE
    write_pointer: int | None = None
    #: Queue acks it carries: they count if and only if it commits.
    acks: set[MessageId] = field(default_factory=set)


@dataclass
class Model:
    lock: threading.Lock = field(default_factory=threading.Lock)
    #: Idempotent publishes of topic "p": payload -> OK (acknowledged) or MAYBE.
    plain: dict[bytes, str] = field(default_factory=dict)
    txs: list[Tx] = field(default_factory=list)
    #: Partition -> the newest position an acknowledged group commit moved it to.
    positions: dict[int, MessageId] = field(default_factory=dict)
    acked: set[MessageId] = field(default_factory=set)
    #: Acks answered with an error after being sent more than once.
    maybe_acked: set[MessageId] = field(default_factory=set)
    surprises: list[str] = field(default_factory=list)

    def surprise(self, what: str) -> None:
        with self.lock:
            self.surprises.append(what)


class Cluster:
    def __init__(self, root: Path, url: str) -> None:
        self.url = url
        self.nodes = [
            ServerProcess(root / f"node{n}", ["--store", url, "--lease-seconds", str(LEASE)])
            for n in range(NODES)
        ]
        self.codes: list[tuple[int, int]] = []

    def alive(self) -> list[int]:
        return [n for n, p in enumerate(self.nodes) if p.proc is not None and p.proc.poll() is None]

    def dead(self) -> list[int]:
        return [n for n in range(NODES) if n not in self.alive()]

    def leader(self) -> int | None:
        for n in self.alive():
            if readiness(self.nodes[n]) == "ready":
                return n
        return None

    def start(self, n: int) -> None:
        proc = self.nodes[n]
        if proc.proc is not None and proc.proc.returncode is not None:
            self.codes.append((n, proc.proc.returncode))
        proc.start()

    def settle(self, timeout: float = 30.0) -> int:
        """Every instance running, one leading and the others forwarding to it."""
        for n in self.dead():
            self.start(n)
        deadline = time.monotonic() + timeout
        while True:
            states = [readiness(p) for p in self.nodes]
            if states.count("ready") == 1 and states.count("forwarding") == NODES - 1:
                return states.index("ready")
            assert time.monotonic() < deadline, states
            for n in self.dead():
                self.start(n)
            time.sleep(0.05)

    def epoch(self) -> int:
        with psycopg.connect(self.url) as conn:
            row = conn.execute("SELECT epoch FROM tidings_leases WHERE name = 'leader'").fetchone()
        return int(row[0]) if row else 0


def _messages(client: Client, topic: str) -> list[Message]:
    """Every committed message of ``topic``, read page after page."""
    out: list[Message] = []
    start: MessageId | None = None
    for _ in range(1000):
        page = client.poll(
            topic, start, inclusive=start is None, limit=5000, isolation="read_committed"
        )
        if not page:
            return out
        out += page
        start = page[-1].id
    raise AssertionError("too many pages")


def _payloads(client: Client, topic: str) -> list[bytes]:
    return [m.payload for m in _messages(client, topic)]


class Worker:
    def __init__(self, cluster: Cluster, model: Model, n: int, rng: random.Random) -> None:
        self.cluster, self.model, self.n, self.rng = cluster, model, n, rng
        self.clients = [Client(p.url, timeout=5.0, retry=PATIENT) for p in cluster.nodes]
        self.count = 0
        self.queue_id = f"w{n}"

    def client(self) -> Client:
        return self.rng.choice(self.clients)

    def tag(self) -> str:
        self.count += 1
        return f"w{self.n}-{self.count}"

    def error(self, what: str, exc: BaseException) -> None:
        """An error that is neither 'nothing changed' nor 'outcome unknown'. A
        ``LogFailed`` is a storage failure the instance stops on (PostgreSQL cut the
        writer's session, which a short lease's idle timeout does to a starved
        process): its calls are treated as of unknown outcome."""
        if isinstance(exc, ServerError) and not isinstance(exc, OutcomeUnknown | LogFailed):
            self.model.surprise(f"{what}: a 500 that is not OutcomeUnknown: {exc!r}")

    def run(self, stop: threading.Event) -> None:
        ops = [self.publish, self.one_request, self.transaction, self.group, self.queue]
        ops += [self.read]
        try:
            while not stop.is_set():
                self.rng.choice(ops)()
        finally:
            for client in self.clients:
                client.close()

    def publish(self) -> None:
        tag = self.tag()
        batch = [f"{tag}.{i}".encode() for i in range(self.rng.randint(1, 5))]
        with self.model.lock:
            for p in batch:
                self.model.plain[p] = MAYBE
        try:
            self.client().publish("p", batch)
        except TidingsError as exc:
            self.error(f"publish {tag}", exc)
            return
        with self.model.lock:
            for p in batch:
                self.model.plain[p] = OK

    def one_request(self) -> None:
        tag = self.tag()
        tx = Tx({t: [f"{tag}.{t}{i}".encode() for i in range(2)] for t in ("a", "b")})
        with self.model.lock:
            self.model.txs.append(tx)
        try:
            done = self.client().publish_transaction(dict(tx.payloads), timeout=TX_TIMEOUT)
        except UNKNOWN:
            return
        except TidingsError as exc:
            self.error(f"one-request {tag}", exc)
            tx.status = MAYBE if isinstance(exc, ServerError) else REFUSED
            return
        tx.write_pointer = done.write_pointer
        tx.status = OK

    def transaction(self) -> None:
        tag = self.tag()
        tx = Tx({t: [f"{tag}.{t}{i}".encode() for i in range(2)] for t in ("a", "b")})
        with self.model.lock:
            self.model.txs.append(tx)
        try:
            begun = self.client().begin(TX_TIMEOUT)
        except TidingsError as exc:
            # Nothing was published under it: whatever became of it, nothing shows.
            self.error(f"begin {tag}", exc)
            tx.status = REFUSED
            return
        wp = tx.write_pointer = begun.write_pointer
        undo = []
        try:
            for topic, payloads in tx.payloads.items():
                undo.append((topic, self.client().publish(topic, payloads, write_pointer=wp)))
            if self.rng.random() < 0.25:
                for topic, info in undo:
                    self.client().rollback(topic, info)
                self.client().abort(wp)
                tx.status = REFUSED
                return
        except TidingsError as exc:
            self.error(f"transaction {tag}", exc)
            self._invalidate(tx)
            return
        try:
            self.client().commit(wp)
        except UNKNOWN:
            self._invalidate(tx)
            return
        except TidingsError as exc:
            self.error(f"commit {tag}", exc)
            if isinstance(exc, ServerError):
                self._invalidate(tx)
            else:
                tx.status = REFUSED
            return
        tx.status = OK

    def _invalidate(self, tx: Tx) -> None:
        """Settle a transaction whose outcome is not known: invalid, or committed."""
        assert tx.write_pointer is not None
        try:
            self.client().invalidate(tx.write_pointer)
        except TransactionCommitted:
            tx.status = OK
        except TidingsError:
            pass  # it times out, unless it committed
        else:
            tx.status = REFUSED

    def group(self) -> None:
        tag = self.tag()
        client = self.client()
        try:
            with client.consume(
                "p", group="g", follow=False, session_timeout=2.0, batch_size=20
            ) as consumer:
                for _ in range(self.rng.randint(1, 30)):
                    if next(consumer, None) is None:
                        break
                positions = dict(consumer._returned)
                consumer.commit()
                with self.model.lock:
                    for partition, position in positions.items():
                        old = self.model.positions.get(partition)
                        if old is None or position > old:
                            self.model.positions[partition] = position
        except TidingsError as exc:
            self.error(f"group {tag}", exc)

    def queue(self) -> None:
        tag = self.tag()
        try:
            with self.client().queue("p", "q", ack_timeout=ACK_TIMEOUT) as handle:
                popped = handle.pop(self.rng.randint(1, 10))
                if not popped:
                    return
                seen = [m.id for m in popped]
                with self.model.lock:
                    again = set(seen) & self.model.acked
                if again:
                    self.model.surprise(f"queue {tag}: acked messages delivered again: {again}")
                if self.rng.random() < 0.4:
                    self._ack_in_transaction(handle.consumer_id, seen)
                    return
                try:
                    handle.ack(popped)
                except TidingsError:
                    with self.model.lock:  # resent after a lost answer, it may have counted
                        self.model.maybe_acked.update(seen)
                    raise
                with self.model.lock:
                    self.model.acked.update(seen)
        except TidingsError as exc:
            self.error(f"queue {tag}", exc)

    def _ack_in_transaction(self, consumer: str, seen: list[MessageId]) -> None:
        """Ack in a transaction in one request: the acks count if and only if it
        commits (refused: the messages come back to the queue)."""
        tag = self.tag()
        tx = Tx({"a": [f"{tag}.q".encode()]}, acks=set(seen))
        with self.model.lock:
            self.model.txs.append(tx)
        acks = [TransactionAck("p", "q", consumer, seen)]
        try:
            done = self.client().publish_transaction(dict(tx.payloads), acks=acks)
        except UNKNOWN:
            with self.model.lock:
                self.model.maybe_acked.update(seen)
            return
        except TidingsError as exc:
            self.error(f"acks in a transaction {tag}", exc)
            tx.status = MAYBE if isinstance(exc, ServerError) else REFUSED
            if tx.status == MAYBE:
                with self.model.lock:
                    self.model.maybe_acked.update(seen)
            return
        tx.write_pointer = done.write_pointer
        tx.status = OK
        with self.model.lock:
            self.model.acked.update(seen)

    def read(self) -> None:
        """Read from any instance: everything acknowledged before the read began is
        there, and the transactions acknowledged committed show as such."""
        client = self.client()
        with self.model.lock:
            before = {p for p, state in self.model.plain.items() if state == OK}
            committed = {tx.write_pointer for tx in self.model.txs if tx.status == OK}
        try:
            if self.rng.random() < 0.5:
                state = client.transactions()
                stale = {wp for wp in committed if wp is not None and wp > state.last_write_pointer}
                stale |= committed & (set(state.in_progress) | set(state.invalid))
                if stale:
                    self.model.surprise(f"{client.url} shows committed ones open: {stale}")
                return
            seen = set(_payloads(client, "p"))
        except TidingsError as exc:
            self.error("read", exc)
            return
        lost = sorted(before - seen)
        if lost:
            self.model.surprise(f"a read at {client.url} missed {lost[:5]}")


def _chaos(cluster: Cluster, rng: random.Random, model: Model) -> None:
    alive = cluster.alive()
    leader = cluster.leader()
    dead = cluster.dead()
    choices = ["restart"] if dead else []
    if len(alive) >= 2:
        choices += ["kill-follower", "kill-leader", "pause-leader"] if leader is not None else []
    if not choices:
        time.sleep(0.5)
        return
    step = rng.choice(choices)
    print(f"chaos: {step} (alive {alive}, leader {leader})", flush=True)
    if step == "restart":
        cluster.start(rng.choice(dead))
    elif step == "kill-follower":
        assert leader is not None
        cluster.nodes[rng.choice([n for n in alive if n != leader])].kill()
    elif step == "kill-leader":
        assert leader is not None
        cluster.nodes[leader].kill()
    else:
        assert leader is not None
        _pause(cluster, leader, model)


def _pause(cluster: Cluster, leader: int, model: Model) -> None:
    """SIGSTOP the leader past its lease, with a publish sent to it meanwhile."""
    node = cluster.nodes[leader]
    assert node.proc is not None
    epoch = cluster.epoch()
    node.proc.send_signal(signal.SIGSTOP)
    late: list[str] = []
    payload = f"late-{uuid.uuid4().hex[:8]}".encode()
    with model.lock:
        model.plain[payload] = MAYBE

    def publish_late() -> None:
        try:
            with Client(node.url, timeout=15.0, retry=RetryPolicy(attempts=1)) as client:
                client.publish("p", payload)
            late.append(OK)
        except TidingsError as exc:
            late.append(repr(exc))

    thread = threading.Thread(target=publish_late)
    thread.start()
    try:
        deadline = time.monotonic() + LEASE * 2 + 5
        while cluster.epoch() == epoch and time.monotonic() < deadline:
            time.sleep(0.1)
        took_over = cluster.epoch() != epoch
    finally:
        node.proc.send_signal(signal.SIGCONT)
    thread.join(20)
    if not took_over:
        return
    if late and late[0] == OK:
        model.surprise(f"a leader paused past its lease acknowledged a publish: {payload!r}")
    try:
        code = node.proc.wait(LEASE + 15)
    except Exception:
        model.surprise("a leader paused past its lease did not stop")
        node.kill()
        return
    if code != 3:
        model.surprise(f"a leader paused past its lease exited with {code}, not 3")


@pytest.fixture
def cluster(tmp_path: Path, postgres_url: str) -> Iterator[Cluster]:
    made = Cluster(tmp_path, fresh_database(postgres_url))
    try:
        yield made
    finally:
        for node in made.nodes:
            if node.proc is not None and node.proc.poll() is None:
                node.proc.send_signal(signal.SIGCONT)
            node.kill()


def test_failovers_keep_every_acknowledged_write(cluster: Cluster) -> None:
    rng = random.Random(SEED)
    model = Model()
    for n in range(NODES):
        cluster.start(n)
    cluster.settle()
    with Client(cluster.nodes[0].url, retry=PATIENT) as client:
        for topic in ("a", "b", "p"):
            client.create_topic(topic)
    stop = threading.Event()
    workers = [Worker(cluster, model, n, random.Random(rng.random())) for n in range(WORKERS)]
    threads = [threading.Thread(target=w.run, args=(stop,)) for w in workers]
    for thread in threads:
        thread.start()
    try:
        for _ in range(STEPS):
            time.sleep(rng.uniform(0.3, 1.2))
            _chaos(cluster, rng, model)
        time.sleep(0.5)
    finally:
        stop.set()
        for thread in threads:
            thread.join(60)
    assert not any(t.is_alive() for t in threads), "a worker did not stop"
    leader = cluster.settle()
    print(
        f"seed {SEED}: {len(model.plain)} published, {len(model.txs)} transactions "
        f"({Counter(tx.status for tx in model.txs)}), {len(model.acked)} acked, "
        f"positions {len(model.positions)}, exits {cluster.codes}",
        flush=True,
    )
    _check(cluster, model, leader)


def _check(cluster: Cluster, model: Model, leader: int) -> None:
    info = f"seed {SEED}; exits {cluster.codes}"
    assert not model.surprises, f"{info}: {model.surprises}"
    # 3: lost the lease; 1: stopped after its transaction log failed.
    assert all(code in (1, 3, -signal.SIGKILL) for _, code in cluster.codes), info
    # Transactions left open time out; none may hold back what readers see.
    with Client(cluster.nodes[leader].url, retry=PATIENT) as client:
        deadline = time.monotonic() + TX_TIMEOUT + 10
        ours = {tx.write_pointer for tx in model.txs if tx.write_pointer}
        while ours & set(client.transactions().in_progress):
            assert time.monotonic() < deadline, info
            time.sleep(0.2)
    seen: dict[str, list[bytes]] | None = None
    for node in cluster.nodes:
        with Client(node.url, retry=PATIENT) as client:
            here = {t: _payloads(client, t) for t in ("a", "b", "p")}
        if seen is None:
            seen = here
        assert here == seen, f"{info}: {node.url} shows other messages than another instance"
    assert seen is not None
    plain = Counter(seen["p"])
    assert all(n == 1 for n in plain.values()), f"{info}: written twice: {plain.most_common(3)}"
    missing = [p for p, state in model.plain.items() if state == OK and p not in plain]
    assert not missing, f"{info}: acknowledged publishes lost: {missing[:5]}"
    stray = [p for p in plain if p not in model.plain]
    batches: dict[bytes, list[bool]] = {}
    for p in model.plain:
        batches.setdefault(p.rsplit(b".", 1)[0], []).append(p in plain)
    torn = [tag for tag, there in batches.items() if any(there) and not all(there)]
    assert not torn, f"{info}: publishes partly written: {torn[:5]}"
    assert not stray, f"{info}: messages nobody published: {stray[:5]}"
    shown = Counter(seen["a"] + seen["b"])
    assert all(n == 1 for n in shown.values()), f"{info}: {shown.most_common(3)}"
    for tx in model.txs:
        there = [p for payloads in tx.payloads.values() for p in payloads if p in shown]
        whole = sum(len(v) for v in tx.payloads.values())
        what = f"{info}: transaction {tx}"
        assert len(there) in (0, whole), f"{what} is partly visible: {there}"
        if tx.status == OK:
            assert len(there) == whole, f"{what} was acknowledged but is not there"
        elif tx.status == REFUSED:
            assert not there, f"{what} was refused but is there"
    known = {p for tx in model.txs for v in tx.payloads.values() for p in v}
    assert not set(shown) - known, f"{info}: messages nobody published"
    with Client(cluster.nodes[leader].url, retry=PATIENT) as client:
        if model.positions:
            group = client.describe_group("p", "g")
            kept = {p.partition: p.position for p in group.partitions}
            for partition, position in model.positions.items():
                now = kept.get(partition)
                assert now is not None and now >= position, f"{info}: group position lost"
        drained = _drain(client, model, info)
        ids = {m.id for m in _messages(client, "p")}
        lost = ids - model.acked - model.maybe_acked - drained
        assert not lost, f"{info}: messages the queue lost: {sorted(lost)[:3]}"
        for tx in model.txs:
            if not tx.acks:
                continue
            if tx.payloads["a"][0] in shown:  # committed: its acks counted
                assert not tx.acks & drained, f"{info}: {tx}'s acks did not count"
            else:
                back = tx.acks - drained - model.acked - model.maybe_acked
                assert not back, f"{info}: {tx} did not commit, but its acks counted"


def _drain(client: Client, model: Model, info: str) -> set[MessageId]:
    """Pop the queue empty (leases of killed workers run out first): nothing acked
    comes back. Returns what it popped."""
    drained: set[MessageId] = set()
    with client.queue("p", "q", ack_timeout=30.0) as handle:
        quiet_since = time.monotonic()
        deadline = quiet_since + ACK_TIMEOUT + 20
        while time.monotonic() - quiet_since < ACK_TIMEOUT + 1:
            assert time.monotonic() < deadline, info
            popped = handle.pop(500, wait=0.2)
            again = {m.id for m in popped} & model.acked
            assert not again, f"{info}: acked messages delivered again: {sorted(again)[:3]}"
            if popped:
                handle.ack(popped)
                drained.update(m.id for m in popped)
                quiet_since = time.monotonic()
        with contextlib.suppress(TidingsError):
            handle.close()
    return drained
